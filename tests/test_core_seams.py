"""The core at the seams where it broke: long lengths under torch.compile, bf16/fp16, inference mode,
NaN, per-query lengths, and the small holes (banded's empty blocks, the KV cache).

Each test runs at the length, dtype and mode where the defect appeared, against float64 references
with the 2x drift rule of tests/helpers.py.
"""
from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounter

import multihead as mh
from helpers import DTYPES, drift_tolerance, max_abs_diff, reference_attention

BACKENDS = ("auto", "sdpa", "math", "flex", "varlen", "banded")


def qkv(B, H, L, D, dtype=torch.float32, seed=0, Lk=None):
    g = torch.Generator().manual_seed(seed)
    Lk = L if Lk is None else Lk
    return (torch.randn(B, H, L, D, generator=g).to(dtype), torch.randn(B, H, Lk, D, generator=g).to(dtype),
            torch.randn(B, H, Lk, D, generator=g).to(dtype))


def runnable(q, k, v, mask, backend):
    """Whether `backend` can run this call (a name it cannot run raises AttentionError)."""
    try:
        mh.dispatch(q, k, v, mask, backend=backend)
    except mh.AttentionError:
        return False
    return True


# ---------------------------------------------------------------- long lengths under torch.compile
@pytest.mark.slow
def test_compiled_module_equals_eager_across_lengths_on_both_sides_of_2048_with_default_settings():
    torch.manual_seed(0)
    attn = mh.MultiHeadAttention(16, 2).eval()
    compiled = torch.compile(lambda x: attn(x, causal=True))
    with torch.no_grad():
        for L in (100, 200, 2100, 3000):  # the second length >= 2048 used to crash (a formatted SymFloat)
            x = torch.randn(1, L, 16)
            torch.testing.assert_close(compiled(x), attn(x, causal=True), atol=1e-5, rtol=1e-5)


def test_float_scale_and_softcap_arguments_compile_with_dynamic_shapes_and_fullgraph():
    """dynamic=True makes float arguments symbolic: their checks must not call math.isfinite on them."""
    q, k, v = qkv(1, 2, 8, 16, seed=0)
    for name in ("scale", "softcap"):
        torch._dynamo.reset()
        compiled = torch.compile(lambda q, k, v, x, name=name: mh.attention(q, k, v, **{name: x}), dynamic=True,
                                 fullgraph=True)
        for x in (0.3, 0.5, 0.7):
            torch.testing.assert_close(compiled(q, k, v, x), mh.attention(q, k, v, **{name: x}))


@pytest.mark.slow
def test_a_window_mask_compiles_one_graph_for_three_lengths_past_2048_with_dynamic_shapes():
    window = mh.Mask.window(64)
    counter = CompileCounter()
    compiled = torch.compile(lambda q, k, v: mh.attention(q, k, v, window, causal=True), backend=counter,
                             dynamic=True)
    for L in (2048, 2500, 3001):
        q, k, v = qkv(1, 1, L, 8, seed=L)
        torch.testing.assert_close(compiled(q, k, v), mh.attention(q, k, v, window, causal=True))
    assert counter.frame_count == 1


# ---------------------------------------------------------------- precision
def alibi_reference(q, k, v, slopes, compute_dtype):
    L = q.shape[2]
    i, j = torch.arange(L).view(-1, 1), torch.arange(L).view(1, -1)
    bias = -slopes.to(compute_dtype).view(1, -1, 1, 1) * (i - j).to(compute_dtype)
    return reference_attention(q, k, v, keep=j <= i, bias=bias, compute_dtype=compute_dtype)


