"""QuantizedKVCache: a KVCache that keeps int8 or fp8 (e4m3) codes with one fp32 scale per token and kv head.

Shape legend: B batch, Hkv key/value heads, M max_len, D head dim, Dv value head dim, Lq new tokens.

    cache = attn.new_cache(B, max_len, kv_dtype=torch.int8)   # or torch.float8_e4m3fn
    keys (B, Hkv, M, D) and values (B, Hkv, M, Dv): the codes; key_scales, value_scales (B, Hkv, M) fp32

Each token's key (and value) vector of each kv head is quantized once, when it is appended:
symmetric absmax scaling, scale = max |x| / 127 for int8 (codes round(x / scale) in [-127, 127]) and
max |x| / 448 for fp8 e4m3 (codes x / scale rounded to e4m3, the largest finite e4m3 being 448). The
value a code stands for is code * scale. Scales are fp32 whatever the model's dtype: a bf16 scale
would add its own 0.4% rounding to every number of the token, and 4 bytes per token and head is 3% of
an int8 row of D = 128 codes. A NaN in a token gives it a NaN scale, so the NaN still reaches the
output; an all-zero token has scale 0 and codes 0.

fp8 codes are stored as their bytes (`torch.uint8`; torch's CPU scatter lacks fp8): `kv_dtype` says
what they are and `dequantized(codes, scales, kv_dtype)` gives numbers back.

Attention over the cache (backends/decode_quant.py) dequantizes in registers in the decode kernel,
and block by block of keys otherwise. The cache is for inference: appending keys or values that
require grad raises AttentionError, as does any call the float cache refuses, and a refused call
leaves the cache as it was.
"""
from __future__ import annotations

import torch

from multihead.backends.kv_forms import Quantized, dequantized
from multihead.caches.kv import KVCache
from multihead.errors import AttentionError

KV_DTYPES = (torch.int8, torch.float8_e4m3fn)  # what a quantized cache holds
LARGEST = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0}  # the largest code magnitude
STORED = {torch.int8: torch.int8, torch.float8_e4m3fn: torch.uint8}  # the buffers' dtype
__all__ = ["KV_DTYPES", "Quantized", "QuantizedKVCache", "check_kv_dtype", "dequantized", "quantize"]


def check_kv_dtype(kv_dtype) -> None:
    """AttentionError unless kv_dtype is one a quantized cache holds."""
    if kv_dtype not in KV_DTYPES:
        raise AttentionError(f"a quantized KV cache holds torch.int8 or torch.float8_e4m3fn codes; got kv_dtype={kv_dtype!r}.")


def quantize(x: torch.Tensor, kv_dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """x (..., D) -> (codes (..., D) in STORED[kv_dtype], scales (...) fp32): absmax per last-dim vector."""
    wide = x.float()
    scales = wide.abs().amax(dim=-1) / LARGEST[kv_dtype]  # (...), NaN where the vector holds NaN
    safe = torch.where(scales > 0, scales, 1.0)[..., None]  # zero vectors: codes 0
    codes = torch.div(wide, safe)  # one new tensor, rounded and clamped in place (a prompt's cost, halved)
    if kv_dtype is torch.int8:
        codes = codes.round_().clamp_(-127, 127).to(torch.int8)
    else:
        codes = codes.clamp_(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
    return codes, scales


class QuantizedKVCache(KVCache):
    """Codes keys (B, Hkv, M, D), values (B, Hkv, M, Dv) with fp32 key_scales, value_scales (B, Hkv, M)
    and lengths (B,); appended keys and values come in `dtype` (the model's)."""

    def __init__(self, batch_size: int, max_len: int, num_kv_heads: int, head_dim: int, *, kv_dtype: torch.dtype,
                 value_dim: int | None = None, device=None, dtype=None):
        check_kv_dtype(kv_dtype)
        self.kv_dtype = kv_dtype
        self.model_dtype = dtype or torch.get_default_dtype()
        if not self.model_dtype.is_floating_point or self.model_dtype in KV_DTYPES:
            raise AttentionError(f"a quantized cache takes keys and values in a float dtype; got dtype={dtype!r}.")
        super().__init__(batch_size, max_len, num_kv_heads, head_dim, value_dim=value_dim, device=device,
                         dtype=STORED[kv_dtype])

    def _allocate(self, B: int, M: int, Hkv: int, D: int, Dv: int, factory: dict) -> None:
        super()._allocate(B, M, Hkv, D, Dv, factory)
        self.register_buffer("key_scales", torch.zeros(B, Hkv, M, device=factory["device"]))
        self.register_buffer("value_scales", torch.zeros(B, Hkv, M, device=factory["device"]))

    @property
    def input_dtype(self) -> torch.dtype:
        """The model's dtype: what append takes keys and values in."""
        return self.model_dtype

    def reset(self) -> None:
        """Empty every sequence (codes and scales zeroed)."""
        super().reset()
        self.key_scales.zero_()
        self.value_scales.zero_()

    def append(self, k: torch.Tensor, v: torch.Tensor, new_tokens: torch.Tensor | None = None):
        """Quantize and write k (B, Hkv, Lq, D), v (B, Hkv, Lq, Dv) after each sequence's tokens.

        Returns (keys, values, mask) as KVCache.append does, keys and values as `Quantized` (codes and
        scales of the slots to attend to).
        """
        if k.requires_grad or v.requires_grad:
            raise AttentionError("a quantized KV cache is for inference: its codes have no gradient; got keys or "
                                 "values that require grad (run under torch.no_grad() or use a float cache).")
        self._check(k, v, new_tokens)  # before quantizing: a refused call writes nothing
        if k.shape == v.shape:  # one quantize call for both (a decode step's fixed cost, halved)
            codes, scales = quantize(torch.stack((k, v)), self.kv_dtype)  # (2, B, Hkv, Lq, D), (2, B, Hkv, Lq)
            (kc, vc), (ks, vs) = codes, scales
        else:
            (kc, ks), (vc, vs) = quantize(k, self.kv_dtype), quantize(v, self.kv_dtype)
        self._write(self.key_scales[..., None], ks[..., None])  # (B, Hkv, M, 1) views of the scales
        self._write(self.value_scales[..., None], vs[..., None])
        first = self._filled == 0 and not torch.compiler.is_compiling()  # every slot attended to is new
        keys, values, mask = self._commit(kc, vc, new_tokens)
        Lc = keys.shape[2]  # a prompt into an empty cache is attended on its float keys (kv_forms.py: fresh)
        return (Quantized(keys, self.key_scales[:, :, :Lc], self.kv_dtype, fresh=k if first else None),
                Quantized(values, self.value_scales[:, :, :Lc], self.kv_dtype, fresh=v if first else None), mask)

    def bytes_per_token(self) -> int:
        """What one token costs this cache per layer: Hkv · (D + Dv) codes and 2 · Hkv fp32 scales."""
        _, Hkv, _, D = self.keys.shape
        return Hkv * (D + self.values.shape[-1]) * self.keys.element_size() + 2 * Hkv * 4

    def extra_repr(self) -> str:
        B, Hkv, M, D = self.keys.shape
        return f"batch_size={B}, max_len={M}, num_kv_heads={Hkv}, head_dim={D}, kv_dtype={self.kv_dtype}"
