"""MultiheadAttention: torch.nn.MultiheadAttention's class, with forward computed by multihead.

See the package docstring (multihead.compat) for what is the same as torch and what is not.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from multihead.attention import attention
from multihead.backends.with_weights import attention_with_weights
from multihead.compat.checks import check_call, check_construction
from multihead.compat.errors import CompatAssertionError, CompatRuntimeError
from multihead.compat.masks import torch_masks_to_mask

__all__ = ["MultiheadAttention"]


class MultiheadAttention(nn.MultiheadAttention):
    """Drop-in torch.nn.MultiheadAttention running on multihead's backends; see multihead.compat."""

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim: int | None = None,
                 vdim: int | None = None, batch_first: bool = False, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        check_construction(embed_dim, num_heads)
        super().__init__(embed_dim, num_heads, dropout=dropout, bias=bias, add_bias_kv=add_bias_kv,
                         add_zero_attn=add_zero_attn, kdim=kdim, vdim=vdim, batch_first=batch_first,
                         device=device, dtype=dtype)

    def forward(self, query: Tensor, key: Tensor, value: Tensor, key_padding_mask: Tensor | None = None,
                need_weights: bool = True, attn_mask: Tensor | None = None, average_attn_weights: bool = True,
                is_causal: bool = False) -> tuple[Tensor, Tensor | None]:
        """(out, weights or None), as torch.nn.MultiheadAttention.forward; see multihead.compat."""
        if any(isinstance(t, Tensor) and t.is_nested for t in (query, key, value)):
            return self._nested_forward(query, key, value, key_padding_mask, need_weights, attn_mask,
                                        average_attn_weights, is_causal)
        call = check_call(self, query, key, value, key_padding_mask, attn_mask, need_weights, is_causal)
        shared = (query is key, key is value)  # self-attention projects once, as torch does
        q_in, k_in, v_in = (self._batch_first(t, call.unbatched) for t in (query, key, value))  # (B, L or S, .)
        q, k, v = self._project(q_in, k_in, v_in, *shared)  # (B, L, E), (B, S, E), (B, S, E)
        k, v = self._append_extra_keys(k, v)  # (B, S + extra, E)
        extra = k.shape[1] - call.S
        mask = torch_masks_to_mask(attn_mask, key_padding_mask, call, self.num_heads, extra)
        q, k, v = (t.unflatten(-1, (self.num_heads, self.head_dim)).transpose(1, 2) for t in (q, k, v))  # (B, H, ., D)
        dropout = self.dropout if self.training else 0.0
        weights = None
        if need_weights:
            out, weights = attention_with_weights(q, k, v, mask, dropout=dropout)  # (B, H, L, D), (B, H, L, S')
            weights = weights.to(out.dtype)
            weights = weights.mean(dim=1) if average_attn_weights else weights
            weights = weights[0] if call.unbatched else weights
        else:
            out = attention(q, k, v, mask, dropout=dropout)  # (B, H, L, D)
        out = self.out_proj(out.transpose(1, 2).reshape(call.B, call.L, self.embed_dim))  # (B, L, E)
        if call.unbatched:
            return out[0], weights
        return (out if self.batch_first else out.transpose(0, 1)), weights

    def __prepare_scriptable__(self):
        """torch.jit.script calls this first: refuse with one clear error (TorchScript cannot run multihead)."""
        raise CompatRuntimeError(
            "torch.jit.script cannot compile multihead.compat.MultiheadAttention: its attention is Python code "
            "(multihead's Mask and backend dispatch) that TorchScript does not support. Use torch.compile(model) "
            "or torch.export.export(model, args) instead; both run it. To get a TorchScript program, script a "
            "torch.nn.MultiheadAttention holding the same state dict (load_state_dict works both ways).")

    # ------------------------------------------------------------------ steps of forward
    def _batch_first(self, t: Tensor, unbatched: bool) -> Tensor:
        """(L, E), (L, B, E) or (B, L, E) -> (B, L, E)."""
        if unbatched:
            return t[None]
        return t if self.batch_first else t.transpose(0, 1)

    def _project(self, q_in, k_in, v_in, query_is_key: bool, key_is_value: bool):
        """The three input projections (B, L or S, E), grouped into one product where torch groups them."""
        E = self.embed_dim
        if not self._qkv_same_embed_dim:
            biases = (None,) * 3 if self.in_proj_bias is None else self.in_proj_bias.chunk(3)
            weights = (self.q_proj_weight, self.k_proj_weight, self.v_proj_weight)
            return tuple(_linear(x, w, b) for x, w, b in zip((q_in, k_in, v_in), weights, biases))
        w, b = self.in_proj_weight, self.in_proj_bias
        if query_is_key and key_is_value:
            return _linear(q_in, w, b).chunk(3, dim=-1)
        w_q, w_kv = w.split([E, 2 * E])
        b_q, b_kv = (None, None) if b is None else b.split([E, 2 * E])
        if key_is_value:
            return (_linear(q_in, w_q, b_q), *_linear(k_in, w_kv, b_kv).chunk(2, dim=-1))
        w_k, w_v = w_kv.chunk(2)
        b_k, b_v = (None, None) if b_kv is None else b_kv.chunk(2)
        return _linear(q_in, w_q, b_q), _linear(k_in, w_k, b_k), _linear(v_in, w_v, b_v)

    def _append_extra_keys(self, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """add_bias_kv appends the learned key bias_k / value bias_v, then add_zero_attn a zero key and value,
        to every sequence, after the projections: (B, S, E) -> (B, S + extra, E), as torch does."""
        B = k.shape[0]
        if self.bias_k is not None:
            k = torch.cat([k, self.bias_k.to(k.dtype).expand(B, 1, -1)], dim=1)
            v = torch.cat([v, self.bias_v.to(v.dtype).expand(B, 1, -1)], dim=1)
        if self.add_zero_attn:
            k = torch.cat([k, k.new_zeros(B, 1, k.shape[-1])], dim=1)
            v = torch.cat([v, v.new_zeros(B, 1, v.shape[-1])], dim=1)
        return k, v

    def _nested_forward(self, *args) -> tuple[Tensor, Tensor | None]:
        """Nested inputs go where torch sends them: its fused kernel when its fast path applies (eval,
        no grad, self-attention, batch_first ...), otherwise torch's AssertionError, here also an AttentionError."""
        try:
            return super().forward(*args)
        except AssertionError as error:
            raise CompatAssertionError(
                f"{error} multihead runs padded batches: pass a padded tensor (torch.nested.to_padded_tensor) "
                "with a key_padding_mask instead of a nested tensor.") from error


def _linear(x: Tensor, w: Tensor, b: Tensor | None) -> Tensor:
    """x @ w.T + b; a bias of another dtype (a half bias with a double x) is promoted as torch's matmul path does."""
    if b is None or b.dtype == x.dtype or torch.is_autocast_enabled(x.device.type):
        return F.linear(x, w, b)
    return F.linear(x, w) + b
