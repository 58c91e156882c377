"""mh.compat.MultiheadAttention: torch.nn.MultiheadAttention, with the attention computed by multihead.

    from multihead.compat import MultiheadAttention   # was: from torch.nn import MultiheadAttention

    attn = MultiheadAttention(embed_dim, num_heads, dropout=0.0, bias=True, kdim=None, vdim=None,
                              batch_first=False)
    out, weights = attn(query, key, value, key_padding_mask=None, need_weights=True, attn_mask=None,
                        average_attn_weights=True, is_causal=False)

Everything a caller of nn.MultiheadAttention relies on is the same: the constructor, the parameters
(`in_proj_weight` or `q_proj_weight`/`k_proj_weight`/`v_proj_weight`, `in_proj_bias`, `out_proj`),
so state dicts load both ways, and the call conventions:

- query (L, B, E) (B, L, E with batch_first=True, or (L, E) unbatched); key (S, B, kdim); value (S, B, vdim).
- masks: in a bool mask True means *blocked*; a float mask is added to the scores. attn_mask is
  (L, S) or (B*H, L, S); key_padding_mask is (B, S).
- is_causal=True is a hint that attn_mask *is* the causal mask, so attn_mask is required; where torch
  then drops attn_mask for its built-in causal mask (no key_padding_mask, need_weights=False), so does this.
- need_weights=True returns the weights the output was computed from (after dropout), averaged over
  heads (B, L, S), or per head (B, H, L, S) with average_attn_weights=False.

Differences: a query whose keys are all blocked gives 0 and all-zero weights, where torch gives 0 with
need_weights=False but NaN with need_weights=True. add_bias_kv and add_zero_attn (extra keys
appended to every sequence) raise AttentionError.

The class subclasses nn.MultiheadAttention, so isinstance checks still hold, and overrides forward:
the attention runs in `mh.attention` on multihead's backends (see `mh.dispatch`), the output
projection is called as a module. One torch path never calls forward at all: nn.TransformerEncoderLayer's
inference fast path (eval, no grad, batch_first) reads in_proj_weight and runs torch's fused kernel.
It computes the same thing; `torch.backends.mha.set_fastpath_enabled(False)` routes it through here.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from multihead.attention import attention
from multihead.attention_weights import attention_with_weights
from multihead.errors import AttentionError, shape_str
from multihead.masks import Mask

__all__ = ["MultiheadAttention"]


class MultiheadAttention(nn.MultiheadAttention):
    """Drop-in torch.nn.MultiheadAttention running on multihead's backends; see the module docstring."""

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim: int | None = None,
                 vdim: int | None = None, batch_first: bool = False, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        if add_bias_kv or add_zero_attn:
            raise AttentionError(
                "add_bias_kv=True and add_zero_attn=True append extra keys to every sequence, which multihead "
                "does not model; expected both False (use torch.nn.MultiheadAttention for them).")
        for name, value in (("embed_dim", embed_dim), ("num_heads", num_heads)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise AttentionError(f"{name} must be a positive int; got {value!r}.")
        if embed_dim % num_heads:
            raise AttentionError(f"embed_dim={embed_dim} must be divisible by num_heads={num_heads}.")
        super().__init__(embed_dim, num_heads, dropout=dropout, bias=bias, kdim=kdim, vdim=vdim,
                         batch_first=batch_first, device=device, dtype=dtype)

    def forward(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Tensor | None = None,
                need_weights: bool = True, attn_mask: Tensor | None = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> tuple[Tensor, Tensor | None]:
        """(out, weights or None), as torch.nn.MultiheadAttention.forward; see the module docstring."""
        unbatched = self._check_inputs(query, key, value)
        shared = (query is key, key is value)  # self-attention projects once, as torch does
        q_in, k_in, v_in = (self._batch_first(t, unbatched) for t in (query, key, value))  # (B, L or S, .)
        B, L, E = q_in.shape
        S = k_in.shape[1]
        mask = self._mask(attn_mask, key_padding_mask, is_causal, need_weights, B, L, S, unbatched)
        q, k, v = (t.unflatten(-1, (self.num_heads, self.head_dim)).transpose(1, 2)  # (B, H, L or S, D)
                   for t in self._project(q_in, k_in, v_in, *shared))
        dropout = self.dropout if self.training else 0.0
        weights = None
        if need_weights:
            out, weights = attention_with_weights(q, k, v, mask, dropout=dropout)  # (B, H, L, D), (B, H, L, S)
            weights = weights.to(query.dtype)
            weights = weights.mean(dim=1) if average_attn_weights else weights
            weights = weights[0] if unbatched else weights
        else:
            out = attention(q, k, v, mask, dropout=dropout)  # (B, H, L, D)
        out = self.out_proj(out.transpose(1, 2).reshape(B, L, E))  # (B, L, E)
        if unbatched:
            return out[0], weights
        return (out if self.batch_first else out.transpose(0, 1)), weights

    # ------------------------------------------------------------------ steps of forward
    def _check_inputs(self, query, key, value) -> bool:
        """Raise AttentionError unless the inputs fit; return whether they are unbatched."""
        for name, t in (("query", query), ("key", key), ("value", value)):
            if not isinstance(t, Tensor):
                raise AttentionError(f"{name} must be a torch.Tensor; got {type(t).__name__}.")
        unbatched = query.dim() == 2
        layout = "(L, features)" if unbatched else ("(B, L, features)" if self.batch_first else "(L, B, features)")
        for name, t, width in (("query", query, self.embed_dim), ("key", key, self.kdim), ("value", value, self.vdim)):
            if t.dim() != (2 if unbatched else 3) or t.shape[-1] != width:
                raise AttentionError(
                    f"{name} must be {layout} with {width} features (batch_first={self.batch_first}); "
                    f"got shape {shape_str(t.shape)}.")
        if key.shape[:-1] != value.shape[:-1]:
            raise AttentionError(f"key and value must agree on all but the last dim; got key "
                                 f"{shape_str(key.shape)} and value {shape_str(value.shape)}.")
        batch_dim = 0 if self.batch_first else 1
        if not unbatched and key.shape[batch_dim] != query.shape[batch_dim]:
            raise AttentionError(f"query has batch {query.shape[batch_dim]} but key/value have batch "
                                 f"{key.shape[batch_dim]}.")
        return unbatched

    def _batch_first(self, t: Tensor, unbatched: bool) -> Tensor:
        if unbatched:
            return t[None]
        return t if self.batch_first else t.transpose(0, 1)

    def _project(self, q_in, k_in, v_in, query_is_key: bool, key_is_value: bool):
        """The three input projections (B, L or S, E), grouped into one product where torch groups them."""
        E = self.embed_dim
        if not self._qkv_same_embed_dim:
            biases = (None,) * 3 if self.in_proj_bias is None else self.in_proj_bias.chunk(3)
            weights = (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)
            return tuple(F.linear(x, w, b) for x, w, b in zip((q_in, k_in, v_in), weights, biases))
        w, b = self.in_proj_weight, self.in_proj_bias
        if query_is_key and key_is_value:
            return F.linear(q_in, w, b).chunk(3, dim=-1)
        w_q, w_kv = w.split([E, 2 * E])
        b_q, b_kv = (None, None) if b is None else b.split([E, 2 * E])
        if key_is_value:
            return (F.linear(q_in, w_q, b_q), *F.linear(k_in, w_kv, b_kv).chunk(2, dim=-1))
        w_k, w_v = w_kv.chunk(2)
        b_k, b_v = (None, None) if b_kv is None else b_kv.chunk(2)
        return F.linear(q_in, w_q, b_q), F.linear(k_in, w_k, b_k), F.linear(v_in, w_v, b_v)

    def _mask(self, attn_mask, key_padding_mask, is_causal: bool, need_weights: bool, B: int, L: int, S: int,
              unbatched: bool) -> Mask | None:
        """torch's two masks (True = blocked, float = added) as one multihead Mask over (B, H, L, S)."""
        if not isinstance(is_causal, bool):
            raise AttentionError(f"is_causal must be True or False; got {is_causal!r}.")
        if is_causal and attn_mask is None:
            raise AttentionError(
                "is_causal=True is a hint that attn_mask is the causal mask, so attn_mask is required; got None. "
                "Pass attn_mask=nn.Transformer.generate_square_subsequent_mask(L) with it.")
        parts = []
        if attn_mask is not None:
            _check_mask_dtype(attn_mask, "attn_mask")
            if attn_mask.dim() == 2 and tuple(attn_mask.shape) == (L, S):
                pass
            elif attn_mask.dim() == 3 and tuple(attn_mask.shape) == (B * self.num_heads, L, S):
                attn_mask = attn_mask.view(B, self.num_heads, L, S)
            else:
                heads = f"{self.num_heads}" if unbatched else f"B*H={B * self.num_heads}"
                raise AttentionError(f"attn_mask must be (L, S) = ({L}, {S}) or ({heads}, L, S); "
                                     f"got {shape_str(attn_mask.shape)}.")
            if is_causal and key_padding_mask is None and not need_weights:
                parts.append(Mask.causal())  # torch trusts the hint here and uses its own causal mask
            else:
                parts.append(Mask.block(attn_mask) if attn_mask.dtype == torch.bool else Mask.additive(attn_mask))
        if key_padding_mask is not None:
            _check_mask_dtype(key_padding_mask, "key_padding_mask")
            expected = (S,) if unbatched else (B, S)
            if tuple(key_padding_mask.shape) != expected:
                raise AttentionError(f"key_padding_mask must be {'(S,)' if unbatched else '(B, S)'} = "
                                     f"{expected}; got {shape_str(key_padding_mask.shape)}.")
            pad = key_padding_mask.view(B, S)
            parts.append(Mask.key_padding(pad) if pad.dtype == torch.bool else Mask.additive(pad[:, None, None, :]))
        if not parts:
            return None
        return parts[0] if len(parts) == 1 else parts[0] & parts[1]


def _check_mask_dtype(mask, name: str) -> None:
    if not isinstance(mask, Tensor) or not (mask.dtype == torch.bool or mask.is_floating_point()):
        kind = mask.dtype if isinstance(mask, Tensor) else type(mask).__name__
        raise AttentionError(f"{name} must be a bool tensor (True = blocked) or a float tensor (added to the "
                             f"scores); got {kind}.")
