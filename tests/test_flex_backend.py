"""The FlexAttention backend: every mask kind, softcap and sinks equal the reference math backend.

On CPU torch's flex_attention has no backward, so the CPU tests compare values (and check that the
backend refuses calls that need grad); the GPU tests at the end (skipped without CUDA) compare
gradients too, eager and compiled.
"""
from __future__ import annotations

import pytest
import torch

import multihead as mh
from multihead.attention import make_problem
from multihead.backends.reasons import Reason
from multihead.backends.flex import FlexBackend
from multihead.masks import Index
from tests.helpers import reference_attention

B, H, Hkv, L, D = 2, 4, 2, 7, 8
SLOPES = torch.tensor([0.5, 0.25, 0.125, 0.0625])
IDS = torch.tensor([[0, 0, 0, 1, 1, 2, 2], [0, 1, 1, 1, 1, 1, 1]])
SINKS = torch.tensor([0.5, -1.0, 2.0, 0.0])


def _qkv(Lq=L, Lk=L, seed=0, device="cpu", dtype=torch.float32, d=D):
    g = torch.Generator().manual_seed(seed)
    shapes = ((B, H, Lq, d), (B, Hkv, Lk, d), (B, Hkv, Lk, d))
    return [torch.randn(*s, generator=g).to(device, dtype) for s in shapes]


def _masks(device="cpu"):
    """{kind: (mask, Lq, Lk)}: every kind of part, self- and cross-attention."""
    g = torch.Generator().manual_seed(1)
    offsets = torch.randn(B, 1, L, L, generator=g)
    offsets[0, 0, 2, :] = float("-inf")  # a query that keeps no key
    offsets[1, 0, :, 3] = float("-inf")  # a key no query keeps
    at = {"device": device}
    return {
        "keep": (mh.Mask.keep((torch.rand(B, H, L, L, generator=g) > 0.3).to(**at)), L, L),
        "block": (mh.Mask.block((torch.rand(L, L, generator=g) > 0.5).to(**at)), L, L),
        "additive with -inf": (mh.Mask.additive(offsets.to(**at)), L, L),
        "lengths": (mh.Mask.lengths(torch.tensor([5, 0], **at)), L, L),
        "lengths and query_lens": (mh.Mask.lengths(torch.tensor([5, 7], **at), torch.tensor([3, 7], **at)), L, L),
        "lengths per query": (mh.Mask.lengths(torch.randint(0, L + 1, (B, L), generator=g).to(**at)), L, L),
        "key_padding": (mh.Mask.key_padding((torch.rand(B, L, generator=g) > 0.6).to(**at)), L, L),
        "causal top_left": (mh.Mask.causal(), 5, 9),
        "causal bottom_right": (mh.Mask.causal("bottom_right") & mh.Mask.lengths(torch.tensor([9, 4], **at),
                                                                                  torch.tensor([2, 5], **at)), 5, 9),
        "window": (mh.Mask.window(3) & mh.Mask.causal(), L, L),
        "window bottom_right": (mh.Mask.window(3, "bottom_right") & mh.Mask.causal("bottom_right"), 5, 9),
        "alibi": (mh.Mask.alibi(SLOPES.to(**at)) & mh.Mask.causal(), L, L),
        "alibi bottom_right": (mh.Mask.alibi(SLOPES.to(**at), "bottom_right") & mh.Mask.lengths(
            torch.tensor([9, 4], **at), torch.tensor([5, 2], **at)), 5, 9),
        "segments": (mh.Mask.segments(IDS.to(**at)) & mh.Mask.causal(), L, L),
        "chunks": (mh.Mask.chunks(3) & mh.Mask.causal(), L, L),
        "chunks bottom_right": (mh.Mask.chunks(3, "bottom_right") & mh.Mask.causal("bottom_right"), 5, 9),
        "no mask": (None, L, L),
    }


KINDS = sorted(_masks())


@pytest.mark.parametrize("kind", KINDS)
def test_flex_equals_the_math_backend_for_every_mask_kind(kind):
    mask, Lq, Lk = _masks()[kind]
    q, k, v = _qkv(Lq, Lk)
    with torch.no_grad():
        out = mh.attention(q, k, v, mask, backend="flex")
        torch.testing.assert_close(out, mh.attention(q, k, v, mask, backend="math"), atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("softcap, sinks", [(5.0, None), (None, SINKS), (2.0, SINKS)], ids=["softcap", "sinks", "both"])
def test_softcap_and_sinks_equal_the_math_backend(softcap, sinks):
    mask = mh.Mask.alibi(SLOPES) & mh.Mask.causal() & mh.Mask.lengths(torch.tensor([7, 0]))  # row 1 sees no key
    q, k, v = _qkv()
    with torch.no_grad():
        out = mh.attention(q, k, v, mask, softcap=softcap, sinks=sinks, backend="flex")
        ref = mh.attention(q, k, v, mask, softcap=softcap, sinks=sinks, backend="math")
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-5)
    assert not out[1].any()


