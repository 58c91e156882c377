"""Continuous batching (transformers' `generate_batch`) on multihead: a FlashAttention-varlen-style function.

    import multihead.hf
    multihead.hf.use_paged(model)          # model.config's attention -> multihead.hf.PAGED
    outputs = model.generate_batch(prompts, generation_config=...)

transformers' continuous batching admits `paged|eager`, `sdpa` and the FlashAttention implementations,
which it recognises by "flash" in the name. Those receive no mask: the requests of a batch come packed
along the sequence axis, and the lengths say where each starts,

    query (1, H, Tq, D), key/value (1, Hkv, Tk, D|Dv)   every request's queries, and its cached keys then its new
                                                        ones (transformers gathers them from its paged cache)
    cu_seq_lens_q (R + 1,), cu_seq_lens_k (R + 1,)      request r holds queries cu_q[r]:cu_q[r+1], keys
                                                        cu_k[r]:cu_k[r+1]
    -> out (1, Tq, H, Dv), None

`paged_attention` takes exactly that (as FlashAttention's varlen call does): each request's query block
attends its own keys, causal bottom-right (its last query sits at its last key), the module's sliding
window, softcap and sinks included, through mh.attention on views of the packed tensors (no copy); so a
request's decode step runs the decode kernel and a prompt chunk runs the fastest exact prefill. The
offsets are read on the host once per call (transformers builds them on the host). Called without the
lengths (model.generate or a plain forward with this implementation), it is the "multihead" function.

The name holds "flash" because that is the gate's test; it is registered in AttentionInterface and
AttentionMaskInterface like "multihead". `model.set_attn_implementation(PAGED)` is refused by
transformers 5.25 before it reaches the registry: it preloads the flash-attn package for any name with
"flash" in it. `use_paged` sets the implementation on the model's configs as set_attn_implementation
does, without that preload.
"""
from __future__ import annotations

import torch

from multihead.attention import attention
from multihead.errors import AttentionError
from multihead.hf.attention import hf_attention
from multihead.masks import Mask

PAGED = "multihead_flash_varlen"


def paged_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask, dropout: float = 0.0, scaling: float | None = None,
                    softcap: float | None = None, sliding_window: int | None = None,
                    s_aux: torch.Tensor | None = None, cu_seq_lens_q: torch.Tensor | None = None,
                    cu_seq_lens_k: torch.Tensor | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """(out (1, Tq, H, Dv), None) for the packed requests; see the module docstring."""
    if cu_seq_lens_q is None or cu_seq_lens_k is None:
        return hf_attention(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                            softcap=softcap, sliding_window=sliding_window, s_aux=s_aux, **kwargs)
    if query.shape[0] != 1 or key.shape[0] != 1:
        raise AttentionError(f"packed requests come as one sequence (batch 1); got query {tuple(query.shape)}, "
                             f"key {tuple(key.shape)}.")
    starts_q, starts_k = cu_seq_lens_q.tolist(), cu_seq_lens_k.tolist()  # host values, once per call
    if len(starts_q) != len(starts_k) or starts_q[-1] > query.shape[2] or starts_k[-1] > key.shape[2]:
        raise AttentionError(f"cu_seq_lens_q {starts_q} and cu_seq_lens_k {starts_k} must list the same requests "
                             f"within {query.shape[2]} queries and {key.shape[2]} keys.")
    causal = kwargs.get("is_causal")
    causal = getattr(module, "is_causal", True) if causal is None else causal
    mask = _request_mask(bool(causal), sliding_window)
    sinks = s_aux if s_aux is not None else getattr(module, "sinks", None)
    out = query.new_zeros(1, query.shape[2], query.shape[1], value.shape[-1])  # (1, Tq, H, Dv)
    for r in range(len(starts_q) - 1):
        q0, q1, k0, k1 = starts_q[r], starts_q[r + 1], starts_k[r], starts_k[r + 1]
        if q1 == q0:
            continue
        if k1 - k0 < q1 - q0:
            raise AttentionError(f"request {r} has {q1 - q0} queries but only {k1 - k0} keys (its own included).")
        part = attention(query[:, :, q0:q1], key[:, :, k0:k1], value[:, :, k0:k1], mask, scale=scaling,
                         softcap=softcap, sinks=sinks, dropout=float(dropout))  # (1, H, Lq, Dv)
        out[:, q0:q1] = part.transpose(1, 2)
    return out, None


def _request_mask(causal: bool, sliding_window: int | None) -> Mask | None:
    """Within one request: causal bottom-right (its last query at its last key), with its sliding window."""
    if not causal:
        return None
    mask = Mask.causal("bottom_right")
    return mask if not sliding_window else mask & Mask.window(int(sliding_window), "bottom_right")


def use_paged(model: torch.nn.Module) -> torch.nn.Module:
    """Run `model`'s attention through `paged_attention` (PAGED), for generate_batch; returns the model."""
    config = getattr(model, "config", None)
    if config is None or not hasattr(config, "_attn_implementation"):
        raise AttentionError(f"use_paged takes a transformers model (one with a config); got {type(model).__name__}.")
    seen = set()
    for sub in (model, *model.modules()):
        cfg = getattr(sub, "config", None)
        if cfg is not None and id(cfg) not in seen and hasattr(cfg, "_attn_implementation_internal"):
            seen.add(id(cfg))
            cfg._attn_implementation_internal = PAGED
    return model


