"""sdpa_kernel_report against what torch's SDPA really runs: the kernels its dispatcher sees."""
from __future__ import annotations

import warnings

import pytest
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import multihead as mh
from multihead.backends import sdpa_kernel as report_module
from multihead.backends.sdpa_kernel import chosen_kernel, kernel_name, sdpa_kernel_report
from multihead.bench.kernels import kernels_called

CPU_FLASH_OP = "_scaled_dot_product_flash_attention_for_cpu"


def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0)).to(dtype)


def call(q, k=None, v=None, mask=None, causal=False, dropout=0.0, scale=None, gqa=False):
    k = q if k is None else k
    v = k if v is None else v
    return q, k, v, mask, causal, dropout, scale, gqa


def runs_cpu_flash(q, k, v, mask, causal, dropout, scale, gqa) -> bool:
    """Whether F.scaled_dot_product_attention calls torch's CPU flash kernel for these arguments."""
    names = kernels_called(lambda: F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=causal, scale=scale, enable_gqa=gqa))
    return CPU_FLASH_OP in names


q4 = randn(2, 4, 8, 16)
kv2 = randn(2, 2, 8, 16)
CASES = {
    "plain": call(q4),
    "causal": call(q4, causal=True),
    "bool key mask": call(q4, mask=torch.tensor([True] * 6 + [False] * 2).expand(2, 1, 1, 8)),
    "additive mask": call(q4, mask=randn(2, 1, 8, 8)),
    "custom scale": call(q4, scale=0.5),
    "gqa": call(q4, kv2, gqa=True),
    "bf16": call(randn(2, 4, 8, 16, dtype=torch.bfloat16)),
    "fp16": call(randn(2, 4, 8, 16, dtype=torch.float16)),
    "dropout": call(q4, dropout=0.25),
    "strided last dim": call(randn(2, 4, 16, 8).transpose(-1, -2)),
    "value head dim differs": call(q4, q4, randn(2, 4, 8, 8)),
    "3-d inputs": call(randn(4, 8, 16)),
    "heads differ without gqa": call(q4, randn(2, 1, 8, 16)),
}
# the words of torch's reason that must reach the report
REASON_WORDS = {"dropout": "dropout", "strided last dim": "stride", "value head dim differs": "last dimension",
                "3-d inputs": "4 dimensional", "heads differ without gqa": "num_heads"}


@pytest.mark.parametrize("name", CASES)
def test_the_kernel_named_is_the_kernel_sdpa_runs(name):
    args = CASES[name]
    text = sdpa_kernel_report(*args)
    assert text.split(" (")[0] in ("CPU flash", "math"), text
    assert text.startswith("CPU flash") == runs_cpu_flash(*args), text
    if text.startswith("math"):
        assert "; CPU flash not used: " in text and "torch gives no reason" not in text, text
    else:
        assert "not used" not in text, text


@pytest.mark.parametrize("name", REASON_WORDS)
def test_the_reason_is_torchs_own(name):
    text = sdpa_kernel_report(*CASES[name])
    assert REASON_WORDS[name] in text.split("not used: ", 1)[1], text
    assert "Triggered internally" not in text


def test_a_kernel_disabled_by_the_user_is_reported_and_the_flags_are_left_alone():
    before = (torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.math_sdp_enabled())
    with sdpa_kernel([SDPBackend.MATH]):
        text = sdpa_kernel_report(*CASES["causal"])
        assert not runs_cpu_flash(*CASES["causal"])
        assert not torch.backends.cuda.flash_sdp_enabled()
    assert text.startswith("math") and "disabled" in text
    assert (torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.math_sdp_enabled()) == before
    sdpa_kernel_report(*CASES["dropout"])  # asks torch with flash alone, then restores the flags
    assert (torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.math_sdp_enabled()) == before


def test_no_kernel_at_all_is_reported_with_torchs_reason():
    q, k, v, mask, causal, dropout, scale, gqa = CASES["dropout"]
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        text = sdpa_kernel_report(q, k, v, mask, causal, dropout, scale, gqa)
        with pytest.raises(RuntimeError), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            F.scaled_dot_product_attention(q, k, v, dropout_p=dropout)
    assert text.startswith("no kernel: torch says") and "dropout" in text


@pytest.mark.parametrize("bad", ({"q": [1.0]}, {"v": None}, {"attn_mask": "causal"}))
def test_bad_input_raises_attention_error(bad):
    args = dict(zip(("q", "k", "v", "attn_mask", "is_causal", "dropout", "scale", "enable_gqa"), CASES["plain"]))
    with pytest.raises(mh.AttentionError, match="must be a torch.Tensor"):
        sdpa_kernel_report(**{**args, **bad})


def test_on_cuda_each_fused_kernel_ranked_first_gives_its_reason(monkeypatch):
    """The CUDA branch, with torch's choice and checks replaced (no GPU here): efficient picked."""
    cuda = torch.backends.cuda

    def refuse(why):
        def check(params, debug=False):
            warnings.warn(f"{why} (Triggered internally at sdp_utils.cpp:1.)")
            return False
        return check

    monkeypatch.setattr(report_module, "_device_type", lambda q: "cuda")
    monkeypatch.setattr(torch, "_fused_sdp_choice", lambda *a, **kw: int(SDPBackend.EFFICIENT_ATTENTION))
    order = [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
             SDPBackend.MATH]
    monkeypatch.setattr(torch._C, "_get_sdp_priority_order", lambda: [int(b) for b in order])
    monkeypatch.setattr(cuda, "can_use_cudnn_attention", refuse("cuDNN needs sm90."))
    monkeypatch.setattr(cuda, "can_use_flash_attention", refuse("Flash needs head_dim <= 256."))
    text = sdpa_kernel_report(*CASES["plain"])
    assert text == ("efficient (memory-efficient attention); cuDNN not used: cuDNN needs sm90.; "
                    "flash not used: Flash needs head_dim <= 256.")
    monkeypatch.setattr(torch, "_fused_sdp_choice", lambda *a, **kw: int(SDPBackend.MATH))
    monkeypatch.setattr(cuda, "can_use_efficient_attention", refuse("No efficient."))
    monkeypatch.setattr(cuda, "can_use_cudnn_attention", lambda params, debug=False: True)
    text = sdpa_kernel_report(*CASES["plain"])
    assert text.startswith("math (") and "; flash not used: Flash needs" in text
    assert "; efficient not used: No efficient." in text
    assert "; cuDNN not used: it could run, but torch ranks the chosen kernel first" in text
    order.remove(SDPBackend.CUDNN_ATTENTION)
    order.append(SDPBackend.CUDNN_ATTENTION)  # ranked after math: never tried, so not reported
    assert "cuDNN" not in sdpa_kernel_report(*CASES["plain"])


def test_kernel_names_say_cpu_flash_apart_from_cuda_flash():
    assert kernel_name(SDPBackend.FLASH_ATTENTION, "cpu") == "CPU flash"
    assert kernel_name(SDPBackend.FLASH_ATTENTION, "cuda") == "flash"
    assert [kernel_name(b, "cuda") for b in (SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION,
                                             SDPBackend.MATH)] == ["efficient", "cuDNN", "math"]


@pytest.mark.parametrize("name", CASES)
def test_chosen_kernel_is_flash_exactly_when_sdpa_runs_cpu_flash(name):
    args = CASES[name]
    assert (chosen_kernel(*args) == SDPBackend.FLASH_ATTENTION) == runs_cpu_flash(*args)