def test_rows_with_no_visible_key_are_exact_zeros_and_hidden_keys_are_inert():
    q, k, v = _qkv()
    k[0, :, 5:], v[0, :, 5:] = float("nan"), float("inf")  # stored past row 0's length
    mask = mh.Mask.lengths(torch.tensor([5, 0]), torch.tensor([3, 7]))
    with torch.no_grad():
        out = mh.attention(q, k, v, mask, backend="flex")
    assert torch.isfinite(out).all()
    assert not out[0, :, 3:].any() and not out[1].any()  # padded queries, and a row with no key
    keep, _ = mask.materialize(B, H, L, L)
    ref = reference_attention(q.double(), k[:, :, :5].double(), v[:, :, :5].double(), keep=keep[..., :5])
    torch.testing.assert_close(out.double(), ref, atol=1e-6, rtol=1e-5)


def test_flex_compiles_with_fullgraph():
    mask, Lq, Lk = _masks()["alibi bottom_right"]
    q, k, v = _qkv(Lq, Lk)
    compiled = torch.compile(lambda q, k, v, m: mh.attention(q, k, v, m, softcap=4.0, backend="flex"),
                             backend="eager", fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(compiled(q, k, v, mask), mh.attention(q, k, v, mask, softcap=4.0, backend="math"),
                                   atol=1e-6, rtol=1e-5)


# --- dispatch: why flex is refused or passed over --------------------------------------------------

def test_flex_refuses_what_torch_cannot_do_with_a_reason():
    q, k, v = _qkv()
    with pytest.raises(mh.AttentionError, match="no dropout"):
        mh.attention(q, k, v, dropout=0.1, backend="flex")
    with pytest.raises(mh.AttentionError, match="non-empty sequences"):
        mh.attention(q, k[:, :, :0], v[:, :, :0], backend="flex")
    with pytest.raises(mh.AttentionError, match="no backward on cpu"):
        mh.attention(q.requires_grad_(), k, v, backend="flex")
    slopes = SLOPES.clone().requires_grad_()  # a mask tensor that needs grad counts too
    with pytest.raises(mh.AttentionError, match="no backward on cpu"):
        mh.attention(q.detach(), k, v, mh.Mask.alibi(slopes), backend="flex")


def test_auto_never_picks_flex_in_eager_mode_and_says_why():
    q, k, v = _qkv()
    decision = mh.dispatch(q, k, v, mh.Mask.causal(), softcap=5.0)  # SDPA refuses softcap
    assert decision.backend == "math"
    assert decision.codes["flex"] == "flex.eager"
    grad = mh.dispatch(q.requires_grad_(), k, v, softcap=5.0)
    assert grad.backend == "math" and grad.codes["flex"] == "flex.grad"


def _compiled_graph_code(device, mask=None, L=L, softcap=None, grad=False) -> str:
    """The code of the graphs torch.compile records for an "auto" causal call on `device` (dynamic shapes)."""
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm.code)
        return gm

    q, k, v = (t.requires_grad_(grad) for t in _qkv(L, L, device=device, d=16))
    with torch.set_grad_enabled(grad):
        torch.compile(lambda q, k, v: mh.attention(q, k, v, mask, causal=True, softcap=softcap), backend=record,
                      fullgraph=True, dynamic=True)(q, k, v)
    return "\n".join(graphs)


def test_under_compile_on_cpu_auto_leaves_flex_alone(monkeypatch):
    """torch 2.13's compiled CPU flex kernel fails to build for some masks with dynamic shapes (the
    module docstring lists them), so "auto" keeps to SDPA there, whatever the mask."""
    pad = torch.zeros(B, 600, dtype=torch.bool)
    for mask in (mh.Mask.window(64), mh.Mask.key_padding(pad) & mh.Mask.window(64)):
        assert "flex_attention" not in _compiled_graph_code("cpu", mask, L=600)
    assert "flex_attention" not in _compiled_graph_code("cpu", softcap=5.0)
    problem = make_problem(*_qkv(), None, True, None, 0.0, 5.0)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)  # the reason, as torch.compile sees it
    assert FlexBackend().plan(problem, auto=True).code == "flex.not-cuda"


BUILDS_ON_CPU = {"window": lambda: mh.Mask.window(100), "chunks": lambda: mh.Mask.chunks(128)}