@pytest.mark.slow
def test_alibi_in_bf16_at_2048_keys_drifts_at_most_twice_the_reference_math_in_bf16():
    H = 4
    q, k, v = qkv(1, H, 2048, 16, torch.bfloat16)
    slopes = mh.alibi_slopes(H)
    exact = alibi_reference(q, k, v, slopes, torch.float64)
    math_bf16 = mh.attention(q, k, v, mh.Mask.alibi(slopes), causal=True, backend="math")
    for backend in ("auto", "sdpa"):  # they were off by up to 3 here (a shifted bias rounded in bf16)
        ours = mh.attention(q, k, v, mh.Mask.alibi(slopes), causal=True, backend=backend)
        assert max_abs_diff(ours, exact) <= 2 * max_abs_diff(math_bf16, exact) + 1e-3


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("backend", ["auto", "sdpa", "math", "varlen"])
@pytest.mark.parametrize("with_", ["alone", "lengths", "key padding"])
def test_additive_masks_in_every_dtype_match_float64_on_each_backend(dtype, backend, with_):
    q, k, v = qkv(2, 2, 6, 8, dtype, seed=1)
    offsets = torch.randn(2, 1, 6, 6, generator=torch.Generator().manual_seed(2)).to(dtype)
    offsets[..., 0] = float("-inf")
    offsets[0, 0, 1, 2] = -1e9 if dtype != torch.float16 else -6e4  # huge but finite, as HF builds them
    lens = torch.tensor([4, 6])
    extra = {"alone": None, "lengths": mh.Mask.lengths(lens),
             "key padding": mh.Mask.key_padding(torch.arange(6) >= lens[:, None])}[with_]
    mask = mh.Mask.additive(offsets) if extra is None else mh.Mask.additive(offsets) & extra
    keep = ~torch.isneginf(offsets) & (torch.arange(6) < lens.view(2, 1, 1, 1) if extra is not None else True)
    bias = offsets.double().masked_fill(torch.isneginf(offsets), 0.0)
    if not runnable(q, k, v, mask, backend):
        pytest.skip(f"{backend} does not take this mask")

    def ref(q, k, v, compute_dtype):
        return reference_attention(q, k, v, keep=keep, bias=bias, compute_dtype=compute_dtype)

    (exact, _), (tol, _) = drift_tolerance(ref, (q, k, v), dtype)
    ours = mh.attention(q, k, v, mask, backend=backend)
    assert ours.dtype == dtype
    assert max_abs_diff(ours, exact) <= tol


def test_a_half_precision_additive_mask_with_float32_inputs_is_promoted():
    q, k, v = qkv(1, 2, 5, 8)
    offsets = torch.randn(5, 5).half()
    offsets[:, 1] = float("-inf")
    ours = mh.attention(q, k, v, mh.Mask.additive(offsets))
    exact = reference_attention(q, k, v, keep=~torch.isneginf(offsets),
                                bias=offsets.double().masked_fill(torch.isneginf(offsets), 0.0))
    assert ours.dtype == torch.float32
    assert max_abs_diff(ours, exact) < 1e-5


# ---------------------------------------------------------------- inference mode
@pytest.mark.parametrize("backend", BACKENDS)
def test_every_backend_runs_under_inference_mode_with_masks_built_inside_it(backend):
    q, k, v = qkv(2, 2, 6, 8)
    with torch.inference_mode():
        mask = mh.Mask.lengths(torch.tensor([3, 6]))
        out = mh.attention(q, k, v, mask, causal=True, backend=backend)
        again = mh.attention(q, k, v, mask, causal=True, backend=backend)  # the remembered plan's second look
    keep = (torch.arange(6) < torch.tensor([3, 6]).view(2, 1, 1, 1)) & torch.ones(6, 6, dtype=torch.bool).tril()
    exact = reference_attention(q, k, v, keep=keep)
    assert max_abs_diff(out, exact) < 1e-5
    assert torch.equal(out, again)


