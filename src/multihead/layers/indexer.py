"""The lightning indexer of DeepSeek Sparse Attention: which keys each query attends to.

Shape legend: B batch, Lq queries, Lk keys, E embed_dim, Cq q_lora_rank, Hi indexer heads, Di indexer
head dim, R rotary features, K top-k.

Attention over every key costs Lq · Lk. The indexer scores every key far more cheaply, with a few small
heads that share one key per token, and the attention then reads only each query's top K keys:

    q_h   = wq_b(c_q) per head, turned by RoPE        (B, Lq, Hi, Di)   c_q: the layer's low-rank query
    k     = RoPE(k_norm(wk(x)))                        (B, Lk, Di)       one key per token, cached
    w_h   = weights_proj(x) / sqrt(Hi)                 (B, Lq, Hi)       how much each head counts
    score = sum_h w_h · ReLU(q_h · k / sqrt(Di))       (B, Lq, Lk)
    keys  = top_K(score) among the keys the query may see, -1 where fewer exist

RoPE turns the first R of the Di features (DeepSeek V3.2 pairs them half-split, GLM-MoE-DSA
interleaved). DeepSeek V4's `BlockIndexer` scores compressed blocks of m tokens instead of tokens: its
keys are a BlockCompressor's entries (the last R features turned), and query i may pick block w only
once the block is complete, w < (i + 1) // m. Scores are computed in float32, as transformers does.
"""
from __future__ import annotations

import torch
from torch import nn

from multihead.layers.compressor import BlockCompressor, Compressed, CompressorState, turn_trailing
from multihead.errors import AttentionError
from multihead.masks import Mask
from multihead.positions import RoPE

SCORE_BUDGET = 1 << 24  # float32 per-head scores of one block of queries (B · block · Hi · Lk)


