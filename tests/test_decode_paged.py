"""The paged decode step (cpu/paged.py, decode_paged.h): every build of the kernel and the plain-torch form against
float64 at >= 2048 keys, pages of 16 and 64 in shuffled order with holes, ragged lengths, GQA, fp32 / bf16 pages
and int8 / fp8 codes with scales, sinks, softcap, a window, the log-sum-exp and a cascade merge; no gather."""
from __future__ import annotations

import functools

import pytest
import torch

from multihead.backends.cpu import build as decode_build
from multihead.backends.cpu.paged import decode_paged, plain_paged, rows_kept
from multihead.caches.quantized import quantize
from multihead.errors import AttentionError

LENGTHS = [2500, 2048, 0, 1337]  # ragged, one empty sequence; the longest spans 40 pages of 64, 157 of 16
H, HKV, D, DV = 8, 2, 64, 96
KINDS = [torch.float32, torch.bfloat16, torch.int8, torch.float8_e4m3fn]
KIND_IDS = ["fp32", "bf16", "int8", "fp8"]


@functools.cache
def paged_case(page_size: int, kind: torch.dtype, Lq: int = 1):
    """(q, key_pages, value_pages, table, lengths, key_scales, value_scales, dense k, dense v): each sequence's
    tokens on pages of a shared pool in shuffled order, unused table slots -1, and a page past every length
    poisoned with NaN (never read). dense k, v (B, Hkv, N, .) float64: the numbers the pages stand for."""
    g = torch.Generator().manual_seed(page_size + len(KIND_IDS[KINDS.index(kind)]))
    B, N = len(LENGTHS), max(LENGTHS)
    per_seq = -(-N // page_size) + 1  # one spare slot per row: -1 past the length
    k = 2 * torch.randn(B, HKV, N, D, generator=g)
    v = 2 * torch.randn(B, HKV, N, DV, generator=g)
    needed = [-(-n // page_size) for n in LENGTHS]
    P = sum(needed) + 3  # three spare pages in the pool
    order = torch.randperm(P, generator=g)
    table = torch.full((B, per_seq), -1, dtype=torch.int32)
    kp = torch.full((P, HKV, page_size, D), float("nan"))
    vp = torch.full((P, HKV, page_size, DV), float("nan"))
    used = 0
    for b, n in enumerate(LENGTHS):
        for i in range(needed[b]):
            page = int(order[used])
            used += 1
            table[b, i] = page
            t0, t1 = i * page_size, min(n, (i + 1) * page_size)
            kp[page, :, : t1 - t0] = k[b, :, t0:t1]
            vp[page, :, : t1 - t0] = v[b, :, t0:t1]
    ks = vs = None
    if kind in (torch.int8, torch.float8_e4m3fn):
        (kp, ks), (vp, vs) = quantize(kp, kind), quantize(vp, kind)
        kp, vp = (t.view(torch.float8_e4m3fn) if kind is torch.float8_e4m3fn else t for t in (kp, vp))
        wide_k = kp.double() * ks.double()[..., None]
        wide_v = vp.double() * vs.double()[..., None]
    else:
        kp, vp = kp.to(kind), vp.to(kind)
        wide_k, wide_v = kp.double(), vp.double()
    dense_k = torch.zeros(B, HKV, per_seq * page_size, D, dtype=torch.float64)
    dense_v = torch.zeros(B, HKV, per_seq * page_size, DV, dtype=torch.float64)
    for b in range(B):
        for i, page in enumerate(table[b].tolist()):
            if page >= 0:
                dense_k[b, :, i * page_size:(i + 1) * page_size] = wide_k[page]
                dense_v[b, :, i * page_size:(i + 1) * page_size] = wide_v[page]
        dense_k[b, :, LENGTHS[b]:], dense_v[b, :, LENGTHS[b]:] = 0.0, 0.0  # the NaN past the length: never read
    q = torch.randn(B, H, Lq, D, generator=g)
    return q, kp, vp, table, torch.tensor(LENGTHS), ks, vs, dense_k, dense_v


def reference(q, dense_k, dense_v, table, lo, hi, page_size, scale, sinks=None, softcap=None):
    """(out, lse) in float64 over the dense keys: row (b, i) keeps lo <= j < hi where its page is present."""
    B, H_, Lq, _ = q.shape
    G, N = H_ // dense_k.shape[1], dense_k.shape[2]
    k, v = dense_k.repeat_interleave(G, 1), dense_v.repeat_interleave(G, 1)
    s = q.double() @ k.transpose(-1, -2) * scale  # (B, H, Lq, N)
    if softcap:
        s = softcap * torch.tanh(s / softcap)
    j = torch.arange(N)
    present = (table.long() >= 0).repeat_interleave(page_size, 1)[:, None, None, :N]
    keep = (j >= lo[:, None, :, None]) & (j < hi[:, None, :, None]) & present
    s = s.masked_fill(~keep, float("-inf"))
    if sinks is not None:
        s = torch.cat([s, sinks.double().view(1, H_, 1, 1).expand(B, H_, Lq, 1)], -1)
        v = torch.cat([v, torch.zeros(B, H_, 1, v.shape[-1], dtype=v.dtype)], 2)
    lse = torch.logsumexp(s, -1)
    any_key = keep.any(-1)
    w = torch.where(any_key[..., None], torch.exp(s - lse[..., None]), 0.0).nan_to_num(0.0)
    return w @ v, torch.where(any_key, lse, float("-inf"))


def _builds():
    return [name for name in decode_build.BUILDS if decode_build.runs_here(name)]


@pytest.fixture(scope="module", params=list(decode_build.BUILDS))
def kernel(request):
    if not decode_build.runs_here(request.param):
        pytest.skip(f"this CPU cannot run the {request.param} build")
    module, why = decode_build.variant(request.param)
    assert module is not None, why
    return module


def _check(out, lse, ref, ref_lse, kind, q_dtype, lengths):
    """out within a tolerance from the measured drift of the dtype; empty rows exactly 0 with lse -inf."""
    tol = 2e-5 if q_dtype is torch.float32 else 1e-2  # fp32 sums; a bf16 output's rounding (2^-8)
    assert out.shape == ref.shape
    assert (out.double() - ref).abs().max().item() <= tol * ref.abs().max().item()
    empty = lengths == 0
    assert torch.equal(out[empty], torch.zeros_like(out[empty]))
    assert torch.isneginf(lse[empty]).all()
    finite = ~empty
    assert (lse[finite].double() - ref_lse[finite]).abs().max().item() <= 1e-4


@pytest.mark.parametrize("page_size", [16, 64])
@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_each_build_reads_pages_like_float64(kernel, page_size, kind):
    """Every build, every page dtype, pages of 16 and 64: out and lse against float64, with sinks and softcap
    (GQA: 4 query heads per kv head), then two new rows with a window."""
    q, kp, vp, table, lengths, ks, vs, dk, dv = paged_case(page_size, kind)
    sinks = torch.linspace(-1.0, 2.0, H)
    for Lq, window, extra in ((1, None, {"sinks": sinks, "softcap": 20.0}), (2, 700, {})):
        if Lq == 2:
            q = torch.cat([q, q.flip(1)], 2)
        lo, hi = rows_kept(lengths, Lq, window)
        ref, ref_lse = reference(q, dk, dv, table, lo, hi, page_size, D ** -0.5, **extra)
        empty = torch.empty(0)
        s = extra.get("sinks", empty)
        out, lse = kernel.decode_paged(q.contiguous(), kp, vp, table, lo, hi, (hi - 1).float(), empty, s,
                                       D ** -0.5, extra.get("softcap", 0.0), ks, vs, True)
        _check(out, lse, ref, ref_lse, kind, torch.float32, lengths)


@pytest.mark.parametrize("kind", KINDS, ids=KIND_IDS)
def test_decode_paged_and_its_plain_form_match_float64_with_a_bf16_query(kind):
    """The public function (native build) and the plain-torch form, bf16 query, pages of 16."""
    q, kp, vp, table, lengths, ks, vs, dk, dv = paged_case(16, kind)
    qb = q.bfloat16()
    lo, hi = rows_kept(lengths, 1, None)
    ref, ref_lse = reference(qb, dk, dv, table, lo, hi, 16, D ** -0.5)
    for out, lse in (decode_paged(qb, kp, vp, table, lengths, scale=D ** -0.5, key_scales=ks, value_scales=vs,
                                  return_lse=True),
                     plain_paged(qb, kp, vp, table, lo, hi, D ** -0.5, key_scales=ks, value_scales=vs)):
        assert out.dtype is torch.bfloat16 and lse.dtype is torch.float32
        _check(out, lse, ref, ref_lse, kind, torch.bfloat16, lengths)


def test_a_missing_page_counts_as_masked_and_a_cascade_merges_exactly():
    """A -1 page inside the lengths is skipped; a prefix of pages and the suffix, merged by their lse, give
    the whole step (cascade decoding)."""
    q, kp, vp, table, lengths, _, _, dk, dv = paged_case(64, torch.float32)
    cut = 10  # pages 0..9 the prefix, the rest the suffix
    prefix, suffix = table.clone(), table.clone()
    prefix[:, cut:] = -1
    suffix[:, :cut] = -1
    whole, whole_lse = decode_paged(q, kp, vp, table, lengths, scale=0.125, return_lse=True)
    parts = [decode_paged(q, kp, vp, t, lengths, scale=0.125, return_lse=True) for t in (prefix, suffix)]
    lse = torch.logaddexp(parts[0][1], parts[1][1])
    weights = [torch.where(torch.isneginf(p_lse), 0.0, torch.exp(p_lse - lse))[..., None] for _, p_lse in parts]
    merged = torch.where(torch.isneginf(lse)[..., None], 0.0, weights[0] * parts[0][0] + weights[1] * parts[1][0])
    assert (merged - whole).abs().max().item() <= 1e-5 * whole.abs().max().item()
    finite = ~torch.isneginf(whole_lse)
    assert torch.equal(finite, ~torch.isneginf(lse))
    assert (lse[finite] - whole_lse[finite]).abs().max().item() <= 1e-5
    lo, hi = rows_kept(lengths, 1, None)
    ref, _ = reference(q, dk, dv, suffix, lo, hi, 64, 0.125)
    assert (parts[1][0].double() - ref).abs().max().item() <= 2e-5 * ref.abs().max().item()


def test_the_kernel_gathers_nothing():
    """The eager step runs no torch indexing op: the pages are read where they lie."""
    q, kp, vp, table, lengths, _, _, _, _ = paged_case(16, torch.bfloat16)
    decode_paged(q, kp, vp, table, lengths, scale=0.125)  # built and warm
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        decode_paged(q, kp, vp, table, lengths, scale=0.125)
    names = {e.name for e in prof.events()}
    assert not names & {"aten::index", "aten::index_select", "aten::gather", "aten::take", "aten::cat"}, names


def test_decode_paged_under_torch_compile_matches_eager():
    """The custom op multihead::decode_paged in a compiled graph (dynamic shapes)."""
    q, kp, vp, table, lengths, ks, vs, _, _ = paged_case(16, torch.int8)
    eager = decode_paged(q, kp, vp, table, lengths, scale=0.125, key_scales=ks, value_scales=vs, return_lse=True)
    step = torch.compile(lambda *a: decode_paged(*a, scale=0.125, key_scales=ks, value_scales=vs, return_lse=True),
                         dynamic=True, fullgraph=True)
    compiled = step(q, kp, vp, table, lengths)
    assert torch.equal(compiled[0], eager[0]) and torch.equal(compiled[1], eager[1])


@pytest.mark.parametrize("bad, says", [
    ({"block_table": torch.zeros(4, 3, dtype=torch.float32)}, "block_table"),
    ({"lengths": torch.tensor([99999, 1, 1, 1])}, "lengths must lie"),
    ({"key_scales": torch.ones(1)}, "scales"),
    ({"q": torch.randn(4, 5, 1, D)}, "does not fit"),
])
def test_bad_inputs_say_what_was_expected(bad, says):
    q, kp, vp, table, lengths, _, _, _, _ = paged_case(64, torch.float32)
    args = {"q": q, "key_pages": kp, "value_pages": vp, "block_table": table, "lengths": lengths, **bad}
    scales = {"key_scales": args.pop("key_scales")} if "key_scales" in args else {}
    with pytest.raises(AttentionError, match=says):
        decode_paged(**args, scale=0.125, **scales)