@pytest.mark.parametrize("mask_name", list(BUILDS_ON_CPU))
def test_compiled_flex_on_cpu_keeps_the_nan_contract(mask_name):
    """backend="flex" under torch.compile on the CPU (600 and 700 keys through one dynamic graph) equals eager;
    a NaN query row and the rows that see a NaN key come out NaN, every other row is right."""
    compiled = torch.compile(lambda q, k, v, m: mh.attention(q, k, v, m, causal=True, backend="flex"),
                             dynamic=True)
    for L_ in (600, 700):
        q, k, v = _qkv(L_, L_, seed=L_, d=16)
        with torch.no_grad():
            mask = BUILDS_ON_CPU[mask_name]()
            torch.testing.assert_close(compiled(q, k, v, mask), mh.attention(q, k, v, mask, causal=True),
                                       rtol=1e-5, atol=1e-5)
            clean = mh.attention(q, k, v, mask, causal=True, backend="math")
            q[0, 1, 5] = float("nan")
            k[1, 0, 300, 2] = float("nan")  # kv head 0: query heads 0 and 1
            out = compiled(q, k, v, mask)
        sees = torch.zeros(L_, dtype=torch.bool)  # the causal rows whose window (100) or chunk (128) holds key 300
        sees[300:384 if mask_name == "chunks" else 400] = True  # key 300's chunk: [256, 384)
        nan_rows = torch.zeros(B, H, L_, dtype=torch.bool)
        nan_rows[0, 1, 5] = True
        nan_rows[1, :2] |= sees
        assert torch.equal(out.isnan().any(-1), nan_rows) and torch.equal(out.isnan().all(-1), nan_rows)
        torch.testing.assert_close(out[~nan_rows], clean[~nan_rows], rtol=1e-5, atol=1e-5)


def test_compiled_flex_on_cpu_refuses_float64_with_its_reason():
    q, k, v = (t.double() for t in _qkv(16, 16))
    compiled = torch.compile(lambda q, k, v: mh.attention(q, k, v, mh.Mask.window(4), backend="flex"))
    with torch.no_grad(), pytest.raises(mh.AttentionError, match="float32, float16 and bfloat16"):
        compiled(q, k, v)


def test_describe_names_the_mods_and_the_skipped_blocks():
    q, k, v = _qkv(256, 256)
    detail = mh.dispatch(q, k, v, mh.Mask.alibi(SLOPES) & mh.Mask.causal(), softcap=3.0, backend="flex").detail
    assert "mask_mod = causal(top_left)" in detail
    assert "score_mod = softcap + alibi(4,) bias" in detail
    assert "(B=1, H=1, Lq=256, Lk=256), 25% of blocks skipped" in detail  # causal: 1 of 2 x 2 blocks skipped
    per_row = mh.dispatch(q, k, v, mh.Mask.lengths(torch.tensor([256, 100])), backend="flex").detail
    assert "(B=2, H=1, Lq=256, Lk=256)" in per_row


# --- Index.point: one entry of the grid --------------------------------------------------------------

@pytest.mark.parametrize("kind", ["keep", "additive with -inf", "lengths and query_lens", "causal bottom_right",
                                  "alibi bottom_right", "segments"])
def test_a_point_index_reads_the_same_entry_as_the_whole_grid(kind):
    mask, Lq, Lk = _masks()[kind]
    keep, bias = mask.materialize(B, H, Lq, Lk)
    keep = keep.expand(B, H, Lq, Lk) if keep is not None else None
    bias = bias.expand(B, H, Lq, Lk) if bias is not None else None
    for b, h, i, j in [(0, 0, 0, 0), (1, 3, Lq - 1, Lk - 1), (0, 2, 1, Lk - 2), (1, 1, Lq - 2, 0)]:
        form = mask.normal_form()
        ix = Index.point(*(torch.tensor(n) for n in (b, h, i, j)), Lq, Lk, form.extents)
        keep_at, bias_at = form.dense(ix)
        if keep is not None:
            assert bool(keep_at) == bool(keep[b, h, i, j])
        if bias is not None:
            assert float(bias_at) == float(bias[b, h, i, j])


def test_gathered_reads_compile_without_reading_indices_as_numbers():
    lens = torch.tensor([5, 3])
    mask = mh.Mask.lengths(lens) & mh.Mask.causal("bottom_right")

    def keep_of_every_row(mask, b):
        zero = torch.zeros((1, 1, 1, 1), dtype=torch.long)
        form = mask.normal_form()
        return form.dense(Index.point(b, zero, zero + 6, zero + 4, L, L, form.extents))[0]

    rows = torch.arange(B).view(-1, 1, 1, 1)
    compiled = torch.compile(keep_of_every_row, backend="eager", fullgraph=True)
    assert compiled(mask, rows).view(-1).tolist() == [True, False]  # the last query sees keys <= 4 of 5, and <= 2 of 3


