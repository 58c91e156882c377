"""Document 001: stacked heads (堆叠实现) versus weight split (权重分割实现).

The document builds multi-head attention twice on top of a causal single-head ``CausalAttention``:

* ``StackedHeads`` (the document's ``MultiHeadAttentionStack``): ``num_heads`` independent heads in an
  ``nn.ModuleList``, run one after the other, outputs concatenated: ``(B, L, num_heads * dim_out)``.
  No output projection.
* ``SplitHeads`` (the document's ``MultiHeadAttention``): one big ``Wq / Wk / Wv`` of ``dim_out``
  features, cut into heads with ``view`` + ``transpose`` so every head runs in one batched matmul,
  then an output projection ``Wo``. Output ``(B, L, dim_out)``.

The lesson: stacking head h's ``W_query`` (dim_out_h rows each) on top of each other gives exactly the
big ``Wq`` of the split version; split is the same maths done in one pass instead of ``num_heads``.

Mask convention (因果掩码): a registered buffer ``mask = triu(ones(context_length, context_length), 1)``;
its 1s (future tokens) are filled with ``-inf`` before the softmax. Inputs may be shorter than
``context_length`` (the buffer is cut to ``[:L, :L]``). In multihead: ``Mask.causal()`` (``causal=True``).
Dropout is applied to the attention weights.

Layers are created in the document's order, so ``torch.manual_seed(123)`` gives the document's numbers.
"""

from __future__ import annotations

import torch
from torch import nn

from multihead.errors import AttentionError
from multihead.textbook._checks import check_features, check_heads_divide, check_num_heads


def _check_tokens(x: torch.Tensor, dim_in: int, context_length: int) -> None:
    """x must be (B, L, dim_in) with L <= context_length (the causal buffer's size)."""
    check_features(x, "x", 3, "(B, L, dim_in)", dim_in)
    if x.shape[1] > context_length:
        raise AttentionError(
            f"x has {x.shape[1]} tokens but context_length is {context_length}: "
            f"the causal mask buffer only covers {context_length} tokens"
        )


class CausalAttention(nn.Module):
    """One causal attention head (the previous article's). x (B, L, dim_in) -> (B, L, dim_out)."""

    def __init__(self, dim_in: int, dim_out: int, context_length: int, dropout_rate: float,
                 qkv_bias: bool = False):
        super().__init__()
        self.d_out = dim_out
        # Created in this order (query, key, value): the random initial weights depend on it.
        self.W_query = nn.Linear(dim_in, dim_out, bias=qkv_bias)
        self.W_key = nn.Linear(dim_in, dim_out, bias=qkv_bias)
        self.W_value = nn.Linear(dim_in, dim_out, bias=qkv_bias)
        self.dropout = nn.Dropout(dropout_rate)
        # (context_length, context_length), 1 above the diagonal = a future token.
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, L, dim_in) -> context vectors (B, L, dim_out)."""
        _check_tokens(x, self.W_query.in_features, self.mask.shape[0])
        b, num_tokens, dim_in = x.shape
        keys = self.W_key(x)  # (B, L, dim_out)
        queries = self.W_query(x)  # (B, L, dim_out)
        values = self.W_value(x)  # (B, L, dim_out)

        # (B, L, dim_out) @ (B, dim_out, L) -> (B, L, L); future tokens get -inf.
        attn_scores = queries @ keys.transpose(1, 2)
        attn_scores.masked_fill_(self.mask.bool()[:num_tokens, :num_tokens], -torch.inf)
        attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)
        attn_weights = self.dropout(attn_weights)

        return attn_weights @ values  # (B, L, L) @ (B, L, dim_out) -> (B, L, dim_out)


class StackedHeads(nn.Module):
    """Document 001's ``MultiHeadAttentionStack``. x (B, L, dim_in) -> (B, L, num_heads * dim_out)."""

    def __init__(self, dim_in: int, dim_out: int, context_length: int, dropout_rate: float,
                 num_heads: int):
        super().__init__()
        check_num_heads(num_heads)
        # num_heads complete single heads, each with its own W_query / W_key / W_value.
        multi_attens = [CausalAttention(dim_in, dim_out, context_length, dropout_rate)
                        for _ in range(num_heads)]
        self.heads = nn.ModuleList(multi_attens)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Run every head in turn (串行), then concatenate: num_heads x (B, L, dim_out) -> (B, L, H * dim_out)."""
        context_vecs = [head(x) for head in self.heads]
        return torch.concat(context_vecs, dim=-1)


class SplitHeads(nn.Module):
    """Document 001's weight-split ``MultiHeadAttention``. x (B, L, dim_in) -> (B, L, dim_out)."""

    def __init__(self, dim_in: int, dim_out: int, context_length: int, dropout_rate: float,
                 num_heads: int, qkv_bias: bool = False):
        super().__init__()
        self.dim_out = dim_out
        self.num_heads = num_heads
        self.head_dim = check_heads_divide(dim_out, num_heads, "dim_out")  # each head's size

        # One big matrix each; head h owns output features [h * head_dim, (h + 1) * head_dim).
        self.Wq = nn.Linear(dim_in, dim_out, bias=qkv_bias)
        self.Wk = nn.Linear(dim_in, dim_out, bias=qkv_bias)
        self.Wv = nn.Linear(dim_in, dim_out, bias=qkv_bias)
        self.Wo = nn.Linear(dim_out, dim_out)  # output projection (common in LLMs, not required)
        self.dropout = nn.Dropout(dropout_rate)

        # (context_length, context_length), 1 above the diagonal = a future token.
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (B, L, dim_in) -> (B, L, dim_out), all heads in one batched matmul."""
        _check_tokens(x, self.Wq.in_features, self.mask.shape[0])
        b, num_tokens, dim_in = x.shape
        q = self.Wq(x)  # (B, L, dim_out)
        k = self.Wk(x)
        v = self.Wv(x)

        # Split (分割): (B, L, dim_out) -> (B, L, H, head_dim).
        q = q.view(b, num_tokens, self.num_heads, self.head_dim)
        k = k.view(b, num_tokens, self.num_heads, self.head_dim)
        v = v.view(b, num_tokens, self.num_heads, self.head_dim)

        # Heads before tokens so all heads are one batch: (B, L, H, d) -> (B, H, L, d).
        q = q.transpose(1, 2)
        k = k.transpose(1, 2)
        v = v.transpose(1, 2)

        # (B, H, L, d) @ (B, H, d, L) -> (B, H, L, L); future tokens get -inf.
        atten_scores = q @ k.transpose(2, 3)
        atten_scores.masked_fill_(self.mask.bool()[:num_tokens, :num_tokens], -torch.inf)
        atten_weights = torch.softmax(atten_scores / k.shape[-1] ** 0.5, dim=-1)
        atten_weights = self.dropout(atten_weights)

        context_vecs = atten_weights @ v  # (B, H, L, d)
        context_vecs = context_vecs.transpose(1, 2)  # (B, L, H, d), no longer contiguous
        # contiguous() copies into memory order so that view may merge (H, d) -> dim_out.
        context_vecs = context_vecs.contiguous().view(b, num_tokens, self.dim_out)  # (B, L, dim_out)
        return self.Wo(context_vecs)
