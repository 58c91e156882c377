"""QuantizedKVCache (int8, fp8 e4m3): codes and scales written once at append, attention over them equal
to float64 attention over the numbers they stand for (kernel step and blockwise prefill), measured drift
against a float cache, and refused calls that change nothing."""
from __future__ import annotations

import pytest
import torch

import multihead as mh
from multihead.backends.decode.quantized_numerics import blockwise
from multihead.backends.decode.ranges import key_ranges
from multihead.caches.kv import BOTTOM_RIGHT
from multihead.caches.quantized import Quantized, QuantizedKVCache, dequantized, quantize

KV_DTYPES = [torch.int8, torch.float8_e4m3fn]
IDS = ["int8", "fp8"]
E, H = 64, 4


def _exact(q, keys: Quantized, values: Quantized, mask, **extra):
    """float64 attention over the numbers the codes stand for."""
    wide = {name: t.double() if isinstance(t, torch.Tensor) else t for name, t in extra.items()}
    return mh.attention(q.double(), keys.numbers(torch.float64), values.numbers(torch.float64), mask,
                        backend="math", **wide)


def _quantized(t, kv_dtype):
    return Quantized(*quantize(t, kv_dtype), kv_dtype)


@pytest.mark.parametrize("kv_dtype", KV_DTYPES, ids=IDS)
def test_quantize_keeps_each_number_within_half_a_step(kv_dtype):
    x = torch.randn(2, 3, 50, 64) * torch.logspace(-3, 3, 50)[:, None]  # tokens of every magnitude
    x[0, 0, 0] = 0.0  # an all-zero token: scale 0, codes 0
    codes, scales = quantize(x, kv_dtype)
    assert scales.shape == (2, 3, 50) and scales.dtype == torch.float32 and scales[0, 0, 0] == 0
    error = (dequantized(codes, scales, kv_dtype) - x).abs()
    if kv_dtype is torch.int8:  # rounding: half a step of absmax / 127
        assert bool((error <= 0.5 * scales[..., None] * (1 + 1e-5)).all())
    else:  # e4m3: 3 mantissa bits, relative 2^-4, and subnormal steps of 2^-9 * scale
        assert bool((error <= x.abs() / 16 + 2.0 ** -10 * scales[..., None] + 1e-30).all())
    nan = x.clone()
    nan[1, 2, 7, 3] = float("nan")
    assert dequantized(*quantize(nan, kv_dtype), kv_dtype)[1, 2, 7].isnan().all()  # a NaN token stays NaN


