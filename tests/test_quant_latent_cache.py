"""QuantizedLatentCache (MLA, int8 and fp8 e4m3): latent and rotary key quantized apart, attention over the
codes equal to float64 over the numbers they stand for, drift against a float cache, refusals that change
nothing."""
from __future__ import annotations

import pytest
import torch

import multihead as mh
from multihead.caches.quantized import dequantized
from multihead.caches.quantized_latent import QuantizedLatentCache
from test_latent import make_mla

KV_DTYPES = [torch.int8, torch.float8_e4m3fn]
IDS = ["int8", "fp8"]


@pytest.mark.parametrize("kv_dtype", KV_DTYPES, ids=IDS)
def test_latent_and_rotary_key_get_their_own_scales(kv_dtype):
    cache = QuantizedLatentCache(2, 8, 16, 4, kv_dtype=kv_dtype, dtype=torch.float32)
    latent, rope = torch.randn(2, 3, 16), 100 * torch.randn(2, 3, 4)  # magnitudes far apart
    keys, _ = cache.append_latent(latent, rope)
    assert keys.split == 16 and cache.scales.shape == (2, 1, 8, 2)
    numbers = keys.numbers()[:, 0]  # (B, Lc, C + R)
    step = 1 / 16 if kv_dtype is torch.float8_e4m3fn else 1 / 127
    assert (numbers[..., :16] - latent).abs().max() <= step * latent.abs().max()
    assert (numbers[..., 16:] - rope).abs().max() <= step * rope.abs().max()
    assert torch.equal(numbers[..., :16], dequantized(cache.latents[:, None, :3], cache.scales[:, :, :3, 0],
                                                      kv_dtype)[:, 0])


@pytest.mark.parametrize("kv_dtype", KV_DTYPES, ids=IDS)
def test_mla_decodes_over_a_quantized_cache_within_its_drift(kv_dtype):
    """Prefill then steps: outputs near the float cache's (int8 2%, fp8 8% of its largest output; a
    small layer with C = 16 averages little), and not equal to them."""
    mla = make_mla().eval()
    x = torch.randn(2, 12, 32, generator=torch.Generator().manual_seed(3))
    outs = {}
    with torch.no_grad():
        for name, kv in (("float", None), ("quantized", kv_dtype)):
            cache = mla.new_cache(2, 16, kv_dtype=kv)
            outs[name] = torch.cat([mla(x[:, :8], cache=cache)] + [mla(x[:, t:t + 1], cache=cache)
                                                                    for t in range(8, 12)], 1)
    assert isinstance(cache, QuantizedLatentCache) and cache.lengths.tolist() == [12, 12]
    drift = ((outs["quantized"] - outs["float"]).abs().max() / outs["float"].abs().max()).item()
    assert 0 < drift <= (0.02 if kv_dtype is torch.int8 else 0.08)


def test_refused_calls_leave_the_latent_cache_unchanged():
    mla = make_mla().eval()
    cache = mla.new_cache(1, 4, kv_dtype=torch.int8)
    with torch.no_grad():
        mla(torch.randn(1, 2, 32), cache=cache)
    before = {name: t.clone() for name, t in cache.state_dict().items()}
    with pytest.raises(mh.AttentionError, match="require grad"):
        mla(torch.randn(1, 1, 32), cache=cache)  # outside no_grad the latents need grad
    with pytest.raises(mh.AttentionError, match="max_len=4"), torch.no_grad():
        mla(torch.randn(1, 3, 32), cache=cache)
    assert all(torch.equal(cache.state_dict()[name], t) for name, t in before.items())
    with pytest.raises(mh.AttentionError, match="torch.int8 or torch.float8_e4m3fn"):
        mla.new_cache(1, 4, kv_dtype=torch.uint8)
    assert mla.new_cache(1, 4, kv_dtype=torch.float16).keys.dtype == torch.float16  # a float kv_dtype: as dtype=
    grown = cache.resized(torch.tensor([0, 0]), max_len=9)  # beams: codes, scales and lengths move together
    assert isinstance(grown, QuantizedLatentCache) and grown.max_len == 9 and grown.lengths.tolist() == [2, 2]
    assert torch.equal(grown.keys[1, :, :2], cache.keys[0, :, :2]) and torch.equal(grown.scales[1, :, :2], cache.scales[0, :, :2])
    assert cache.bytes_per_token() == (16 + 4) + 8
