"""QuantizedLatentCache: an MLA LatentCache of int8 or fp8 (e4m3) codes, two fp32 scales per token.

Shape legend: B batch, M max_len, C latent width, R rotary key width, Di indexer key width.

    cache = mla.new_cache(B, max_len, kv_dtype=torch.int8)   # or torch.float8_e4m3fn
    keys (B, 1, M, C + R): codes of [latent | rotary key]; scales (B, 1, M, 2): the latent's, the key's

The latent and the rotary key of a token are quantized apart (symmetric absmax, as in caches/quantized.py),
because their magnitudes differ: the latent is normalised, the rotary key is not. The indexer's keys
(index_dim) stay in the model's dtype. Attention over the cache dequantizes it block by block
(backends/decode_quant.blockwise): the decode kernel takes one scale per key row, and these rows have
two. The module runs the absorbed form over a quantized cache, for prefill too, so that no per-head
key is decompressed from dequantized latents.
"""
from __future__ import annotations

import torch

from multihead.errors import AttentionError
from multihead.caches.latent import LatentCache
from multihead.caches.quantized import STORED, Quantized, check_kv_dtype, quantize


class QuantizedLatentCache(LatentCache):
    """Codes keys (B, 1, M, C + R) with fp32 scales (B, 1, M, 2); latents and rotary keys come in `dtype`."""

    def __init__(self, batch_size: int, max_len: int, latent_dim: int, rope_dim: int, *, kv_dtype: torch.dtype,
                 index_dim: int | None = None, device=None, dtype=None):
        check_kv_dtype(kv_dtype)
        self.kv_dtype = kv_dtype
        self.model_dtype = dtype or torch.get_default_dtype()
        if not self.model_dtype.is_floating_point or self.model_dtype is torch.float8_e4m3fn:
            raise AttentionError(f"a quantized cache takes latents in a float dtype; got dtype={dtype!r}.")
        super().__init__(batch_size, max_len, latent_dim, rope_dim, index_dim=index_dim, device=device,
                         dtype=STORED[kv_dtype])

    def _allocate(self, B: int, M: int, Hkv: int, D: int, Dv: int, factory: dict) -> None:
        super()._allocate(B, M, Hkv, D, Dv, factory)
        self.register_buffer("scales", torch.zeros(B, Hkv, M, 2, device=factory["device"]))
        if self.index_store is not None:  # the indexer's keys stay in the model's dtype
            self.index_store = self.index_store.to(self.model_dtype)

    @property
    def input_dtype(self) -> torch.dtype:
        """The model's dtype: what append_latent takes latents and rotary keys in."""
        return self.model_dtype

    def append(self, k: torch.Tensor, v: torch.Tensor, new_tokens: torch.Tensor | None = None):
        """append_latent's write: k (B, 1, Lq, C + R) = [latent | rotary key] quantized part by part.
        Returns (keys, values, mask) with keys and values `Quantized` (values: the latents' codes)."""
        if k.requires_grad or v.requires_grad:
            raise AttentionError("a quantized latent cache is for inference: its codes have no gradient; got "
                                 "latents that require grad (run under torch.no_grad() or use a float cache).")
        self._check(k, v, new_tokens)
        C = self.latent_dim
        (latent, latent_scale), (rope, rope_scale) = (quantize(k[..., :C], self.kv_dtype),
                                                      quantize(k[..., C:], self.kv_dtype))
        self._write(self.scales, torch.stack((latent_scale, rope_scale), dim=-1))  # (B, 1, Lq, 2)
        codes = torch.cat((latent, rope), dim=-1)
        keys, _, mask = self._commit(codes, codes[..., :C], new_tokens)
        scales = self.scales[:, :, :keys.shape[2]]
        return (Quantized(keys, scales, self.kv_dtype, split=C),
                Quantized(keys[..., :C], scales[..., 0], self.kv_dtype), mask)

    def reset(self) -> None:
        super().reset()
        self.scales.zero_()

    def _fresh(self, batch_size: int, max_len: int) -> QuantizedLatentCache:
        return QuantizedLatentCache(batch_size, max_len, self.latent_dim, self.rope_dim, kv_dtype=self.kv_dtype,
                                    index_dim=self.index_dim, device=self.keys.device, dtype=self.model_dtype)

    def bytes_per_token(self) -> int:
        """(C + R) codes, two fp32 scales and Di indexer numbers in the model's dtype."""
        index = (self.index_dim or 0) * self.model_dtype.itemsize
        return (self.latent_dim + self.rope_dim) * self.keys.element_size() + 2 * 4 + index

    def extra_repr(self) -> str:
        return super().extra_repr() + f", kv_dtype={self.kv_dtype}"
