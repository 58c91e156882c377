"""Document 004: d2l's multi-head attention, heads folded into the batch.

``MultiHeadAttention(key_size, query_size, value_size, num_hiddens, num_heads, dropout, bias=False)``
with ``W_q / W_k / W_v / W_o`` (no bias by default). Where does "multi-head" live (多头体现在哪里)?
In ``transpose_qkv``: the projected ``(B, L, num_hiddens)`` is cut into heads and the heads are folded
into the batch, ``(B * H, L, num_hiddens / H)``, so the ordinary single-head ``DotProductAttention``
(``torch.bmm``) runs every head of every sequence at once. ``transpose_output`` unfolds it again.
The element count is unchanged (B * L * num_hiddens both ways), and for a fixed ``num_hiddens`` the
parameter count does not depend on ``num_heads``: the heads share out the same four matrices.

Mask convention (有效长度): ``valid_lens`` of shape ``(B,)`` (keys ``j < valid_lens[b]`` are kept for
every query) or ``(B, Lq)`` (one length per query). It is repeated per head with
``repeat_interleave`` (head order matches the folding: sequence b's heads are rows b*H .. b*H+H-1).
Masked scores are set to -1e6 before the softmax. In multihead: ``Mask.lengths(valid_lens)``.

``sequence_mask``, ``masked_softmax``, ``DotProductAttention``, ``transpose_qkv`` and
``transpose_output`` are d2l's helpers, which the document uses without showing.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from multihead.errors import AttentionError, shape_str
from multihead.textbook._checks import check_features, check_heads_divide, check_num_heads, check_same_dims


def sequence_mask(X: torch.Tensor, valid_len: torch.Tensor, value: float = 0) -> torch.Tensor:
    """X (N, Lk), valid_len (N,): set X[n, j] = value for j >= valid_len[n], in place; returns X."""
    maxlen = X.size(1)
    # (1, Lk) < (N, 1) -> (N, Lk), True where the key is inside the valid length.
    mask = torch.arange(maxlen, dtype=torch.float32, device=X.device)[None, :] < valid_len[:, None]
    X[~mask] = value
    return X


def _check_valid_lens(valid_lens, batch_size: int, num_queries: int) -> None:
    """valid_lens must be (B,) or (B, Lq) (d2l's two forms; B counts B * H rows once heads are folded)."""
    if not isinstance(valid_lens, torch.Tensor):
        raise AttentionError(f"valid_lens must be a torch.Tensor (B,) or (B, Lq), "
                             f"got {type(valid_lens).__name__}")
    if valid_lens.shape not in ((batch_size,), (batch_size, num_queries)):
        raise AttentionError(
            f"valid_lens must have shape (B,)=({batch_size},) or (B, Lq)=({batch_size}, {num_queries}), "
            f"got {shape_str(valid_lens.shape)}")


def masked_softmax(X: torch.Tensor, valid_lens: torch.Tensor | None) -> torch.Tensor:
    """Softmax over the last axis of X (N, Lq, Lk), keys beyond valid_lens (N,) or (N, Lq) excluded."""
    if valid_lens is None:
        return nn.functional.softmax(X, dim=-1)
    _check_valid_lens(valid_lens, X.shape[0], X.shape[1])
    shape = X.shape
    if valid_lens.dim() == 1:
        # One length per sequence, the same for each of its Lq queries: (N,) -> (N * Lq,).
        valid_lens = torch.repeat_interleave(valid_lens, shape[1])
    else:
        valid_lens = valid_lens.reshape(-1)  # one length per query: (N, Lq) -> (N * Lq,)
    # Rows of (N * Lq, Lk): masked keys get -1e6, so exp() makes them (practically) 0.
    X = sequence_mask(X.reshape(-1, shape[-1]), valid_lens, value=-1e6)
    return nn.functional.softmax(X.reshape(shape), dim=-1)


class DotProductAttention(nn.Module):
    """Scaled dot-product attention. queries (N, Lq, d), keys (N, Lk, d), values (N, Lk, dv) -> (N, Lq, dv)."""

    def __init__(self, dropout: float):
        super().__init__()
        self.dropout = nn.Dropout(dropout)
        self.attention_weights = None  # last weights (N, Lq, Lk), kept by d2l for plotting

    def forward(self, queries, keys, values, valid_lens=None):
        """valid_lens (N,) or (N, Lq): number of keys each query may see."""
        d = queries.shape[-1]
        # (N, Lq, d) bmm (N, d, Lk) -> (N, Lq, Lk)
        scores = torch.bmm(queries, keys.transpose(1, 2)) / math.sqrt(d)
        self.attention_weights = masked_softmax(scores, valid_lens)
        return torch.bmm(self.dropout(self.attention_weights), values)  # (N, Lq, dv)


def transpose_qkv(X: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Fold the heads into the batch: (B, L, num_hiddens) -> (B * H, L, num_hiddens / H)."""
    check_heads_divide(X.shape[-1], num_heads, "num_hiddens")
    X = X.reshape(X.shape[0], X.shape[1], num_heads, -1)  # (B, L, H, d)
    X = X.permute(0, 2, 1, 3)  # (B, H, L, d)
    return X.reshape(-1, X.shape[2], X.shape[3])  # (B * H, L, d)


def transpose_output(X: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Undo ``transpose_qkv``: (B * H, L, d) -> (B, L, H * d)."""
    check_num_heads(num_heads)
    if X.shape[0] % num_heads:
        raise AttentionError(f"transpose_output expects X (B * H, L, d) with dim 0 a multiple of "
                             f"num_heads={num_heads}, got {shape_str(X.shape)}")
    X = X.reshape(-1, num_heads, X.shape[1], X.shape[2])  # (B, H, L, d)
    X = X.permute(0, 2, 1, 3)  # (B, L, H, d)
    return X.reshape(X.shape[0], X.shape[1], -1)  # (B, L, H * d)


class FoldedBatchHeads(nn.Module):
    """Document 004's (d2l) attention. queries (B, Lq, query_size), keys/values (B, Lk, *) -> (B, Lq, num_hiddens)."""

    def __init__(self, key_size: int, query_size: int, value_size: int, num_hiddens: int,
                 num_heads: int, dropout: float, bias: bool = False, **kwargs):
        super().__init__(**kwargs)
        check_heads_divide(num_hiddens, num_heads, "num_hiddens")
        self.num_heads = num_heads
        self.attention = DotProductAttention(dropout)
        self.W_q = nn.Linear(query_size, num_hiddens, bias=bias)
        self.W_k = nn.Linear(key_size, num_hiddens, bias=bias)
        self.W_v = nn.Linear(value_size, num_hiddens, bias=bias)
        self.W_o = nn.Linear(num_hiddens, num_hiddens, bias=bias)

    def forward(self, queries, keys, values, valid_lens):
        """valid_lens (B,) or (B, Lq), or None: keys j < valid_lens are kept."""
        check_features(queries, "queries", 3, "(B, Lq, query_size)", self.W_q.in_features)
        check_features(keys, "keys", 3, "(B, Lk, key_size)", self.W_k.in_features)
        check_features(values, "values", 3, "(B, Lk, value_size)", self.W_v.in_features)
        check_same_dims(queries, "queries", keys, "keys", (0,), "batch size")
        check_same_dims(keys, "keys", values, "values", (0, 1), "batch size and length")
        if valid_lens is not None:
            _check_valid_lens(valid_lens, queries.shape[0], queries.shape[1])

        # (B, L, num_hiddens) -> (B * H, L, num_hiddens / H), for queries, keys and values.
        queries = transpose_qkv(self.W_q(queries), self.num_heads)
        keys = transpose_qkv(self.W_k(keys), self.num_heads)
        values = transpose_qkv(self.W_v(values), self.num_heads)

        if valid_lens is not None:
            # Copy each sequence's entry num_heads times, in a row: (B,) -> (B * H,), (B, Lq) -> (B * H, Lq).
            valid_lens = torch.repeat_interleave(valid_lens, repeats=self.num_heads, dim=0)

        output = self.attention(queries, keys, values, valid_lens)  # (B * H, Lq, num_hiddens / H)
        output_concat = transpose_output(output, self.num_heads)  # (B, Lq, num_hiddens)
        return self.W_o(output_concat)
