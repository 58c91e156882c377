"""Document 003: labml's sequence-first multi-head attention written with ``einsum``.

Everything is **sequence-first**: inputs ``(L, B, d_model)``. ``PrepareForMultiHeadAttention`` is a
linear layer followed by ``view(*head_shape, heads, d_k)``, so projected tensors are ``(L, B, H, d_k)``.
The scores are ``einsum('ibhd,jbhd->ijbh', query, key)``: for each batch b and head h, the dot product
(summed over d) of query position i with key position j, giving ``(Lq, Lk, B, H)``. Because the key
axis j is dim 1, the softmax is ``nn.Softmax(dim=1)``. The value projection always has a bias (even
with ``bias=False``), and the last attention weights are kept in ``self.attn`` for inspection.

Mask convention (掩码): shape ``(Lq, Lk, B)``; dims 0 (Lq) and 2 (B) may be 1 and then broadcast
(广播); **0 = blocked**, filled with ``-inf`` (a fully blocked query row therefore gives NaN, as in
the document). In multihead: ``Mask.keep(m.permute(2, 0, 1).unsqueeze(1))`` (to ``(B, 1, Lq, Lk)``).

The document's ``tracker.debug('attn', attn)`` (labml's logger) is left out: this file needs no labml.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from multihead.errors import AttentionError, shape_str
from multihead.textbook._checks import check_features, check_heads_divide, check_same_dims


class PrepareForMultiHeadAttention(nn.Module):
    """Linear projection then split into heads: x (..., d_model) -> (..., heads, d_k)."""

    def __init__(self, d_model: int, heads: int, d_k: int, bias: bool):
        super().__init__()
        self.linear = nn.Linear(d_model, heads * d_k, bias=bias)  # all heads in one matrix
        self.heads = heads
        self.d_k = d_k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (L, B, d_model) or (B, d_model) -> (L, B, heads, d_k) or (B, heads, d_k)."""
        head_shape = x.shape[:-1]  # every dim except the features, e.g. (L, B)
        x = self.linear(x)  # (..., d_model) -> (..., heads * d_k)
        return x.view(*head_shape, self.heads, self.d_k)  # (..., heads * d_k) -> (..., heads, d_k)


class SeqFirstEinsumHeads(nn.Module):
    """Document 003's (labml) attention. query (Lq, B, d_model), key/value (Lk, B, d_model) -> (Lq, B, d_model)."""

    def __init__(self, heads: int, d_model: int, dropout_prob: float = 0.1, bias: bool = True):
        super().__init__()
        self.d_k = check_heads_divide(d_model, heads, "d_model")  # each head's size
        self.heads = heads
        # Projections to (L, B, H, d_k); note value always has a bias, whatever `bias` says.
        self.query = PrepareForMultiHeadAttention(d_model, heads, self.d_k, bias=bias)
        self.key = PrepareForMultiHeadAttention(d_model, heads, self.d_k, bias=bias)
        self.value = PrepareForMultiHeadAttention(d_model, heads, self.d_k, bias=True)
        # Scores are (Lq, Lk, B, H): the keys are dim 1, so that is where each row sums to 1.
        self.softmax = nn.Softmax(dim=1)
        self.output = nn.Linear(d_model, d_model)  # output projection, same shape in as out
        self.dropout = nn.Dropout(dropout_prob)
        self.scale = 1 / math.sqrt(self.d_k)  # applied to the scores before the softmax
        self.attn = None  # last attention weights (Lq, Lk, B, H), detached, for logging/plots

    def get_score(self, query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
        """query (Lq, B, H, d), key (Lk, B, H, d) -> scores (Lq, Lk, B, H), summed over d."""
        return torch.einsum("ibhd,jbhd->ijbh", query, key)

    def prepare_mask(self, mask: torch.Tensor, query_shape, key_shape) -> torch.Tensor:
        """mask (Lq or 1, Lk, B or 1) -> (Lq or 1, Lk, B or 1, 1): the same mask for every head.

        ``query_shape`` is ``(Lq, B, d_model)`` and ``key_shape`` is ``(Lk, B, d_model)``. The document
        checks three things with ``assert``; here each raises ``AttentionError`` instead.
        """
        expected = f"(Lq={query_shape[0]} or 1, Lk={key_shape[0]}, B={query_shape[1]} or 1)"
        if not isinstance(mask, torch.Tensor) or mask.dim() != 3:
            got = shape_str(mask.shape) if isinstance(mask, torch.Tensor) else type(mask).__name__
            raise AttentionError(f"mask must have 3 dims {expected}, got {got}")
        # assert 1: dim 0 is the QUERY positions: one row per query, or 1 to share one row with all.
        # (The document's walkthrough calls this dim the batch; it is the query length.)
        if mask.shape[0] not in (1, query_shape[0]):
            raise AttentionError(
                f"mask dim 0 must be the query length Lq={query_shape[0]} or 1, "
                f"got mask {shape_str(mask.shape)}; expected {expected}")
        # assert 2: dim 1 is the KEY positions: it must match the key length exactly (no broadcast).
        if mask.shape[1] != key_shape[0]:
            raise AttentionError(
                f"mask dim 1 must be the key length Lk={key_shape[0]}, "
                f"got mask {shape_str(mask.shape)}; expected {expected}")
        # assert 3: dim 2 is the BATCH: one mask per sequence, or 1 to share it across the batch.
        # (query_shape[1] is B because the input is sequence-first.)
        if mask.shape[2] not in (1, query_shape[1]):
            raise AttentionError(
                f"mask dim 2 must be the batch size B={query_shape[1]} or 1, "
                f"got mask {shape_str(mask.shape)}; expected {expected}")
        # (Lq, Lk, B) -> (Lq, Lk, B, 1): the trailing 1 broadcasts over the heads.
        return mask.unsqueeze(-1)

    def forward(self, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        """query (Lq, B, d_model), key/value (Lk, B, d_model); mask (Lq, Lk, B), 0 = blocked.

        The document always passes ``mask`` (``None`` for no mask); here it may also be left out, and
        every argument may be given by keyword, as labml's own module takes them.
        """
        d_model = self.heads * self.d_k
        for name, t in (("query", query), ("key", key), ("value", value)):
            check_features(t, name, 3, "(L, B, d_model)", d_model)
        check_same_dims(query, "query", key, "key", (1,), "batch size (dim 1, sequence-first)")
        check_same_dims(key, "key", value, "value", (0, 1), "length and batch size")

        seq_len, batch_size, _ = query.shape
        if mask is not None:
            mask = self.prepare_mask(mask, query.shape, key.shape)  # (Lq, Lk, B, 1)

        query = self.query(query)  # (Lq, B, H, d_k)
        key = self.key(key)  # (Lk, B, H, d_k)
        value = self.value(value)  # (Lk, B, H, d_k)

        scores = self.get_score(query, key)  # (Lq, Lk, B, H)
        scores *= self.scale  # divide by sqrt(d_k)

        if mask is not None:
            scores = scores.masked_fill(mask == 0, float("-inf"))
        attn = self.softmax(scores)  # (Lq, Lk, B, H), sums to 1 over Lk (dim 1)
        attn = self.dropout(attn)

        # Weighted sum over the keys j: (Lq, Lk, B, H) x (Lk, B, H, d) -> (Lq, B, H, d).
        x = torch.einsum("ijbh,jbhd->ibhd", attn, value)
        self.attn = attn.detach()  # keep the last weights (after dropout, as the document does)
        x = x.reshape(seq_len, batch_size, -1)  # merge heads: (Lq, B, H, d) -> (Lq, B, d_model)
        return self.output(x)