# --- on a CUDA device (skipped without one) --------------------------------------------------------

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _values_and_grads(attend, q, k, v, sinks=None):
    """attend(q, k, v, sinks) and the gradients of a fixed random projection of it, for fresh leaves."""
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    sinks = None if sinks is None else sinks.detach().clone().requires_grad_()
    out = attend(*leaves, sinks)
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(2)).to(out)
    grads = torch.autograd.grad(out, leaves + ([sinks] if sinks is not None else []), upstream)
    return out, grads


def _attend(backend, mask, **kw):
    return lambda q, k, v, sinks: mh.attention(q, k, v, mask, sinks=sinks, backend=backend, **kw)


@cuda
@pytest.mark.parametrize("kind", KINDS)
def test_flex_equals_math_values_and_grads_on_the_gpu(kind):
    mask, Lq, Lk = _masks("cuda")[kind]
    q, k, v = _qkv(Lq, Lk, device="cuda", d=16)
    for softcap, sinks in ((None, None), (3.0, SINKS.cuda())):
        out, grads = _values_and_grads(_attend("flex", mask, softcap=softcap), q, k, v, sinks)
        ref, ref_grads = _values_and_grads(_attend("math", mask, softcap=softcap), q, k, v, sinks)
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        for g, r in zip(grads, ref_grads):
            torch.testing.assert_close(g, r, atol=1e-4, rtol=1e-4)


@cuda
@pytest.mark.parametrize("kind", ["causal bottom_right", "alibi", "segments"])
def test_compiled_flex_equals_math_values_and_grads_on_the_gpu(kind):
    mask, Lq, Lk = _masks("cuda")[kind]
    q, k, v = _qkv(Lq, Lk, device="cuda", d=16)
    compiled = torch.compile(_attend("flex", mask, softcap=3.0), fullgraph=True)
    out, grads = _values_and_grads(compiled, q, k, v, SINKS.cuda())
    ref, ref_grads = _values_and_grads(_attend("math", mask, softcap=3.0), q, k, v, SINKS.cuda())
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
    for g, r in zip(grads, ref_grads):
        torch.testing.assert_close(g, r, atol=1e-4, rtol=1e-4)


@cuda
def test_rows_with_no_key_are_zero_with_zero_grad_on_the_gpu():
    q, k, v = _qkv(device="cuda", d=16)
    mask = mh.Mask.lengths(torch.tensor([0, 4], device="cuda"), torch.tensor([7, 2], device="cuda"))
    out, (gq, gk, gv, gs) = _values_and_grads(_attend("flex", mask), q, k, v, SINKS.cuda())
    assert not out[0].any() and not out[1, :, 2:].any()
    assert not gq[0].any() and not gk[0].any() and not gv[0].any() and not gq[1, :, 2:].any()
    assert torch.isfinite(gs).all()


@cuda
def test_under_compile_on_cuda_auto_picks_flex_only_where_sdpa_cannot_run(monkeypatch):
    assert "flex_attention" in _compiled_graph_code("cuda")  # softcap: SDPA refuses, flex beats the math
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    q, k, v = _qkv(device="cuda", d=16)
    softcapped = make_problem(q, k, v, None, True, None, 0.0, 5.0)
    assert not isinstance(FlexBackend().plan(softcapped, auto=True), Reason)  # SDPA cannot run softcap
    plain = make_problem(q, k, v, None, True, None, 0.0)
    assert FlexBackend().plan(plain, auto=True).code == "flex.sdpa-faster"
    small = make_problem(*_qkv(device="cuda", d=8), None, True, None, 0.0)
    assert FlexBackend().plan(small, auto=False).code == "flex.head-dims"


@cuda
@pytest.mark.filterwarnings("ignore:Synchronization debug mode is a prototype")
def test_compiled_flex_never_syncs_with_the_host():
    mask, Lq, Lk = _masks("cuda")["causal bottom_right"]
    q, k, v = _qkv(Lq, Lk, device="cuda", dtype=torch.bfloat16, d=64)
    compiled = torch.compile(lambda q, k, v, m: mh.attention(q, k, v, m, softcap=3.0, backend="flex"), fullgraph=True)
    compiled(q, k, v, mask)
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        compiled(q, k, v, mask)
    finally:
        torch.cuda.set_sync_debug_mode("default")