@pytest.mark.parametrize("kv_dtype", KV_DTYPES, ids=IDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_decode_step_matches_float64_over_the_codes(kv_dtype, dtype):
    """The kernel step (Lq <= 4 on the CPU): ragged lengths with an empty sequence, a window, ALiBi,
    softcap and sinks, GQA; within float32 rounding of float64 over the dequantized cache."""
    g = torch.Generator().manual_seed(1)
    B, Hq, Hkv, N, D = 3, 8, 2, 300, 64
    q = torch.randn(B, Hq, 2, D, generator=g).to(dtype)
    keys = _quantized(2 * torch.randn(B, Hkv, N, D, generator=g), kv_dtype)
    values = _quantized(torch.randn(B, Hkv, N, D, generator=g), kv_dtype)
    masks = [mh.Mask.lengths(torch.tensor([N, 170, 0])) & mh.Mask.causal("bottom_right")
             & mh.Mask.window(90, "bottom_right"),
             mh.Mask.causal("bottom_right") & mh.Mask.alibi(torch.linspace(0.5, 0.01, Hq), "bottom_right")]
    for mask, extra in ((masks[0], {}), (masks[1], {"softcap": 5.0, "sinks": torch.linspace(-1.0, 2.0, Hq)})):
        out = mh.attention(q, keys, values, mask, **extra)
        ref = _exact(q, keys, values, mask, **extra)
        assert out.dtype == dtype and out.shape == ref.shape
        tol = 1e-5 if dtype is torch.float32 else 2e-2  # bf16: the output's own rounding
        assert (out.double() - ref).abs().max().item() <= tol * ref.abs().max().item()


@pytest.mark.parametrize("kv_dtype", KV_DTYPES, ids=IDS)
def test_blockwise_prefill_over_a_long_cache_matches_float64(kv_dtype):
    """Prefill (many query rows) at 2500 keys: three blocks of 1024 dequantized in turn, bottom-right
    causal with ragged lengths and sinks."""
    g = torch.Generator().manual_seed(2)
    B, Hq, Hkv, N, Lq, D = 2, 2, 1, 2500, 40, 32
    q = torch.randn(B, Hq, Lq, D, generator=g)
    keys = _quantized(torch.randn(B, Hkv, N, D, generator=g), kv_dtype)
    values = _quantized(torch.randn(B, Hkv, N, D, generator=g), kv_dtype)
    mask = mh.Mask.lengths(torch.tensor([N, 1500]), torch.tensor([Lq, 7])) & mh.Mask.causal("bottom_right")
    sinks = torch.tensor([0.5, -1.0])
    out = mh.attention(q, keys, values, mask, sinks=sinks)
    ref = _exact(q, keys, values, mask, sinks=sinks)
    kept = ~ref.isnan()
    assert torch.equal(out.isnan(), ref.isnan())
    assert (out.double() - ref)[kept].abs().max().item() <= 1e-5
    lo, hi, qpos, _ = key_ranges(mask, B, Hq, Lq, N, "cpu")  # a smaller block gives the same
    small = blockwise(q, keys, values, lo, hi, qpos, D ** -0.5, sinks=sinks, block=300)
    assert (small.double() - ref)[kept].abs().max().item() <= 1e-5


@pytest.mark.parametrize("kv_dtype", KV_DTYPES, ids=IDS)
def test_module_decodes_over_a_quantized_cache_within_its_measured_drift(kv_dtype):
    """Prefill then single-token steps with new_cache(kv_dtype=...): every output within 1% (int8) and 6%
    (fp8) of the float cache's largest output, bounds above the drift benchmarks/quant_drift.py measures,
    and not equal to it (the codes are really used)."""
    torch.manual_seed(0)
    m = mh.MultiHeadAttention(E, H, num_kv_heads=2, causal=True, rope=mh.RoPE(E // H)).eval()
    x = torch.randn(2, 40, E)
    outs = {}
    with torch.no_grad():
        for name, kv in (("float", None), ("quantized", kv_dtype)):
            cache = m.new_cache(2, 48, kv_dtype=kv)
            steps = [m(x[:, :30], cache=cache)] + [m(x[:, t:t + 1], cache=cache) for t in range(30, 40)]
            outs[name] = torch.cat(steps, 1)
    assert isinstance(cache, QuantizedKVCache) and cache.kv_dtype is kv_dtype and cache.lengths.tolist() == [40, 40]
    drift = (outs["quantized"] - outs["float"]).abs().max() / outs["float"].abs().max()
    assert 0 < drift.item() <= (0.01 if kv_dtype is torch.int8 else 0.06)


def _state(cache):
    return {name: t.clone() for name, t in cache.state_dict().items()}, cache._filled


def test_refused_calls_leave_the_cache_unchanged():
    cache = QuantizedKVCache(2, 8, 2, 16, kv_dtype=torch.int8, dtype=torch.float32)
    cache.append(torch.randn(2, 2, 3, 16), torch.randn(2, 2, 3, 16))
    before = _state(cache)
    grad = torch.randn(2, 2, 1, 16, requires_grad=True)
    bad = [((grad, grad.detach()), "require grad"),
           ((torch.randn(2, 2, 1, 16).bfloat16(),) * 2, "holds torch.float32"),
           ((torch.randn(2, 2, 6, 16),) * 2, "max_len=8"),
           ((torch.randn(2, 1, 1, 16),) * 2, "Hkv=2")]
    for (k, v), says in bad:
        with pytest.raises(mh.AttentionError, match=says):
            cache.append(k, v)
        after = _state(cache)
        assert after[1] == before[1] and all(torch.equal(after[0][n], t) for n, t in before[0].items())
    assert cache.lengths.tolist() == [3, 3]


def test_kv_dtypes_the_cache_lacks_are_refused_clearly():
    """A float kv_dtype is the cache's dtype (as dtype= is); other dtypes are refused, naming dtype=."""
    m = mh.MultiHeadAttention(E, H)
    assert m.new_cache(1, 4, kv_dtype=torch.float16).keys.dtype == torch.float16
    for kv_dtype in (torch.uint8, torch.float8_e5m2, "int8"):
        with pytest.raises(mh.AttentionError, match=r"torch.int8 or torch.float8_e4m3fn.*dtype="):
            m.new_cache(1, 4, kv_dtype=kv_dtype)
    with pytest.raises(mh.AttentionError, match="disagree"):
        m.new_cache(1, 4, kv_dtype=torch.float16, dtype=torch.bfloat16)
    with pytest.raises(mh.AttentionError, match="combines the heads' attention"):
        mh.DifferentialAttention(E, H, lambda_init=0.5).new_cache(1, 4, kv_dtype=torch.int8)
    with pytest.raises(mh.AttentionError, match="float dtype"):
        QuantizedKVCache(1, 4, 1, 8, kv_dtype=torch.int8, dtype=torch.int8)
    cache = m.new_cache(1, 8, kv_dtype=torch.int8)
    x = torch.randn(1, 2, E)
    with pytest.raises(mh.AttentionError, match="require grad"):
        m(x, cache=cache)  # the projections' outputs need grad outside no_grad
    assert cache.lengths.tolist() == [0] and not cache.keys.any()


@pytest.mark.parametrize("kv_dtype", KV_DTYPES, ids=IDS)
def test_reorder_and_reset_move_codes_and_scales_together(kv_dtype):
    cache = QuantizedKVCache(3, 6, 1, 8, kv_dtype=kv_dtype, dtype=torch.bfloat16)
    k = torch.randn(3, 1, 2, 8).bfloat16() * torch.tensor([1.0, 10.0, 100.0]).view(3, 1, 1, 1).bfloat16()
    cache.append(k, k)
    numbers = dequantized(cache.keys, cache.key_scales, kv_dtype)
    cache.reorder(torch.tensor([2, 0, 0]))
    assert torch.equal(dequantized(cache.keys, cache.key_scales, kv_dtype), numbers[[2, 0, 0]])
    assert cache.bytes_per_token() == 1 * 16 * 1 + 2 * 4
    cache.reset()
    assert not cache.keys.any() and not cache.key_scales.any() and cache.lengths.tolist() == [0, 0, 0]


def test_dense_masks_are_sliced_block_by_block_and_grad_is_refused():
    """A keep mask per head and an additive mask (a Hugging Face 4-D mask's forms) over 2100 keys: three
    blocks, each taking its slice of the dense mask; a row that keeps nothing gives 0."""
    g = torch.Generator().manual_seed(4)
    keys = _quantized(torch.randn(2, 2, 2100, 16, generator=g), torch.int8)
    values = _quantized(torch.randn(2, 2, 2100, 16, generator=g), torch.int8)
    q = torch.randn(2, 4, 3, 16, generator=g)
    keep = torch.rand(2, 4, 3, 2100, generator=g) > 0.3
    keep[1, 2, 0] = False
    bias = torch.where(torch.rand(2, 1, 3, 2100, generator=g) > 0.5, 0.0, torch.finfo(torch.float32).min)
    for mask in (mh.Mask.keep(keep), mh.Mask.additive(bias)):
        out = mh.attention(q, keys, values, mask)
        torch.testing.assert_close(out.double(), _exact(q, keys, values, mask), atol=1e-5, rtol=0)
    assert not mh.attention(q, keys, values, mh.Mask.keep(keep))[1, 2, 0].any()
    with pytest.raises(mh.AttentionError, match="no backward"):
        mh.attention(q.requires_grad_(), keys, keys)


@pytest.mark.parametrize("value_dim", [8, 5], ids=["same-width", "narrower-values"])
def test_append_quantizes_keys_and_values_each_by_its_own_scale(value_dim):
    cache = QuantizedKVCache(2, 6, 1, 8, value_dim=value_dim, kv_dtype=torch.int8, dtype=torch.float32)
    k, v = torch.randn(2, 1, 3, 8), 50 * torch.randn(2, 1, 3, value_dim)
    keys, values, _ = cache.append(k, v)
    assert torch.equal(keys.codes, quantize(k, torch.int8)[0]) and torch.equal(values.scales, quantize(v, torch.int8)[1])
    assert (values.numbers() - v).abs().max() <= 0.5 * values.scales.max() * (1 + 1e-5)


@pytest.mark.slow
def test_a_compiled_module_decodes_over_a_quantized_cache_as_eager_does():
    """Under torch.compile(dynamic=True) the kernel is not loaded: the blockwise form runs, same numbers for the
    steps. The eager prompt into the empty cache attends on its float keys, the compiled one (all slots, static
    shapes) on their codes: the prompt's rows agree within int8 drift."""
    torch.manual_seed(0)
    m = mh.MultiHeadAttention(32, 4, num_kv_heads=2, causal=True, rope=mh.RoPE(8)).eval()
    x = torch.randn(1, 6, 32)
    outs = []
    with torch.no_grad():
        for run in (m, torch.compile(m, dynamic=True)):
            cache = m.new_cache(1, 8, kv_dtype=torch.int8)
            outs.append(torch.cat([run(x[:, :4], cache=cache)] + [run(x[:, t:t + 1], cache=cache) for t in (4, 5)], 1))
    assert cache.lengths.tolist() == [6]
    torch.testing.assert_close(outs[1][:, 4:], outs[0][:, 4:], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(outs[1][:, :4], outs[0][:, :4], atol=3e-2 * outs[0].abs().max().item(), rtol=0)


def test_a_ragged_batch_writes_each_sequence_at_its_own_length():
    """A right-padded prompt (Mask.lengths) then steps: each sequence's codes and scales land at its own
    slots, and its outputs follow the float cache's within int8 drift."""
    torch.manual_seed(1)
    m = mh.MultiHeadAttention(E, H, num_kv_heads=2, causal=True, rope=mh.RoPE(E // H)).eval()
    lens = torch.tensor([5, 2])
    x = torch.randn(2, 8, E)
    outs, caches = {}, {}
    with torch.no_grad():
        for name, kv in (("float", None), ("int8", torch.int8)):
            cache = caches[name] = m.new_cache(2, 12, kv_dtype=kv)
            m(x[:, :5], cache=cache, mask=mh.Mask.lengths(lens, query_lens=lens))
            outs[name] = torch.cat([m(x[:, t:t + 1], cache=cache) for t in range(5, 8)], 1)
    assert caches["int8"].lengths.tolist() == [8, 5]
    assert bool((caches["int8"].key_scales[1, :, 5:] == 0).all()) and bool((caches["int8"].key_scales[1, :, :5] > 0).all())
    numbers = dequantized(caches["int8"].keys, caches["int8"].key_scales, torch.int8)
    assert (numbers - caches["float"].keys).abs().max() <= 0.5 * caches["int8"].key_scales.max() * (1 + 1e-5)
    assert ((outs["int8"] - outs["float"]).abs().max() / outs["float"].abs().max()).item() <= 0.01


@pytest.mark.parametrize("kv_dtype", KV_DTYPES, ids=IDS)
def test_keys_no_row_keeps_are_inert_in_the_blockwise_path(kv_dtype):
    """NaN stored past a sequence's length (or at a padded key) never reaches an output: each block's values
    are zeroed where no row keeps the key, as on a float cache."""
    g = torch.Generator().manual_seed(4)
    B, Hq, Hkv, N, Lq, D = 2, 2, 1, 70, 3, 16
    q = torch.randn(B, Hq, Lq, D, generator=g)
    k, v = torch.randn(B, Hkv, N, D, generator=g), torch.randn(B, Hkv, N, D, generator=g)
    keys, values = _quantized(k, kv_dtype), _quantized(v, kv_dtype)
    values.scales[1, :, 50:] = float("nan")  # the numbers stored past sequence 1's length are NaN
    pad = torch.zeros(B, N, dtype=torch.bool)
    pad[0, 10:20] = True
    values.scales[0, :, 10:20] = float("nan")  # and those at sequence 0's padded keys
    mask = mh.Mask.lengths(torch.tensor([N, 50])) & mh.Mask.key_padding(pad)
    out = mh.attention(q, keys, values, mask)
    assert not out.isnan().any()
    ref = mh.attention(q.double(), keys.numbers(torch.float64), values.numbers(torch.float64).nan_to_num(0.0), mask,
                       backend="math")
    assert (out.double() - ref).abs().max().item() <= 1e-5
