"""The decode backend: the C++ kernel and its plain-torch form against the float64 reference."""
from __future__ import annotations

import pytest
import torch

import multihead as mh
from multihead.errors import CannotRunError
from multihead.attention import make_problem
from multihead.backends.cpu import build as decode_build
from multihead.backends.decode.backend import MASK, DecodeBackend
from multihead.backends.decode.ranges import key_ranges
from multihead.backends.decode.step import decode_step

H, D, N = 8, 32, 200
LENS = torch.tensor([0, 37, 200])  # ragged, one empty sequence
SLOPES = torch.tensor([0.5, 0.25, 0.125, 0.0625, 0.03, 0.02, 0.01, 0.005])
SINKS = torch.linspace(-1.0, 2.0, H)
MASKS = {
    "none": lambda Lq: None,
    "lengths": lambda Lq: mh.Mask.lengths(LENS),
    "cache (lengths & causal)": lambda Lq: mh.Mask.lengths(LENS) & mh.Mask.causal("bottom_right"),
    "window": lambda Lq: mh.Mask.lengths(LENS) & mh.Mask.causal("bottom_right") & mh.Mask.window(16, "bottom_right"),
    "alibi": lambda Lq: mh.Mask.causal("bottom_right") & mh.Mask.alibi(SLOPES, "bottom_right"),
    "query padding": lambda Lq: mh.Mask.lengths(LENS, torch.tensor([Lq, 1, Lq])),
}
VARIANTS = {"plain": {}, "softcap": {"softcap": 4.0}, "sinks": {"sinks": SINKS}}


def _qkv(dtype, Hkv, Lq, seed=0, D=D):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(3, H, Lq, D, generator=g)
    k, v = (2 * torch.randn(3, Hkv, N, D, generator=g) for _ in range(2))
    return q.to(dtype), k.to(dtype), v.to(dtype)


def _max_err(out, ref):
    return (out.double() - ref).abs().max().item()


