"""DeepSeek Sparse Attention (V3.2, GLM-5): a lightning indexer scores every key cheaply, each query keeps
its top-k keys, and MLA attends to those alone; what a decode step then costs, dense against sparse. The
teaching steps are plain torch, checked against mh.MultiHeadLatentAttention(indexer=...) and
attend_selected. DeepSeek V4's K = V head is told by shared_kv_trick.

Shapes: B batch, L tokens, Lq queries, Lk / N keys, H attention heads, Hi indexer heads, Di indexer head
dim, K top-k, C latent width, R rotary features, E embed dim.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

import multihead as mh
from multihead.explain.story import Story
from multihead.explain.topics.base import Say, diff_text, max_diff, topic
from multihead.explain.topics.decoding import flop_counts, nbytes
from multihead.explain.topics.models.shared_kv_head import tell_shared_kv
from multihead.layers.indexer import select_keys
from multihead.caches.latent import LatentCache
from multihead.layers.selected_attention import attend_selected

# DeepSeek V3.2's attention (transformers' DeepseekV32Config defaults): attention heads H, latent C, rotary R,
# indexer heads Hi of Di features, top-k K
V32 = {"H": 128, "C": 512, "R": 64, "Hi": 64, "Di": 128, "K": 2048}
CONTEXTS = (1024, 8192, 32768, 131072)   # keys N a decode step attends over, for the cost tables
MiB = 2 ** 20
SIZES = {name: f"{n:,}" for name, n in V32.items()}   # as the words print them: 2,048


def small_sparse_mla(top_k: int = 3) -> mh.MultiHeadLatentAttention:
    """A causal float64 MLA with a lightning indexer (4 heads of 8 features), small enough to print."""
    indexer = mh.LightningIndexer(32, 12, 4, 8, top_k, rope=mh.RoPE(8, rotary_dim=4), dtype=torch.float64)
    return mh.MultiHeadLatentAttention(32, 4, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=4, v_head_dim=8,
                                       q_lora_rank=12, causal=True, indexer=indexer, dtype=torch.float64).eval()


def index_scores_by_hand(q: torch.Tensor, k: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The indexer's score of every key for every query: q (B, Lq, Hi, Di), k (B, Lk, Di), w (B, Lq, Hi)
    -> (B, Lq, Lk) = sum over heads of w · ReLU(q · k / sqrt(Di)), in float32 as transformers does."""
    per_head = torch.relu(torch.einsum("bqhd,bkd->bqhk", q.float(), k.float()) / math.sqrt(q.shape[-1]))
    return torch.einsum("bqh,bqhk->bqk", w.float(), per_head)


def top_k_by_hand(scores: torch.Tensor, K: int) -> torch.Tensor:
    """Each query's K best keys among those up to itself: scores (B, L, L) -> (B, L, min(K, L)), -1 in the
    slots left when a query has fewer than K keys to choose from."""
    L = scores.shape[-1]
    future = torch.ones(L, L, dtype=torch.bool).triu(1)              # key j after query i
    best = scores.masked_fill(future, float("-inf")).topk(min(K, L), dim=-1)
    return torch.where(best.values == float("-inf"), -1, best.indices)


