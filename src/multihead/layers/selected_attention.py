"""attend_selected: each query attends to its own list of keys (token-sparse attention), nothing else.

Shape legend: B batch, H query heads, Hkv key/value heads, Lq queries, Lk keys, D head dim of q and k,
Dv head dim of v, K keys listed per query.

    out = attend_selected(q, k, v, indices, scale=..., sinks=...)
          q (B, H, Lq, D), k (B, Hkv, Lk, D), v (B, Hkv, Lk, Dv), indices (B, Lq, K)  ->  (B, H, Lq, Dv)

indices[b, i] lists the keys query i of sequence b may attend to, shared by every head; -1 is a free
slot (FlashMLA's and vLLM's convention); a key listed twice counts once. The lists are the
whole truth: no other mask applies, so a caller lists only keys that are causal and not padding (the
lightning indexer's top-k does). A row with no key returns zeros (with sinks too: no value to carry).

DeepSeek Sparse Attention (V3.2, GLM-MoE-DSA) and DeepSeek V4's compressed-sparse layers reach their
selected keys through this one function: mh.attention under Mask.sparse(indices). The sparse backend
gathers each query's listed rows, a block of queries at a time, so neither a decode step nor a prefill
touches the whole (Lq, Lk) grid; a decode step on the CPU runs the C++ decode kernel over the gathered
rows (backends/sparse.py).
"""
from __future__ import annotations

import torch

from multihead.attention import attention
from multihead.errors import AttentionError, shape_str
from multihead.masks import Mask


def attend_selected(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor, *,
                    scale: float | None = None, softcap: float | None = None, sinks: torch.Tensor | None = None,
                    dropout: float = 0.0, backend: str = "auto") -> torch.Tensor:
    """Attention of q (B, H, Lq, D) over the keys `indices` (B, Lq, K) lists per query -> (B, H, Lq, Dv).

    The keywords are mh.attention's (scale, softcap, sinks, dropout, backend); see the module docstring.
    """
    if q.dim() != 4 or k.dim() != 4:
        raise AttentionError(f"q and k must be (B, H, Lq, D) and (B, Hkv, Lk, D); got {shape_str(q.shape)} and "
                             f"{shape_str(k.shape)}.")
    check_indices(indices, q.shape[0], q.shape[2], k.shape[2], q.device)
    return attention(q, k, v, Mask.sparse(indices), scale=scale, softcap=softcap, sinks=sinks, dropout=dropout,
                     backend=backend)


def check_indices(indices, B: int, Lq: int, Lk: int, device: torch.device) -> None:
    """AttentionError unless indices is an integer (B, Lq, K) tensor on `device` with values in [-1, Lk)
    (the values are read on the CPU only, once, and never under torch.compile)."""
    if not isinstance(indices, torch.Tensor) or indices.dtype not in (torch.int32, torch.int64):
        got = f"{indices.dtype} tensor" if isinstance(indices, torch.Tensor) else type(indices).__name__
        raise AttentionError(f"indices must be an int32 or int64 tensor (B, Lq, K), -1 for a free slot; got {got}.")
    if indices.dim() != 3 or tuple(indices.shape[:2]) != (B, Lq):
        raise AttentionError(f"indices must be (B={B}, Lq={Lq}, K): the keys each query may attend to; got "
                             f"{shape_str(indices.shape)}.")
    if indices.device != device:
        raise AttentionError(f"indices must be on {device}; got {indices.device}.")
    if indices.numel() and indices.device.type == "cpu" and not torch.compiler.is_compiling():
        low, high = int(indices.min()), int(indices.max())
        if low < -1 or high >= Lk:
            raise AttentionError(f"indices must lie in [-1, {Lk}) (Lk={Lk} keys; -1 = free slot); got values "
                                 f"from {low} to {high}.")


def restrict_indices(indices: torch.Tensor, allowed: torch.Tensor | None) -> torch.Tensor:
    """indices (B, Lq, K) with every key that `allowed` (B|1, Lq, Lk) bool forbids turned into -1."""
    if allowed is None:
        return indices
    allowed = allowed.expand(indices.shape[0], -1, -1)
    kept = (indices >= 0) & allowed.gather(-1, indices.clamp_min(0).long())
    return torch.where(kept, indices, -1)
