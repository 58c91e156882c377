"""return_lse=True on every backend that gives it, and mh.merge_states of a call split into key ranges.

Every backend returns the log-sum-exp or refuses return_lse=True with a reason code. A call split into 2 and into 7
ranges of keys (>= 2048 keys), each range attended on its own with return_lse=True and merged, equals the whole
call (out within the dtype's drift, lse within fp32 drift) and float64 reference math; sinks join one range only.
"""
from __future__ import annotations

import pytest
import torch

import multihead as mh
from multihead.backends.dispatch import backend_names
from multihead.caches.quantized import Quantized, quantize

N = 2100  # keys: where the fast paths engage
LENS = torch.tensor([N, 1333, 0])  # the last sequence keeps no key: lse -inf, out exactly 0


def _inputs(Lq: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(3, 4, Lq, 32, generator=g).to(dtype)
    k, v = (torch.randn(3, 2, N, 32, generator=g).to(dtype) for _ in range(2))
    return q, k, v, torch.linspace(-1.0, 2.0, 4)


def _cuts(n: int) -> list[tuple[int, int]]:
    edges = torch.linspace(0, N, n + 1).long().tolist()
    return list(zip(edges[:-1], edges[1:]))


def _part(q, k, v, a: int, b: int, sinks, backend: str):
    """Attention over keys a <= j < b of each sequence's LENS, with return_lse=True."""
    mask = mh.Mask.lengths((LENS - a).clamp(0, b - a))
    keys = k.slots(a, b) if isinstance(k, Quantized) else k[:, :, a:b]
    values = v.slots(a, b) if isinstance(v, Quantized) else v[:, :, a:b]
    return mh.attention(q, keys, values, mask, sinks=sinks, backend=backend, return_lse=True)


def _check_split(q, k, v, sinks, backend: str, reference, tol: float, lse_tol: float = 1e-4):
    whole, whole_lse = _part(q, k, v, 0, N, sinks, backend)
    ref, ref_lse = reference
    assert whole_lse.dtype == torch.float32 and whole_lse.shape == q.shape[:3]
    assert torch.equal(whole_lse[2], torch.full_like(whole_lse[2], float("-inf"))) if sinks is None else True
    assert not whole[2].any()  # a row that keeps no key: exact zeros
    scale = ref.abs().max().item()
    for n in (2, 7):
        parts = [_part(q, k, v, a, b, sinks if i == 0 else None, backend) for i, (a, b) in enumerate(_cuts(n))]
        out, lse = mh.merge_states(parts)
        assert (out.double() - whole.double()).abs().max().item() <= tol * scale, (backend, n)
        kept = torch.isfinite(ref_lse)
        assert torch.equal(torch.isfinite(lse), kept)
        assert (lse.double() - whole_lse.double())[kept].abs().max().item() <= 1e-4, (backend, n)
        assert (out.double() - ref).abs().max().item() <= tol * scale
        assert (lse.double() - ref_lse)[kept].abs().max().item() <= lse_tol  # the inputs' rounding in the scores


def _reference(q, k, v, sinks):
    return mh.attention(q.double(), k.double(), v.double(), mh.Mask.lengths(LENS), sinks=sinks.double(),
                        backend="math", return_lse=True)


TOL = {torch.float32: 2e-5, torch.bfloat16: 2e-2, torch.float16: 4e-3}  # out, relative to its largest value
LSE_TOL = {torch.float32: 1e-4, torch.bfloat16: 2e-2, torch.float16: 4e-3}  # lse against float64, absolute


@pytest.mark.parametrize("backend,Lq,dtypes", [
    ("math", 16, (torch.float32, torch.bfloat16, torch.float16)),
    ("sdpa", 16, (torch.float32, torch.bfloat16, torch.float16)),
    ("decode", 2, (torch.float32, torch.bfloat16)),
])
@pytest.mark.parametrize("with_sinks", [False, True], ids=["no-sinks", "sinks"])
def test_a_split_call_merges_to_the_whole_call(backend, Lq, dtypes, with_sinks):
    for dtype in dtypes:
        q, k, v, sinks = _inputs(Lq, dtype)
        sinks = sinks if with_sinks else None
        ref = _reference(q, k, v, torch.zeros(4) if sinks is None else sinks) if with_sinks else \
            mh.attention(q.double(), k.double(), v.double(), mh.Mask.lengths(LENS), backend="math", return_lse=True)
        with torch.inference_mode() if dtype is torch.float16 else torch.no_grad():
            _check_split(q, k, v, sinks, backend, ref, TOL[dtype], LSE_TOL[dtype])


@pytest.mark.parametrize("Lq", [2, 40], ids=["kernel-step", "blockwise"])
def test_a_split_quantized_call_merges_to_the_whole_call(Lq):
    """The quantized backend over int8 codes, against float64 over the numbers the codes stand for."""
    q, k, v, sinks = _inputs(Lq, torch.float32, seed=1)
    keys, values = Quantized(*quantize(k, torch.int8), torch.int8), Quantized(*quantize(v, torch.int8), torch.int8)
    ref = _reference(q, keys.numbers(torch.float64), values.numbers(torch.float64), sinks)
    with torch.no_grad():
        _check_split(q, keys, values, sinks, "quantized", ref, 2e-5)


def test_the_lse_under_grad_is_the_reference_maths_and_differentiable():
    """Where autograd records, "auto" gives the log-sum-exp through the math backend; its gradient flows."""
    q, k, v, _ = _inputs(8, torch.float32)
    q.requires_grad_()
    decision = mh.dispatch(q, k, v, mh.Mask.lengths(LENS), return_lse=True)
    assert decision.backend == "math" and decision.codes["sdpa"] == "sdpa.lse"
    out, lse = mh.attention(q, k, v, mh.Mask.lengths(LENS), return_lse=True)
    (out.sum() + lse[torch.isfinite(lse)].sum()).backward()
    assert q.grad is not None and torch.isfinite(q.grad).all()


def test_backends_without_the_lse_refuse_it_with_a_code():
    q, k, v, _ = _inputs(8, torch.float32)
    window = mh.Mask.window(64)
    for name in backend_names():
        if name in ("math", "sdpa", "decode", "quantized", "paged"):  # they give it (quantized, paged: their forms)
            continue
        with pytest.raises(mh.AttentionError) as refused:
            mh.attention(q, k, v, window, backend=name, return_lse=True)
        assert refused.value.code in (f"{name}.lse", f"{name}.no-lists", f"{name}.no-slicer"), refused.value.code
    decision = mh.dispatch(q, k, v, window, return_lse=True)
    assert decision.codes["banded"] == "banded.lse" and decision.codes["flex"] == "flex.lse"


def test_the_lse_compiles_with_dynamic_shapes():
    """torch.compile(dynamic=True): the same (out, lse) as eager at two key lengths."""
    q, k, v, _ = _inputs(4, torch.float32)
    run = torch.compile(lambda q, k, v: mh.attention(q, k, v, causal=True, return_lse=True), dynamic=True)
    for n in (N, N - 300):
        out, lse = run(q, k[:, :, :n], v[:, :, :n])
        ref, ref_lse = mh.attention(q, k[:, :, :n], v[:, :, :n], causal=True, return_lse=True)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lse, ref_lse, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kv_dtype", [None, torch.int8], ids=["float", "int8"])
def test_the_paged_step_returns_the_lse_of_its_pages(kv_dtype):
    """A paged cache's view (pages of 16, ragged lengths, a sequence with no key) read in place: (out, lse) equal
    to the reference math over the same slots gathered, sinks included (a row with no key: its sink alone)."""
    g = torch.Generator().manual_seed(5)
    cache = mh.KVCache(3, N + 16, 2, 32, page_size=16, kv_dtype=kv_dtype)
    k, v = (torch.randn(3, 2, N, 32, generator=g) for _ in range(2))
    with torch.no_grad():
        cache.append(k, v, LENS)
        keys, values, mask = cache.append(*(torch.randn(3, 2, 1, 32, generator=g) for _ in range(2)))
        q, sinks = torch.randn(3, 4, 1, 32, generator=g), torch.linspace(-1.0, 2.0, 4)
        assert mh.dispatch(q, keys, values, mask, sinks=sinks, return_lse=True).backend == "paged"
        out, lse = mh.attention(q, keys, values, mask, sinks=sinks, return_lse=True)
    held = [cache.read(part) for part in cache.parts]
    held = [t.numbers() if isinstance(t, Quantized) else t for t in held]
    ref, ref_lse = mh.attention(q.double(), *(t.double() for t in held), mask, sinks=sinks.double(), backend="math",
                                return_lse=True)
    assert (out.double() - ref).abs().max().item() <= 2e-5 * ref.abs().max().item()
    assert (lse.double() - ref_lse).abs().max().item() <= 1e-4