@pytest.mark.parametrize("use_kernel", [True, False], ids=["kernel", "plain-torch"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("Hkv", [2, 1], ids=["gqa", "mqa"])
@pytest.mark.parametrize("head_dim", [32, 128], ids=["D32", "D128"])  # D128: the all-rows AVX-512 path
def test_decode_step_matches_float64_reference(use_kernel, dtype, Hkv, head_dim):
    for Lq in (1, 3):
        q, k, v = _qkv(dtype, Hkv, Lq, seed=Lq, D=head_dim)
        for mask_name, make in MASKS.items():
            for variant, extra in VARIANTS.items():
                if variant != "plain" and mask_name not in ("window", "alibi"):
                    continue  # the score variants on the two masks with the most parts
                mask = make(Lq)
                wide = {name: t.double() if isinstance(t, torch.Tensor) else t for name, t in extra.items()}
                ref = mh.attention(q.double(), k.double(), v.double(), mask, backend="math", **wide)
                same = mh.attention(q, k, v, mask, backend="math", **extra)  # the same-dtype reference drift
                B, _, _, Lk = 3, H, Lq, N
                lo, hi, qpos, slopes = key_ranges(mask, B, H, Lq, Lk, "cpu")
                out = decode_step(q, k, v, lo, hi, qpos, head_dim**-0.5, extra.get("softcap"), slopes,
                                  extra.get("sinks"), use_kernel=use_kernel)
                tol = 2 * _max_err(same, ref) + 1e-5  # fp32 floor: sums of 128 products in another order
                assert _max_err(out, ref) <= tol, (Lq, mask_name, variant)
                assert out.dtype == dtype and out.shape == (3, H, Lq, head_dim)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("rows, D, Dv", [(1, 128, 128), (2, 128, 128), (3, 128, 128), (5, 64, 64), (7, 96, 64),
                                         (16, 576, 512)], ids=["R1", "R2", "R3", "R5", "R7-Dv64", "R16-mla"])
def test_every_row_grouping_and_head_dim_matches_float64_reference(dtype, rows, D, Dv):
    """The AVX-512 score tiles take rows in groups of 4, 2 and 1 and keys 16 at a time (the rest row by
    row); values Dv % 64 at a time. One kv head with `rows` query heads, ragged lengths, a window."""
    g = torch.Generator().manual_seed(rows)
    q = torch.randn(3, rows, 1, D, generator=g).to(dtype)
    k = (2 * torch.randn(3, 1, N, D, generator=g)).to(dtype)
    v = (2 * torch.randn(3, 1, N, Dv, generator=g)).to(dtype)
    mask = mh.Mask.lengths(torch.tensor([N, 37, 170])) & mh.Mask.window(100, "bottom_right")
    ref = mh.attention(q.double(), k.double(), v.double(), mask, backend="math")
    same = mh.attention(q, k, v, mask, backend="math")
    lo, hi, qpos, _ = key_ranges(mask, 3, rows, 1, N, "cpu")
    out = decode_step(q, k, v, lo, hi, qpos, D**-0.5)
    assert out.dtype == dtype and out.shape == (3, rows, 1, Dv)
    assert _max_err(out, ref) <= 2 * _max_err(same, ref) + 1e-5


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_rows_with_no_key_are_exact_zeros_and_keys_past_lengths_are_never_read(dtype):
    q, k, v = _qkv(dtype, 2, 1, D=128)
    k[:, :, 50:] = float("nan")
    v[:, :, 50:] = float("nan")
    mask = mh.Mask.lengths(torch.tensor([0, 10, 50]))
    for backend_kernel in (True, False):
        lo, hi, qpos, _ = key_ranges(mask, 3, H, 1, N, "cpu")
        out = decode_step(q, k, v, lo, hi, qpos, 128**-0.5, use_kernel=backend_kernel)
        assert torch.equal(out[0], torch.zeros_like(out[0]))
        assert torch.isfinite(out).all()
        ref = mh.attention(q, k, v, mask, backend="math")
        tol = 1e-5 if dtype == torch.float32 else 2e-2
        torch.testing.assert_close(out, ref, atol=tol, rtol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("where", ["query", "key", "value"])
def test_nan_in_a_query_or_visible_key_propagates(where, dtype):
    q, k, v = _qkv(dtype, 2, 1, D=128)
    {"query": q, "key": k, "value": v}[where][1, 0, 3 if where != "query" else 0] = float("nan")
    mask = mh.Mask.lengths(torch.tensor([N, N, N]))
    for use_kernel in (True, False):
        lo, hi, qpos, _ = key_ranges(mask, 3, H, 1, N, "cpu")
        out = decode_step(q, k, v, lo, hi, qpos, 128**-0.5, use_kernel=use_kernel)
        assert out[1, 0].isnan().all() and torch.isfinite(out[0]).all()


def test_auto_runs_the_decode_backend_for_decode_steps_only():
    q, k, v = _qkv(torch.float32, 2, 1)
    mask = mh.Mask.lengths(LENS) & mh.Mask.causal("bottom_right")
    assert mh.dispatch(q, k, v, mask).backend == "decode"
    prefill = mh.dispatch(*_qkv(torch.float32, 2, 5), mask)
    assert prefill.backend != "decode" and prefill.codes["decode"] == "decode.rows"
    refusals = {"decode.dtype": lambda: mh.attention(*(t.half() for t in (q, k, v)), mask, backend="decode"),
                "decode.grad": lambda: mh.attention(q.clone().requires_grad_(), k, v, mask, backend="decode"),
                "decode.mask": lambda: mh.attention(q, k, v, mh.Mask.keep(torch.ones(N, dtype=torch.bool)),
                                                    backend="decode")}
    for code, call in refusals.items():
        with pytest.raises(CannotRunError) as refused:
            call()
        assert refused.value.code == code


def test_without_the_kernel_dispatch_says_why_and_runs_plain_torch(monkeypatch):
    monkeypatch.setitem(decode_build._state, "module", None)
    monkeypatch.setitem(decode_build._state, "why", "no C++ compiler on this machine to build the decode kernel")
    q, k, v = _qkv(torch.float32, 2, 1)
    mask = mh.Mask.lengths(LENS) & mh.Mask.causal("bottom_right")
    decision = mh.dispatch(q, k, v, mask)
    assert decision.backend == "decode" and "plain torch" in decision.detail and "no C++ compiler" in decision.detail
    torch.testing.assert_close(mh.attention(q, k, v, mask), mh.attention(q, k, v, mask, backend="math"),
                               atol=1e-5, rtol=1e-5)


def test_a_switched_off_kernel_reports_it(monkeypatch):
    monkeypatch.setenv(decode_build.DISABLE, "0")
    monkeypatch.setattr(decode_build, "_state", {})
    assert decode_build.kernel() is None and "switched off" in decode_build.unavailable()


def test_the_kernel_builds_here():
    """The machines the project supports have a compiler: the kernel must build, not silently fall back."""
    assert decode_build.unavailable() is None, decode_build.unavailable()
    assert decode_build.build_dir().exists()


def test_module_decode_with_a_cache_runs_the_kernel_and_matches_the_reference():
    torch.manual_seed(0)
    attn = mh.MultiHeadAttention(64, 8, num_kv_heads=2, bias=False, rope=mh.RoPE(8)).eval()
    x = torch.randn(2, 80, 64)
    outs = {}
    for backend in ("auto", "math"):
        attn.backend = backend
        cache = attn.new_cache(2, 96)
        with torch.no_grad():
            attn(x, cache=cache)
            outs[backend] = torch.cat([attn(x[:, i:i + 1], cache=cache) for i in range(3)], dim=1)
    torch.testing.assert_close(outs["auto"], outs["math"], atol=1e-5, rtol=1e-5)


@pytest.mark.slow
def test_the_kernel_runs_under_torch_compile():
    q, k, v = _qkv(torch.float32, 2, 1)
    lens = torch.tensor([5, 100, 200])

    def step(q, k, v, lens):
        return mh.attention(q, k, v, mh.Mask.lengths(lens) & mh.Mask.causal("bottom_right"), backend="decode")

    compiled = torch.compile(step, fullgraph=True, dynamic=True)
    torch.testing.assert_close(compiled(q, k, v, lens), step(q, k, v, lens), atol=1e-6, rtol=1e-6)


def test_build_now_says_where_the_kernel_is_or_why_there_is_none():
    said = decode_build.build_now()
    assert said.startswith("decode kernel: ") and (decode_build.unavailable() or "built in") in said


PART_KINDS = {
    "lengths": lambda B, Lq, Lk, g: mh.Mask.lengths(torch.randint(0, Lk + 1, (B,), generator=g)),
    "lengths per query": lambda B, Lq, Lk, g: mh.Mask.lengths(torch.randint(0, Lk + 1, (B, Lq), generator=g)),
    "query padding": lambda B, Lq, Lk, g: mh.Mask.lengths(torch.full((B,), Lk), torch.randint(0, Lq + 1, (B,),
                                                                                              generator=g)),
    "causal": lambda B, Lq, Lk, g: mh.Mask.causal(),
    "causal bottom-right": lambda B, Lq, Lk, g: mh.Mask.causal("bottom_right"),
    "window": lambda B, Lq, Lk, g: mh.Mask.window(int(torch.randint(1, 40, (), generator=g)), "bottom_right"),
    "chunks": lambda B, Lq, Lk, g: mh.Mask.chunks(int(torch.randint(1, 40, (), generator=g)), "bottom_right"),
    "chunks top-left": lambda B, Lq, Lk, g: mh.Mask.chunks(int(torch.randint(1, 40, (), generator=g))),
}


@pytest.mark.parametrize("seed", range(40))
def test_every_interval_part_gives_the_same_keys_as_its_dense_keep(seed):
    """The row intervals (the decode kernel's form of the normal form) keep exactly the keys the dense keep keeps,
    alone and combined."""
    g = torch.Generator().manual_seed(seed)
    B, Lq, Lk = 3, int(torch.randint(1, 5, (), generator=g)), int(torch.randint(1, 90, (), generator=g))
    names = list(PART_KINDS)
    chosen = [names[int(i)] for i in torch.randint(0, len(names), (int(torch.randint(1, 4, (), generator=g)),),
                                                    generator=g)]
    mask = None
    for name in chosen:
        part = PART_KINDS[name](B, Lq, Lk, g)
        mask = part if mask is None else mask & part
    q, k = torch.zeros(B, 1, Lq, 1), torch.zeros(B, 1, Lk, 1)
    problem = make_problem(q, k, k, mask, False, None, 0.0)
    if problem.form.unaligned:  # terms of two alignments: the decode step refuses, the dense backends run it
        assert DecodeBackend().plan(problem, False) is MASK, chosen
        return
    lo, hi, _, _ = DecodeBackend().plan(problem, False).rows(problem)
    j = torch.arange(Lk)
    intervals = (j >= lo[..., None]) & (j < hi[..., None])  # (B, Lq, Lk)
    keep, _ = mask.materialize(B, 1, Lq, Lk)
    dense = torch.ones(B, Lq, Lk, dtype=torch.bool) if keep is None else keep.expand(B, 1, Lq, Lk)[:, 0]
    assert torch.equal(intervals, dense), chosen


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_a_chunked_cache_step_runs_on_the_decode_backend_past_2048_keys(dtype):
    """Llama 4's chunked layers: a decode step over a cache of 2100 keys with chunks of 1024 keeps only the
    query's own chunk, on the decode backend, within twice the same-dtype reference's drift."""
    g = torch.Generator().manual_seed(3)
    Lk = 2100
    q = torch.randn(2, H, 1, D, generator=g).to(dtype)
    k, v = (torch.randn(2, 2, Lk, D, generator=g).to(dtype) for _ in range(2))
    mask = mh.Mask.lengths(torch.tensor([2100, 1500])) & mh.Mask.causal("bottom_right") \
        & mh.Mask.chunks(1024, "bottom_right")
    assert mh.dispatch(q, k, v, mask).backend == "decode"
    k[0, :, :2048] = float("nan")  # before the first row's chunk (2048..2099): never read
    out = mh.attention(q, k, v, mask)
    ref = mh.attention(q.double(), k.double(), v.double(), mask, backend="math")
    same = mh.attention(q, k, v, mask, backend="math")
    assert torch.isfinite(out).all()
    assert _max_err(out, ref) <= 2 * _max_err(same, ref) + 1e-6
