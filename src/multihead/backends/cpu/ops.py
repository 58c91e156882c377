"""The C++ decode module's entry points as torch custom ops, each a thin call of the checked wrapper (calls.Kernel).

    multihead::decode_step       Kernel.decode_step        -> (out, lse)
    multihead::decode_quantized  Kernel.decode_quantized   -> (out, lse)
    multihead::decode_paged      Kernel.decode_paged       -> (out, lse)
    multihead::decode_listed     Kernel.decode_listed      -> out
    multihead::latent_product    Kernel.latent_product     -> y
    multihead::keep_nan_rows     Kernel.keep_nan_rows      (writes out in place)

lse is (B, H, Lq) float32 when `with_lse`, else an empty tensor (a custom op returns tensors, never None).
Each op has a fake implementation, so it runs under torch.compile (and torch.export) once an eager call has
built or loaded the module: the op runs the loaded build (`build.loaded()`); loading reads files, which a
compiled graph must not do. Eager callers use `call`, which goes to the wrapper directly: the op's dispatch
costs about 0.1 ms a step when the step's keys and values have pushed torch's own code out of the caches.
"""
from __future__ import annotations

import torch

from multihead.backends.cpu.build import kernel, loaded
from multihead.backends.cpu.calls import Kernel

_NONE = torch.empty(0)


def _built() -> Kernel:
    module = loaded() or kernel()
    if module is None:
        raise RuntimeError("the C++ decode kernel is not built: callers check build.kernel() first")
    return module


def _pair(result, with_lse: bool):
    return (result[0], result[1]) if with_lse else (result, _NONE.clone())


@torch.library.custom_op("multihead::decode_step", mutates_args=())
def decode_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor,
                qpos: torch.Tensor, slopes: torch.Tensor, sinks: torch.Tensor, scale: float, softcap: float,
                with_lse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel.decode_step (slopes, sinks empty when absent; softcap 0: none)."""
    return _pair(_built().decode_step(q, k, v, lo, hi, qpos, slopes, sinks, scale, softcap, with_lse), with_lse)


@torch.library.custom_op("multihead::decode_quantized", mutates_args=())
def decode_quantized(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_scales: torch.Tensor,
                     v_scales: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, qpos: torch.Tensor,
                     slopes: torch.Tensor, sinks: torch.Tensor, scale: float, softcap: float,
                     with_lse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel.decode_quantized: int8 or fp8 e4m3 codes with their scales."""
    return _pair(_built().decode_quantized(q, k, v, k_scales, v_scales, lo, hi, qpos, slopes, sinks, scale,
                                           softcap, with_lse), with_lse)


@torch.library.custom_op("multihead::decode_paged", mutates_args=())
def decode_paged(q: torch.Tensor, k_pages: torch.Tensor, v_pages: torch.Tensor, table: torch.Tensor,
                 lo: torch.Tensor, hi: torch.Tensor, qpos: torch.Tensor, slopes: torch.Tensor, sinks: torch.Tensor,
                 scale: float, softcap: float, k_scales: torch.Tensor | None, v_scales: torch.Tensor | None,
                 with_lse: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Kernel.decode_paged: pages read in place through the block table."""
    return _pair(_built().decode_paged(q, k_pages, v_pages, table, lo, hi, qpos, slopes, sinks, scale, softcap,
                                       k_scales, v_scales, with_lse), with_lse)


def _fake_step(q, v, with_lse):
    B, H, Lq, _ = q.shape
    return q.new_empty(B, H, Lq, v.shape[-1]), q.new_empty((B, H, Lq) if with_lse else (0,), dtype=torch.float32)


@decode_step.register_fake
def _(q, k, v, lo, hi, qpos, slopes, sinks, scale, softcap, with_lse):
    return _fake_step(q, v, with_lse)


@decode_quantized.register_fake
def _(q, k, v, k_scales, v_scales, lo, hi, qpos, slopes, sinks, scale, softcap, with_lse):
    return _fake_step(q, v, with_lse)


@decode_paged.register_fake
def _(q, k_pages, v_pages, table, lo, hi, qpos, slopes, sinks, scale, softcap, k_scales, v_scales, with_lse):
    return _fake_step(q, v_pages, with_lse)


@torch.library.custom_op("multihead::decode_listed", mutates_args=())
def decode_listed(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, idx: torch.Tensor, count: torch.Tensor | None,
                  sinks: torch.Tensor | None, scale: float, softcap: float) -> torch.Tensor:
    """Kernel.decode_listed: the step over listed cache slots (Mask.sparse)."""
    return _built().decode_listed(q, k, v, idx, count, sinks, scale, softcap)


@decode_listed.register_fake
def _(q, k, v, idx, count, sinks, scale, softcap):
    return q.new_empty(*q.shape[:3], v.shape[-1])


@torch.library.custom_op("multihead::latent_product", mutates_args=())
def latent_product(w: torch.Tensor, x: torch.Tensor, fold: bool) -> torch.Tensor:
    """Kernel.latent_product: x (H, M, K) float32 with w bfloat16, (H, K, N) to fold or (H, N, K) to unfold."""
    return _built().latent_product(w, x, fold)


@latent_product.register_fake
def _(w, x, fold):
    return x.new_empty(x.shape[0], x.shape[1], w.shape[2] if fold else w.shape[1])


@torch.library.custom_op("multihead::keep_nan_rows", mutates_args=("out",))
def keep_nan_rows(out: torch.Tensor, q: torch.Tensor) -> None:
    """Kernel.keep_nan_rows: out's rows NaN where q's row holds NaN or inf, in place."""
    _built().keep_nan_rows(out, q)


@keep_nan_rows.register_fake
def _(out, q):
    return None


def call(name: str, *args, build: Kernel | None = None):
    """The entry point `name` (a Kernel method): the custom op while torch.compile traces, the checked wrapper
    of the loaded build (or of `build`, another one: tests, benchmarks) otherwise, in the op's return forms
    ((out, lse) pairs for the steps)."""
    if torch.compiler.is_compiling():
        return OPS[name](*args)
    result = getattr(build or _built(), name)(*args)
    if name in PAIRS:
        return _pair(result, args[-1])
    return None if name == "keep_nan_rows" else result


OPS = {"decode_step": decode_step, "decode_quantized": decode_quantized, "decode_paged": decode_paged,
       "decode_listed": decode_listed, "latent_product": latent_product, "keep_nan_rows": keep_nan_rows}
PAIRS = ("decode_step", "decode_quantized", "decode_paged")
