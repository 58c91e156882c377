"""How a cache stores numbers: as they come (float), or as int8 / fp8 e4m3 codes with fp32 scales.

    codec = codec_for(kv_dtype, dtype)        # kv_dtype None or a float dtype: Codec(None, that dtype)
    codes, scales = codec.encode(x)           # x (..., D) -> codes (..., D), scales (...) fp32 (None: float)

One codec serves every layout (keys and values, one K = V head, latent + rotary key). Quantization is
symmetric absmax per token and kv head: scale = max |x| / 127 (int8, codes round(x / scale) in [-127, 127])
or max |x| / 448 (fp8 e4m3, its largest finite value); a code stands for code * scale. Scales are fp32
whatever the model's dtype (a bf16 scale would add its own 0.4% rounding). A NaN in a token gives it a
NaN scale, so the NaN still reaches the output; an all-zero token has scale 0 and codes 0. fp8 codes are
stored as their bytes (`torch.uint8`: torch's CPU scatter lacks fp8). split=S (a latent row [latent |
rotary key]): two scales per row, (..., 2), for the columns before S and the rest.
"""
from __future__ import annotations

from typing import NamedTuple

import torch

from multihead.backends.kv_forms import Quantized, dequantized
from multihead.errors import AttentionError

KV_DTYPES = (torch.int8, torch.float8_e4m3fn)  # what a quantized cache holds
LARGEST = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0}  # the largest code magnitude
STORED = {torch.int8: torch.int8, torch.float8_e4m3fn: torch.uint8}  # the buffers' dtype
FLOATS = (torch.float64, torch.float32, torch.bfloat16, torch.float16)  # a float cache's dtypes


def check_kv_dtype(kv_dtype) -> None:
    """AttentionError unless kv_dtype is one a quantized cache holds."""
    if kv_dtype not in KV_DTYPES:
        raise AttentionError(f"a quantized KV cache holds torch.int8 or torch.float8_e4m3fn codes, a float cache "
                             f"one of {[str(d) for d in FLOATS]} (as dtype= does); got kv_dtype={kv_dtype!r}.")


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


class Codec(NamedTuple):
    """kv_dtype: None (numbers kept as they come) or int8 / float8_e4m3fn codes; dtype: what the model hands in."""
    kv_dtype: torch.dtype | None
    dtype: torch.dtype

    @property
    def quantized(self) -> bool:
        return self.kv_dtype is not None

    @property
    def stored(self) -> torch.dtype:
        """The dtype of the buffers that hold the numbers (codes' bytes for fp8)."""
        return self.dtype if self.kv_dtype is None else STORED[self.kv_dtype]

    def encode(self, x: torch.Tensor, split: int | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x (..., D) -> (codes (..., D), scales (...) or (..., 2) with split); float: (x, None)."""
        if self.kv_dtype is None:
            return x, None
        if split is None:
            return quantize(x, self.kv_dtype)
        (a, sa), (b, sb) = quantize(x[..., :split], self.kv_dtype), quantize(x[..., split:], self.kv_dtype)
        return torch.cat((a, b), dim=-1), torch.stack((sa, sb), dim=-1)

    def view(self, codes: torch.Tensor, scales: torch.Tensor | None, split: int | None = None):
        """What attention reads: the tensor itself (float), or `Quantized` codes and scales."""
        return codes if self.kv_dtype is None else Quantized(codes, scales, self.kv_dtype, split)

    def __repr__(self) -> str:
        return "none" if self.kv_dtype is None else str(self.kv_dtype).removeprefix("torch.")


def codec_for(kv_dtype: torch.dtype | None, dtype: torch.dtype | None, default: torch.dtype | None = None) -> Codec:
    """The codec for kv_dtype (None, a float dtype, int8 or float8_e4m3fn) and the model's dtype (dtype, else
    default, else torch's). A float kv_dtype is the cache's dtype, as dtype= is (both given, they must agree)."""
    floating = kv_dtype in FLOATS
    if floating and dtype is not None and dtype != kv_dtype:
        raise AttentionError(f"kv_dtype={kv_dtype} and dtype={dtype} disagree: a float cache holds numbers in the "
                             "dtype the model hands in; give one of them.")
    model = dtype or (kv_dtype if floating else None) or default or torch.get_default_dtype()
    if not isinstance(model, torch.dtype) or not model.is_floating_point or model in KV_DTYPES:
        raise AttentionError(f"a cache takes keys and values in a float dtype; got dtype={model!r}.")
    if kv_dtype is None or floating:
        return Codec(None, model)
    check_kv_dtype(kv_dtype)
    return Codec(kv_dtype, model)