def attend_listed_by_hand(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Query by query, attention over the keys its list names (-1 skipped): q (B, H, Lq, D), k and v
    (B, 1, Lk, D), indices (B, Lq, K) -> (B, H, Lq, D)."""
    out = torch.zeros_like(q)
    for b in range(q.shape[0]):
        for i in range(q.shape[2]):
            listed = indices[b, i][indices[b, i] >= 0]                  # the query's keys, -1 dropped
            scores = q[b, :, i] @ k[b, 0, listed].T / math.sqrt(q.shape[-1])   # (H, n)
            out[b, :, i] = torch.softmax(scores, dim=-1) @ v[b, 0, listed]
    return out


def keep_of(indices: torch.Tensor, Lk: int) -> torch.Tensor:
    """The dense keep mask (B, 1, Lq, Lk) of index lists (B, Lq, K): True where a key is listed."""
    keep = torch.zeros(*indices.shape[:2], Lk + 1, dtype=torch.bool)
    keep.scatter_(-1, torch.where(indices >= 0, indices, Lk), True)      # -1 lands in a spare column
    return keep[:, None, :, :Lk]


@dataclass(frozen=True)
class StepCost:
    """One decode step of one query over N keys: multiply-adds counted by torch, bytes of what it reads."""

    index_macs: int
    attend_macs: int
    index_bytes: int
    attend_bytes: int

    @property
    def macs(self) -> int:
        return self.index_macs + self.attend_macs

    @property
    def bytes(self) -> int:
        return self.index_bytes + self.attend_bytes


def step_cost(N: int, sparse: bool, s: dict[str, int] = V32, dtype: torch.dtype = torch.bfloat16) -> StepCost:
    """The attention part of an absorbed MLA decode step over N cached keys, dense or sparse, at the sizes
    `s`. torch's FLOP counter counts the real calls on meta tensors (shapes only, nothing computed); a
    multiply-add is 2 FLOPs. Bytes: the cached rows the step reads (latent + rotary key, C + R each), and
    in the sparse step the indexer's keys (Di each), all of them."""
    H, C, R, Hi, Di, K = (s[n] for n in ("H", "C", "R", "Hi", "Di", "K"))
    meta = {"device": "meta", "dtype": dtype}
    q = torch.empty(1, H, 1, C + R, **meta)                               # the absorbed query
    rows = torch.empty(1, 1, N, C + R, **meta)                            # the cache: [latent | rotary key]
    if not sparse:
        macs = flop_counts(lambda: mh.attention(q, rows, rows[..., :C], backend="math"))["bmm"] // 2
        return StepCost(0, macs, 0, nbytes(rows))
    index_q, index_w = torch.empty(1, 1, Hi, Di, **meta), torch.empty(1, 1, Hi, **meta)
    index_k = torch.empty(1, N, Di, **meta)                               # the indexer's key cache
    index_macs = flop_counts(lambda: select_keys(index_q, index_k, index_w, Di ** -0.5, None, K))["bmm"] // 2
    picked = torch.empty(1, 1, min(K, N), dtype=torch.long, device="meta")
    attend = flop_counts(lambda: attend_selected(q, rows, rows[..., :C], picked, backend="sparse"))["bmm"] // 2
    return StepCost(index_macs, attend, nbytes(index_k), min(K, N) * (C + R) * rows.element_size())


@topic("sparse-attention")
def sparse_attention(story: Story, say: Say) -> None:
    torch.manual_seed(0)
    say.text("text.why", **SIZES)
    indices = tell_indexer(story, say)
    tell_top_k(story, say, indices)
    tell_cost(story, say)
    tell_shared_kv(story, say)
    say.text("text.closing")


def tell_indexer(story: Story, say: Say) -> torch.Tensor:
    """The indexer's scores and top-k by hand against the module's own picks; its key's bytes per token.
    Returns the picks (B, L, K)."""
    say.heading("heading.indexer")
    say.code("code.indexer")
    mla = small_sparse_mla()
    indexer, K = mla.indexer, mla.indexer.top_k
    B, L = 1, 8
    x = torch.randn(B, L, mla.embed_dim, dtype=torch.float64)                 # (B, L, E)
    with torch.no_grad():
        _, picked = mla(x, return_indices=True)                               # (B, L, K)
        q_resid = mla.q_a_layernorm(mla.q_a_proj(x))                          # the layer's low-rank query
        q, k, w = indexer.project(x, q_resid, torch.arange(L))                # (B, L, Hi, Di), (B, L, Di), (B, L, Hi)
    by_hand = top_k_by_hand(index_scores_by_hand(q, k, w), K)
    story.table([say("label.query"), say("label.may-see"), say("label.picked", K=K)],
                [[i, i + 1, picked[0, i].tolist()] for i in range(L)],
                title=say("label.picks", L=L, Hi=indexer.num_heads, Di=indexer.head_dim))
    say.check("check.by-hand-picks", torch.equal(by_hand, picked),
              f"by hand == picked: {int((by_hand == picked).sum())}/{picked.numel()}", Hi=indexer.num_heads, K=K)
    real = picked >= 0
    counts = real.sum(-1)[0].tolist()
    causal = bool((picked <= torch.arange(L).view(1, L, 1)).all())
    say.check("check.minus-one", counts == [min(i + 1, K) for i in range(L)] and causal,
              f"(picked >= 0).sum(-1) = {counts}", K=K)
    cache = LatentCache(1, 16, V32["C"], V32["R"], index_dim=V32["Di"], dtype=torch.bfloat16)
    index_bytes = cache.index_keys.nbytes // cache.max_len
    latent_bytes = cache.bytes_per_token() - index_bytes
    say.check("check.small-keys", index_bytes == V32["Di"] * 2 and latent_bytes == (V32["C"] + V32["R"]) * 2,
              f"index_keys {index_bytes} B + [latent | k_rope] {latent_bytes} B", index_bytes=f"{index_bytes:,}",
              latent_bytes=f"{latent_bytes:,}", share=f"{index_bytes / latent_bytes:.0%}", **SIZES)
    return picked


def tell_top_k(story: Story, say: Say, indices: torch.Tensor) -> None:
    """Attention over the picked keys: by hand, attend_selected and dense-with-a-mask agree; a decode
    step's attention touches K rows, counted."""
    say.heading("heading.top-k")
    say.code("code.top-k")
    g = torch.Generator().manual_seed(1)
    B, L, H, D = *indices.shape[:2], 2, 8
    q = torch.randn(B, H, L, D, generator=g, dtype=torch.float64)             # (B, H, L, D)
    k, v = (torch.randn(B, 1, L, D, generator=g, dtype=torch.float64) for _ in range(2))   # one shared head
    by_hand = attend_listed_by_hand(q, k, v, indices)
    selected = attend_selected(q, k, v, indices)
    dense = mh.attention(q, k, v, mh.Mask.keep(keep_of(indices, L)))
    say.check("check.selected-equals-masked", max_diff(selected, dense) < 1e-12 and max_diff(by_hand, dense) < 1e-12,
              f"attend_selected: {diff_text(selected, dense)}; by hand: {diff_text(by_hand, dense)}")
    first = selected[:, :, 0]
    say.check("check.first-query", max_diff(first, v[:, :, 0].expand_as(first)) < 1e-12,
              diff_text(first, v[:, :, 0].expand_as(first)), K=indices.shape[-1])

    N, K, C, R = 64, 4, 16, 4
    q1 = torch.randn(1, H, 1, C + R, generator=g, dtype=torch.float64)       # a decode step: one query
    rows = torch.randn(1, 1, N, C + R, generator=g, dtype=torch.float64)      # (B, 1, N, C + R) cached rows
    picked = torch.randperm(N, generator=g)[:K].view(1, 1, K)                 # (B, 1, K)
    work = {name: flop_counts(fn)["bmm"] // 2 for name, fn in (
        ("dense", lambda: mh.attention(q1, rows, rows[..., :C], backend="math")),
        ("sparse", lambda: attend_selected(q1, rows, rows[..., :C], picked, backend="sparse")))}
    per_row = H * (2 * C + R)                                                 # scores over C + R, values over C
    read = {name: n // per_row for name, n in work.items()}
    story.table([say("label.step"), say("label.macs"), say("label.rows")],
                [[say(f"label.{name}-step"), f"{work[name]:,}", read[name]] for name in ("dense", "sparse")],
                title=say("label.decode", N=N, K=K, H=H, C=C, R=R))
    step = attend_selected(q1, rows, rows[..., :C], picked)
    taken = rows[:, :, picked[0, 0]]                                          # (1, 1, K, C + R): the K rows alone
    alone = mh.attention(q1, taken, taken[..., :C])
    say.check("check.step-reads-k-rows", read == {"dense": N, "sparse": K} and max_diff(step, alone) < 1e-12,
              f"rows: {read['dense']} → {read['sparse']}; {diff_text(step, alone)}", N=N, K=K)


def tell_cost(story: Story, say: Say) -> None:
    """Multiply-adds and bytes read per decode step at DeepSeek V3.2's sizes, dense against sparse."""
    say.heading("heading.cost")
    say.text("text.cost", **SIZES)
    dense = {N: step_cost(N, sparse=False) for N in CONTEXTS}
    sparse = {N: step_cost(N, sparse=True) for N in CONTEXTS}
    story.table([say("label.keys"), say("label.dense"), say("label.indexer"), say("label.attention"),
                 say("label.ratio")],
                [[f"{N:,}", f"{dense[N].macs / 1e6:,.1f}", f"{sparse[N].index_macs / 1e6:,.1f}",
                  f"{sparse[N].attend_macs / 1e6:,.1f}", f"{dense[N].macs / sparse[N].macs:.1f}×"] for N in CONTEXTS],
                title=say("label.macs-table"))
    story.table([say("label.keys"), say("label.dense"), say("label.indexer-keys"), say("label.selected-rows"),
                 say("label.ratio")],
                [[f"{N:,}", f"{dense[N].bytes / MiB:,.2f}", f"{sparse[N].index_bytes / MiB:,.2f}",
                  f"{sparse[N].attend_bytes / MiB:,.2f}", f"{dense[N].bytes / sparse[N].bytes:.1f}×"]
                 for N in CONTEXTS],
                title=say("label.bytes-table"))
    H, C, R, Hi, Di, K = (V32[n] for n in ("H", "C", "R", "Hi", "Di", "K"))
    formulas = all(dense[N].macs == H * N * (2 * C + R) and sparse[N].index_macs == Hi * N * (Di + 1)
                   and sparse[N].attend_macs == H * min(K, N) * (2 * C + R) for N in CONTEXTS)
    short, long_ = CONTEXTS[0], CONTEXTS[-1]
    say.check("check.counts-follow-formulas", formulas, f"N = {long_:,}: H·N·(2C+R) = {dense[long_].macs:,}, "
              f"Hi·N·(Di+1) = {sparse[long_].index_macs:,}, H·K·(2C+R) = {sparse[long_].attend_macs:,}")
    say.check("check.short-context", short <= K and sparse[short].macs > dense[short].macs
              and sparse[short].attend_macs == dense[short].macs,
              f"Hi·N·(Di+1) + H·K·(2C+R) > H·N·(2C+R): {sparse[short].index_macs:,} + {sparse[short].attend_macs:,} > "
              f"{dense[short].macs:,}", N=f"{short:,}",
              K=f"{K:,}")
    flat = len({sparse[N].attend_macs for N in CONTEXTS[1:]}) == 1
    growth = sparse[long_].index_macs / sparse[CONTEXTS[1]].index_macs
    say.check("check.attention-stops-growing", flat and growth == long_ / CONTEXTS[1],
              f"H·K·(2C+R) = {sparse[long_].attend_macs:,}; Hi·N·(Di+1): × {growth:g}", lo=f"{CONTEXTS[1]:,}",
              hi=f"{long_:,}",
              growth=f"{growth:g}")
    per_key = Hi * (Di + 1) / (H * (2 * C + R))
    say.check("check.indexer-share", abs(sparse[long_].index_macs / dense[long_].macs - per_key) < 1e-12,
              f"Hi·(Di+1) / (H·(2C+R)) = {Hi} · {Di + 1} / ({H} · {2 * C + R}) = {per_key:.4f}", share=f"{per_key:.1%}",
              limit=f"{1 / per_key:.0f}")
    scan = sparse[long_].index_bytes / sparse[long_].bytes
    say.check("check.bytes-scan", scan > 0.9 and dense[long_].bytes > 4 * sparse[long_].bytes,
              f"N·Di·2 = {sparse[long_].index_bytes:,} B / {sparse[long_].bytes:,} B; "
              f"N·(C+R)·2 = {dense[long_].bytes:,} B",
              N=f"{long_:,}", share=f"{scan:.0%}",
              ratio=f"{dense[long_].bytes / sparse[long_].bytes:.1f}")
