"""The drop-in inside torch's own nn.Transformer: the argument checks torch's test_nn.py runs on nn.Transformer
(test_transformer_args_check) raise the same exception types with the drop-in as with torch's module.

That test tells AssertionError and RuntimeError apart: it expects RuntimeError from a call with a wrong mask or
input size, and AssertionError (which the RuntimeError check must not catch) from a wrong head count or a
key_padding_mask of the wrong size. Each case below builds the model with torch's MultiheadAttention, then with
the drop-in standing in for it, and compares the type raised.
"""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.nn.modules import transformer as torch_transformer

import multihead as mh
from multihead.compat import MultiheadAttention

D_MODEL, NHEAD, FF, BSZ, SRC, TGT = 16, 4, 24, 3, 7, 5


def build(attention_class, nhead=NHEAD) -> nn.Transformer:
    """nn.Transformer (2 encoder, 2 decoder layers, dropout 0.3, training mode) whose attention is `attention_class`."""
    saved = torch_transformer.MultiheadAttention
    torch_transformer.MultiheadAttention = attention_class
    try:
        return nn.Transformer(D_MODEL, nhead, 2, 2, FF, 0.3)
    finally:
        torch_transformer.MultiheadAttention = saved


def call(model: nn.Transformer, src_batch=BSZ, tgt_batch=BSZ, src_width=D_MODEL, tgt_width=D_MODEL, **masks):
    """The model on seq-first inputs (SRC, src_batch, src_width) and (TGT, tgt_batch, tgt_width)."""
    g = torch.Generator().manual_seed(0)
    return model(torch.randn(SRC, src_batch, src_width, generator=g), torch.randn(TGT, tgt_batch, tgt_width, generator=g),
                 **masks)


def padding(B, L):
    return torch.rand(B, L, generator=torch.Generator().manual_seed(1)) > 0.5


CALLS = {  # name: keyword arguments of `call`, a wrong size in each
    "src batch": {"src_batch": 7},
    "tgt batch": {"tgt_batch": 7},
    "src width": {"src_width": 13},
    "tgt width": {"tgt_width": 13},
    "src_mask size": {"src_mask": nn.Transformer.generate_square_subsequent_mask(SRC + 1)},
    "tgt_mask size": {"tgt_mask": nn.Transformer.generate_square_subsequent_mask(TGT + 1)},
    "memory_mask size": {"memory_mask": torch.rand(TGT + 1, SRC + 1)},
    "src_key_padding_mask size": {"src_key_padding_mask": padding(7, SRC + 1)},
    "tgt_key_padding_mask size": {"tgt_key_padding_mask": padding(7, TGT + 1)},
    "memory_key_padding_mask size": {"memory_key_padding_mask": padding(7, SRC + 1)},
}


def raised(fn) -> type | None:
    try:
        fn()
    except Exception as e:  # noqa: BLE001 (the type is what is compared)
        return type(e)
    return None


@pytest.mark.parametrize("case", list(CALLS))
def test_each_bad_call_raises_the_type_torch_raises(case):
    theirs = raised(lambda: call(build(nn.MultiheadAttention), **CALLS[case]))
    ours = raised(lambda: call(build(MultiheadAttention), **CALLS[case]))
    assert theirs is not None, f"torch accepts {case}"
    assert ours is not None and issubclass(ours, theirs), f"{case}: torch raises {theirs.__name__}, the drop-in {ours}"
    assert ours is theirs or issubclass(ours, mh.AttentionError)  # ours says what was expected and what came
    other = RuntimeError if theirs is AssertionError else AssertionError
    assert not issubclass(ours, other) or issubclass(theirs, other), f"{case}: also a {other.__name__}"


def test_a_head_count_that_does_not_divide_the_width_is_an_assertion_error_as_in_torch():
    with pytest.raises(AssertionError):
        build(nn.MultiheadAttention, nhead=5)
    with pytest.raises(AssertionError) as caught:
        build(MultiheadAttention, nhead=5)
    assert isinstance(caught.value, mh.AttentionError)


def test_the_checks_pass_through_torchs_pattern_of_nested_assertions():
    """torch's test wraps the call in assertRaises(RuntimeError), and that in assertRaises(AssertionError) for
    the padding masks: the AssertionError must get past the inner RuntimeError check."""
    model = build(MultiheadAttention)
    for name in ("src_key_padding_mask size", "tgt_key_padding_mask size", "memory_key_padding_mask size"):
        with pytest.raises(AssertionError):
            try:
                call(model, **CALLS[name])
            except RuntimeError:  # the inner check would swallow it here
                pytest.fail(f"{name}: a RuntimeError, where torch's regular path raises AssertionError only")
    for name in ("src_mask size", "tgt_mask size", "memory_mask size"):
        with pytest.raises(RuntimeError):
            call(model, **CALLS[name])