def select_keys(q: torch.Tensor, keys: torch.Tensor, weights: torch.Tensor, scale: float,
                allowed: torch.Tensor | None, k: int) -> torch.Tensor:
    """Each query's k best keys: q (B, Lq, Hi, Di), keys (B, Lk, Di), weights (B, Lq, Hi), allowed bool
    (B|1, Lq, Lk) or None -> (B, Lq, min(k, Lk)) int64, -1 where fewer keys are allowed.

    score = sum over heads of weights · ReLU(q · k · scale), in float32, one block of queries at a time:
    a prefill never holds the Lq · Hi · Lk per-head scores, nor all Lq · Lk scores, at once."""
    B, Lq, Hi, _ = q.shape
    keys_t = keys.float().transpose(-1, -2).unsqueeze(1)  # (B, 1, Di, Lk)
    block = max(1, SCORE_BUDGET // max(1, B * Hi * keys.shape[1]))
    picked = []
    for s in range(0, Lq, block):
        per_head = torch.relu(torch.matmul(q[:, s:s + block].float(), keys_t) * scale)  # (B, b, Hi, Lk)
        scores = torch.matmul(weights[:, s:s + block].float().unsqueeze(-2), per_head).squeeze(-2)  # (B, b, Lk)
        picked.append(top_k_keys(scores, None if allowed is None else allowed[:, s:s + block], k))
    return picked[0] if len(picked) == 1 else torch.cat(picked, dim=1)


def top_k_keys(scores: torch.Tensor, allowed: torch.Tensor | None, k: int) -> torch.Tensor:
    """The k best keys per query among the allowed ones: scores (B, Lq, Lk), allowed bool broadcastable
    to it (None: all) -> (B, Lq, min(k, Lk)) int64, -1 in the slots left when fewer keys are allowed."""
    if allowed is not None:
        scores = scores.masked_fill(~allowed, float("-inf"))
    best = scores.topk(min(k, scores.shape[-1]), dim=-1)
    return torch.where(best.values == float("-inf"), -1, best.indices)


def allowed_keys(mask: Mask | None, causal: bool, B: int, Lq: int, Lk: int, device, dtype: torch.dtype):
    """(B, Lq, Lk) bool: the keys a mask (and causal=True, top-left) lets each query see, None when every
    key is allowed. A selection only keeps or drops keys, so a mask that adds finite scores (ALiBi, a soft
    additive mask) is refused; additive masks of 0 and the dtype's minimum (transformers') are blocks."""
    if causal:
        mask = Mask.causal() if mask is None else mask & Mask.causal()
    if mask is None:
        return None
    keep, bias = mask.materialize(B, 1, Lq, Lk, device=device, dtype=dtype)  # each broadcastable to (B, 1, Lq, Lk)
    allowed = torch.ones(B, 1, Lq, Lk, dtype=torch.bool, device=device) if keep is None else keep.expand(B, 1, Lq, Lk)
    if bias is not None:
        blocked = bias <= torch.finfo(bias.dtype).min / 2
        if not torch.compiler.is_compiling() and bool(((bias != 0) & ~blocked).any()):
            raise AttentionError(f"a sparse layer selects keys; its mask may keep or block keys but not add scores "
                                 f"to them; got {mask!r} with finite non-zero values.")
        allowed = allowed & ~blocked
    return allowed[:, 0]


class LightningIndexer(nn.Module):
    """DeepSeek V3.2's indexer with transformers' weight names: wq_b (Cq -> Hi·Di), wk (E -> Di),
    k_norm (LayerNorm over Di), weights_proj (E -> Hi).

    embed_dim E, q_lora_rank Cq (the indexer reads the attention's normalised low-rank query), num_heads
    Hi, head_dim Di, top_k K. rope: an mh.RoPE over Di turning its first rotary_dim features (default
    RoPE(Di, rotary_dim=Di), half-split as DeepSeek V3.2). norm_eps: k_norm's epsilon.
    """

    def __init__(self, embed_dim: int, q_lora_rank: int, num_heads: int, head_dim: int, top_k: int, *,
                 rope: RoPE | None = None, norm_eps: float = 1e-6, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        for name, value in (("embed_dim", embed_dim), ("q_lora_rank", q_lora_rank), ("num_heads", num_heads),
                            ("head_dim", head_dim), ("top_k", top_k)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise AttentionError(f"LightningIndexer {name} must be a positive int; got {value!r}.")
        rope = RoPE(head_dim, device=device) if rope is None else rope
        if not isinstance(rope, RoPE) or rope.head_dim != head_dim:
            raise AttentionError(f"LightningIndexer rope must be an mh.RoPE over head_dim={head_dim} features; "
                                 f"got {rope!r}.")
        self.embed_dim, self.q_lora_rank, self.num_heads, self.head_dim, self.top_k = (
            embed_dim, q_lora_rank, num_heads, head_dim, top_k)
        factory = {"device": device, "dtype": dtype}
        self.wq_b = nn.Linear(q_lora_rank, num_heads * head_dim, bias=False, **factory)
        self.wk = nn.Linear(embed_dim, head_dim, bias=False, **factory)
        self.k_norm = nn.LayerNorm(head_dim, eps=norm_eps, **factory)
        self.weights_proj = nn.Linear(embed_dim, num_heads, bias=False, **factory)
        self.rope = rope

    def project(self, x: torch.Tensor, q_resid: torch.Tensor, positions: torch.Tensor):
        """x (B, L, E), q_resid (B, L, Cq), positions (L,) or (B, L) -> queries (B, L, Hi, Di), keys
        (B, L, Di) (what a cache keeps) and head weights (B, L, Hi), queries and keys turned by RoPE."""
        B, L, _ = x.shape
        q = self.wq_b(q_resid).view(B, L, self.num_heads, self.head_dim).transpose(1, 2)  # (B, Hi, L, Di)
        k = self.k_norm(self.wk(x))[:, None]  # (B, 1, L, Di)
        q, k = self.rope(q, k, positions)
        weights = self.weights_proj(x).float() * self.num_heads ** -0.5  # (B, L, Hi)
        return q.transpose(1, 2), k[:, 0], weights

    def select(self, queries: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor,
               allowed: torch.Tensor | None) -> torch.Tensor:
        """queries (B, Lq, Hi, Di) and weights (B, Lq, Hi) from `project`, keys (B, Lk, Di) (all the keys,
        cached ones included), allowed (B|1, Lq, Lk) bool (causal and not padding) -> (B, Lq, min(K, Lk))
        int64 key indices, -1 where fewer keys are allowed."""
        return select_keys(queries, keys, weights, self.head_dim ** -0.5, allowed, self.top_k)

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, head_dim={self.head_dim}, top_k={self.top_k}"


class BlockIndexer(nn.Module):
    """DeepSeek V4's indexer of compressed-sparse layers: picks each query's top-k blocks among the
    complete ones. Weights: compressor (a BlockCompressor with overlap, at Di), q_b_proj (Cq -> Hi·Di),
    weights_proj (E -> Hi).

    embed_dim E, q_lora_rank Cq, num_heads Hi, head_dim Di, top_k K, rate m. rope: an mh.RoPE over the R
    trailing features of Di (the compressed layer's own). norm_eps: the compressor's norm epsilon.
    """

    def __init__(self, embed_dim: int, q_lora_rank: int, num_heads: int, head_dim: int, top_k: int, rate: int, *,
                 rope: RoPE, norm_eps: float = 1e-6, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        for name, value in (("q_lora_rank", q_lora_rank), ("num_heads", num_heads), ("top_k", top_k)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise AttentionError(f"BlockIndexer {name} must be a positive int; got {value!r}.")
        self.num_heads, self.head_dim, self.top_k, self.rate = num_heads, head_dim, top_k, rate
        factory = {"device": device, "dtype": dtype}
        self.compressor = BlockCompressor(embed_dim, head_dim, rate, overlap=True, rope=rope, norm_eps=norm_eps,
                                          **factory)
        self.q_b_proj = nn.Linear(q_lora_rank, num_heads * head_dim, bias=False, **factory)
        self.weights_proj = nn.Linear(embed_dim, num_heads, bias=False, **factory)

    def forward(self, x: torch.Tensor, q_resid: torch.Tensor, start: int = 0,
                state: CompressorState | None = None) -> tuple[torch.Tensor, Compressed]:
        """x (B, L, E), the tokens at positions start ... start + L - 1 (after the `state`'s tokens),
        q_resid (B, L, Cq) -> (block indices (B, L, min(K, N)), -1 for none; the compressor's result,
        which the caller commits to the state)."""
        B, L, _ = x.shape
        positions = start + torch.arange(L, device=x.device)  # (L,)
        blocks = self.compressor(x, state, start)
        q = self.q_b_proj(q_resid).view(B, L, self.num_heads, self.head_dim).transpose(1, 2)  # (B, Hi, L, Di)
        q = turn_trailing(q, self.compressor.rope, positions).transpose(1, 2)  # (B, L, Hi, Di)
        weights = self.weights_proj(x).float() * self.num_heads ** -0.5  # (B, L, Hi)
        complete = complete_blocks(positions, blocks.entries.shape[1], self.rate)[None]  # (1, L, N)
        return select_keys(q, blocks.entries, weights, self.head_dim ** -0.5, complete, self.top_k), blocks

    def extra_repr(self) -> str:
        return f"num_heads={self.num_heads}, head_dim={self.head_dim}, top_k={self.top_k}, rate={self.rate}"


def complete_blocks(positions: torch.Tensor, N: int, rate: int) -> torch.Tensor:
    """positions (L,) -> (L, N) bool: block w (tokens w·m ... w·m + m - 1) is complete at each position."""
    return torch.arange(N, device=positions.device) < ((positions + 1) // rate)[:, None]  # (L, N)