# ---------------------------------------------------------------- NaN
CASES = {
    "no mask": lambda lens: None,
    "causal": lambda lens: mh.Mask.causal(),
    "key padding": lambda lens: mh.Mask.key_padding(torch.arange(6) >= lens[:, None]),
    "lengths": lambda lens: mh.Mask.lengths(lens),
    "window": lambda lens: mh.Mask.window(3) & mh.Mask.causal(),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_nan_query_row_comes_back_nan_and_only_that_row(case, backend):
    q, k, v = qkv(2, 2, 6, 8)
    q[0, 1, 4, 3] = float("nan")
    mask = CASES[case](torch.tensor([3, 6]))
    if not runnable(q, k, v, mask, backend):
        pytest.skip(f"{backend} does not take this mask")
    out = mh.attention(q, k, v, mask, backend=backend)
    assert out[0, 1, 4].isnan().all()
    out[0, 1, 4] = 0.0
    assert not out.isnan().any()


@pytest.mark.parametrize("backend", BACKENDS)
def test_nan_in_a_visible_key_propagates_and_in_a_hidden_key_stays_inert(backend):
    q, k, v = qkv(2, 2, 6, 8)
    lens = torch.tensor([3, 6])
    mask = mh.Mask.lengths(lens)
    if not runnable(q, k, v, mask, backend):
        pytest.skip(f"{backend} does not take this mask")
    k[0, :, 4] = float("nan")  # past row 0's length: no query sees it
    v[0, :, 5] = float("inf")
    assert not mh.attention(q, k, v, mask, backend=backend).isnan().any()
    k[1, 0, 2] = float("nan")  # visible to every query of row 1, head 0
    out = mh.attention(q, k, v, mask, backend=backend)
    assert out[1, 0].isnan().all() and not out[0].isnan().any() and not out[1, 1].isnan().any()


@pytest.mark.parametrize("backend", BACKENDS)
def test_per_query_lengths_keep_nan_stored_past_every_length_out(backend):
    q, k, v = qkv(2, 2, 5, 8)
    lens = torch.tensor([[1, 2, 3, 4, 4], [2, 2, 2, 2, 2]])  # (B, Lq): keys 4.. of row 0, 2.. of row 1 unseen
    k[:, :, 4], v[:, :, 4] = float("nan"), float("nan")
    v[1, :, 2:] = float("nan")
    mask = mh.Mask.lengths(lens)
    if not runnable(q, k, v, mask, backend):
        pytest.skip(f"{backend} does not take this mask")
    k_, v_ = k.nan_to_num(0.0), v.nan_to_num(0.0)
    exact = reference_attention(q, k_, v_, keep=torch.arange(5) < lens[:, None, :, None])
    out = mh.attention(q, k, v, mask, backend=backend)
    assert max_abs_diff(out, exact) < 1e-5


def test_a_banded_block_that_sees_no_key_is_exact_zero_even_for_nan_queries():
    q, k, v = qkv(1, 1, 600, 8, Lk=100)  # bottom-right: queries 0..499 line up before the first key
    q[0, 0, :64] = float("nan")  # the first block of 64 queries sees no key at all
    q.requires_grad_()
    mask = mh.Mask.window(64, "bottom_right") & mh.Mask.causal("bottom_right")
    out = mh.attention(q, k, v, mask, backend="banded")
    assert torch.equal(out[0, 0, :500], torch.zeros(500, 8))
    out.sum().backward()
    assert torch.equal(q.grad[0, 0, :64], torch.zeros(64, 8))


# ---------------------------------------------------------------- the cache
def test_a_compiled_kv_cache_refuses_to_write_past_max_len_and_is_left_unchanged():
    torch.manual_seed(0)
    attn = mh.MultiHeadAttention(16, 2, causal=True).eval()
    cache = attn.new_cache(1, 4)
    step = torch.compile(lambda x: attn(x, cache=cache), fullgraph=True, backend="aot_eager")
    with torch.no_grad():
        step(torch.randn(1, 3, 16))
        keys = cache.keys.clone()
        with pytest.raises(RuntimeError, match="no room"):
            step(torch.randn(1, 3, 16))
    assert cache.lengths.tolist() == [3] and torch.equal(cache.keys, keys)
