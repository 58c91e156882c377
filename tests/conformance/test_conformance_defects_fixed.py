"""The core defects issue 17 lists (items 3 and 4), and one the conformance campaign found (a single
padded query under Mask.lengths with query_lens), each tested at the size, dtype and mode where it
appeared. Items 2, 5 and 6 have theirs in test_conformance_long.py and test_conformance_nan.py.
"""
from __future__ import annotations

import pytest
import torch

import multihead as mh
from multihead import Mask
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
