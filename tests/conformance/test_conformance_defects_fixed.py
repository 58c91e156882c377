"""The core defects issue 17 lists (items 3 and 4), and one the conformance campaign found (a single
padded query under Mask.lengths with query_lens), each tested at the size, dtype and mode where it
appeared. Items 2, 5 and 6 have theirs in test_conformance_long.py and test_conformance_nan.py.
"""
from __future__ import annotations

import pytest
import torch

import multihead as mh
from multihead import Mask
from tests.conformance.cases import Case
from tests.conformance.check import Expected, run_backend
from tests.conformance.reference import PartSpec, reference_attention

B, H, L, D = 2, 2, 8, 8
LOW = [torch.bfloat16, torch.float16]


def qkv(dtype):
    g = torch.Generator().manual_seed(0)
    return tuple(torch.randn(B, H, L, D, generator=g).to(dtype) for _ in range(3))


def additive_offsets(dtype):
    t = torch.randn(B, 1, L, L, generator=torch.Generator().manual_seed(1))
    return t.masked_fill(torch.arange(L) > torch.arange(L)[:, None], float("-inf")).to(dtype)


@pytest.mark.parametrize("dtype", LOW, ids=["bf16", "fp16"])
@pytest.mark.parametrize(("backend", "with_padding"), [("math", False), ("sdpa", True), ("auto", True)])
def test_additive_masks_in_low_precision_run(backend, with_padding, dtype):
    q, k, v = qkv(dtype)
    offsets = additive_offsets(dtype)
    pad = torch.zeros(B, L, dtype=torch.bool)
    pad[0, 6:] = True
    mask = Mask.additive(offsets) & Mask.key_padding(pad) if with_padding else Mask.additive(offsets)
    specs = [PartSpec("additive", {"t": offsets})] + ([PartSpec("key_padding", {"pad": pad})] if with_padding else [])
    out = mh.attention(q, k, v, mask, backend=backend)
    exact = reference_attention(q.double(), k.double(), v.double(), specs)
    drift = (reference_attention(q, k, v, specs, dtype=dtype).double() - exact).abs().max()
    assert (out.double() - exact).abs().max() <= 2 * drift + torch.finfo(dtype).eps


def test_an_fp16_additive_mask_with_fp32_inputs_is_an_attention_error_or_exact():
    q, k, v = qkv(torch.float32)
    offsets = additive_offsets(torch.float16)
    try:
        out = mh.attention(q, k, v, Mask.additive(offsets), backend="math")
    except mh.AttentionError:
        return
    exact = reference_attention(q.double(), k.double(), v.double(), [PartSpec("additive", {"t": offsets})])
    assert (out.double() - exact).abs().max() < 1e-5


@pytest.mark.parametrize("backend", ["auto", "sdpa"])
def test_a_lengths_mask_built_in_inference_mode_runs(backend):
    q, k, v = qkv(torch.float32)
    with torch.inference_mode():
        mask = Mask.lengths(torch.tensor([5, 8]))
        out = mh.attention(q, k, v, mask, backend=backend)
    specs = [PartSpec("lengths", {"valid": torch.tensor([5, 8])})]
    exact = reference_attention(q.double(), k.double(), v.double(), specs)
    assert (out.double() - exact).abs().max() < 1e-5


@pytest.mark.parametrize("backend", ["auto", "sdpa", "banded"])
def test_one_padded_query_with_lengths_is_exact_zero(backend):
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(3, 2, 1, 8, generator=g) for _ in range(3))
    valid, query = torch.tensor([1, 1, 0]), torch.tensor([0, 1, 0])  # row 0: one valid key, its query is padding
    out = mh.attention(q, k, v, Mask.lengths(valid, query), backend=backend)
    assert (out[0] == 0).all()


def test_a_one_query_slice_under_per_query_lengths_keeps_its_dead_row_zero():
    """varlen cuts a packed segment holding one query; the (B, Lq) lengths leave that query no key. The
    slice's keep has a query dim of 1, yet it is not key padding: the row must still be exact zero."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 1, 4, 8, generator=g) for _ in range(3))
    ids = torch.tensor([[0, 0, 0, 1]])  # the last query is alone in its segment
    valid = torch.tensor([[1, 4, 4, 2]])  # and may see keys j < 2 only (none of its segment); others see key 3
    specs = [PartSpec("lengths", {"valid": valid}), PartSpec("segments", {"ids": ids, "key_ids": ids})]
    mask = Mask.lengths(valid) & Mask.segments(ids)
    out = mh.attention(q, k, v, mask, backend="varlen")
    exact = reference_attention(q.double(), k.double(), v.double(), specs)
    assert (out[0, 0, 3] == 0).all() and (out.double() - exact).abs().max() < 1e-5


def test_blocks_that_see_no_key_leave_the_output_connected_to_k_and_v():
    """Every banded block of these queries is empty (bottom-right chunks after a top-left causal view):
    backward() must still reach k and v, with zero gradient."""
    q, k, v = (torch.randn(1, 2, 3, 4, requires_grad=True) for _ in range(3))
    k, v = (torch.randn(1, 1, 10, 4, requires_grad=True) for _ in range(2))
    mask = Mask.causal() & Mask.chunks(4, "bottom_right")  # queries 0..2 at chunk 2 by the cache's count
    out = mh.attention(q, k, v, mask, backend="banded")
    dq, dk, dv = torch.autograd.grad(out.sum(), (q, k, v))
    assert (out == 0).all() and not dq.any() and not dk.any() and not dv.any()


@pytest.mark.parametrize("backend", ["auto", "sdpa"])
def test_several_fp16_biases_are_summed_in_float32_and_cast_once(backend):
    """Three ALiBi parts in fp16 (a sum of large offsets): the fused path used to sum them in fp16 and
    drifted past twice the reference math's error; the bias is now summed in float32, its row maximum
    moved to 0, and cast once."""
    slopes = torch.tensor([0.45, 0.3])
    specs = [PartSpec("alibi", {"slopes": slopes, "align": "bottom_right"}),
             PartSpec("alibi", {"slopes": slopes, "align": "bottom_right"}),
             PartSpec("alibi", {"slopes": slopes, "align": "top_left"})]
    case = Case(B=1, H=2, Hkv=1, Lq=20, Lk=15, D=16, dtype=torch.float16, specs=specs, seed=1824465449)
    outcome = run_backend(case, backend, "no_grad", Expected(case, "no_grad"))
    assert outcome.status == "ok", outcome.message
