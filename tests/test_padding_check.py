"""MultiHeadAttention warns once when a Mask.key_padding blocks every key of a sequence (a Hugging Face
attention_mask, 1 = real token, passed as padding), and stays silent where reading the mask would cost a
host sync (torch.compile, non-CPU tensors)."""
from __future__ import annotations

import warnings

import pytest
import torch

import multihead as mh
from multihead.layers.padding_check import LOOKS, AllKeysPaddedWarning, message

HF_MASK = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0]])   # 1 = real token; sequence 0 has no padding


def _module_and_input():
    torch.manual_seed(0)
    return mh.MultiHeadAttention(8, 2), torch.randn(2, 5, 8)


def test_a_token_mask_passed_as_padding_warns_once_at_the_callers_line():
    attn, x = _module_and_input()
    with pytest.warns(AllKeysPaddedWarning, match=r"sequence 0 .*Mask.key_padding\(attention_mask == 0\)") as caught:
        out = attn(x, mask=mh.Mask.key_padding(HF_MASK))
    assert caught[0].filename == __file__
    assert torch.allclose(out[0], attn.out_proj.bias.expand(5, 8))   # what the warning says happened
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        attn(x, mask=mh.Mask.key_padding(HF_MASK))                   # once per module
    with pytest.warns(AllKeysPaddedWarning):
        mh.MultiHeadAttention(8, 2)(x, mask=mh.Mask.key_padding(HF_MASK))   # a new module warns again


@pytest.mark.parametrize("padding", [HF_MASK == 0, torch.zeros(2, 5, dtype=torch.bool), HF_MASK[[1, 1]] == 1])
def test_a_right_padding_mask_stays_silent(padding):
    """The corrected mask, no padding at all, and padding that leaves every sequence a key."""
    attn, x = _module_and_input()
    mask = mh.Mask.key_padding(padding) & mh.Mask.causal()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        attn(x, mask=mask)
        attn(x, mask=mask)   # the same mask again: remembered as fine


def test_a_module_stops_looking_after_its_first_padding_masks():
    """The check costs a reduction per call; a module pays it for its first LOOKS padding masks only."""
    attn, x = _module_and_input()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for _ in range(LOOKS):
            attn(x, mask=mh.Mask.key_padding(HF_MASK == 0))
        attn(x, mask=mh.Mask.key_padding(HF_MASK))   # no longer looked at


def test_other_masks_and_no_mask_stay_silent():
    attn, x = _module_and_input()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        attn(x)
        attn(x, mask=mh.Mask.keep(torch.zeros(2, 1, 5, 5, dtype=torch.bool)))  # all blocked, but not as padding


def test_no_check_under_compile():
    attn, x = _module_and_input()
    compiled = torch.compile(lambda x, m: attn(x, mask=m), fullgraph=True, dynamic=True, backend="eager")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        compiled(x, mh.Mask.key_padding(HF_MASK))
    with pytest.warns(AllKeysPaddedWarning):   # eager, the same module still warns: compile set nothing
        attn(x, mask=mh.Mask.key_padding(HF_MASK))


def test_no_check_on_tensors_whose_values_are_not_free_to_read():
    attn = mh.MultiHeadAttention(8, 2, device="meta")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        attn(torch.randn(2, 5, 8, device="meta"), mask=mh.Mask.key_padding(HF_MASK.to("meta")))


def test_the_message_names_the_sequences():
    assert "every sequence" in message([0, 1], 2)
    assert "sequences 0, 2 " in message([0, 2], 3) and "sequence 1 " in message([1], 3)
