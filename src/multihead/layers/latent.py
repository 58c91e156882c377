"""MultiHeadLatentAttention: DeepSeek V2/V3's multi-head latent attention (MLA), naive and absorbed.

Shape legend: B batch, Lq/Lk lengths, E embed_dim, H heads, C kv_lora_rank (latent width), Dn
qk_nope_head_dim, R qk_rope_head_dim, Dv v_head_dim, Cq q_lora_rank.

Keys and values are not projected from x per head. x is pressed into one small latent per token, and
every head's keys and values are read back out of it; only the rotary part of the key is kept apart:

    q      = q_proj(x)  or  q_b_proj(norm(q_a_proj(x)))        (B, H, Lq, Dn + R) = [q_nope | q_rope]
    c, k_r = kv_a_proj_with_mqa(x)                              (B, Lk, C), (B, Lk, R): one rotary key for all heads
    c      = kv_a_layernorm(c)                                  the latent a decoder caches, with k_r
    q_rope, k_r = RoPE(q_rope, k_r, positions)                  decoupled RoPE: the rotary part only
    k_nope, v = kv_b_proj(c) per head                           (B, H, Lk, Dn), (B, H, Lk, Dv)
    out = o_proj(attention([q_nope | q_rope], [k_nope | k_r], v))

That is the *naive* computation (prefill, training). kv_b_proj holds W_UK (H, Dn, C) and W_UV (H, Dv, C)
and both are linear, so they move out of the sum over keys (the *absorbed* computation, for decoding):

    q_nope · k_nope = q_nope · (W_UK c) = (W_UKᵀ q_nope) · c        fold W_UK into the query: (B, H, Lq, C)
    Σ p v = Σ p (W_UV c) = W_UV (Σ p c)                            apply W_UV after attending over latents

so each head attends over the cached [c | k_r] as multi-query attention with one key head of width
C + R and values c, and nothing per head is ever expanded from the cache. Both use the same softmax
scale, 1/sqrt(Dn + R) unless `scale` says otherwise (DeepSeek multiplies it by YaRN's mscale²).

DeepSeek Sparse Attention (V3.2, GLM-MoE-DSA) adds a lightning indexer (`mh.LightningIndexer`): it picks
each query's top-k keys, and both computations attend to those keys only (`attend_selected`). Its keys
are cached beside the latents. GLM-MoE-DSA's "shared" layers have no indexer and attend to the keys
another layer picked (`shared_selection=True`, `indices=`).
"""
from __future__ import annotations

import torch
from torch import nn

from multihead.attention import attention
from multihead.errors import AttentionError, check_flag, check_hidden, check_number
from multihead.layers.indexer import LightningIndexer, allowed_keys
from multihead.caches.base import as_cache
from multihead.caches.latent import LatentCache
from multihead.caches.new import new_cache
from multihead.backends.cpu.latent_products import fold, unfold
from multihead.masks import Mask
from multihead.positions import RoPE
from multihead.caches.codec import KV_DTYPES
from multihead.layers.selected_attention import attend_selected, check_indices, restrict_indices
from multihead.services import service


class MultiHeadLatentAttention(nn.Module):
    """Multi-head latent attention with DeepSeek's weight names (q_proj or q_a_proj/q_a_layernorm/q_b_proj,
    kv_a_proj_with_mqa, kv_a_layernorm, kv_b_proj, o_proj).

    embed_dim E, num_heads H. kv_lora_rank C: the latent width. qk_nope_head_dim Dn and qk_rope_head_dim
    R: the two parts of each query/key head. v_head_dim Dv. q_lora_rank Cq: low-rank queries (None: one
    q_proj). bias: on q_a_proj, kv_a_proj_with_mqa and o_proj (DeepSeek's attention_bias). rope: an
    mh.RoPE over R features (default RoPE(R, interleaved=True), DeepSeek's pairing). scale: the factor on
    q·k (default (Dn + R) ** -0.5). causal=True makes every call causal (a decoder). norm_eps: the
    latent norms' epsilon. indexer: an mh.LightningIndexer (DeepSeek V3.2; needs q_lora_rank): each
    query attends to its top-k keys only. shared_selection=True: no indexer of its own; every call passes
    the keys to attend to as indices= (GLM-MoE-DSA's shared layers). Inputs are batch-first (B, L, E).
    """

    def __init__(self, embed_dim: int, num_heads: int, *, kv_lora_rank: int, qk_nope_head_dim: int,
                 qk_rope_head_dim: int, v_head_dim: int, q_lora_rank: int | None = None, bias: bool = False,
                 rope: RoPE | None = None, scale: float | None = None, causal: bool = False, dropout: float = 0.0,
                 norm_eps: float = 1e-6, indexer: LightningIndexer | None = None, shared_selection: bool = False,
                 backend: str = "auto", device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        sizes = {"embed_dim": embed_dim, "num_heads": num_heads, "kv_lora_rank": kv_lora_rank,
                 "qk_nope_head_dim": qk_nope_head_dim, "qk_rope_head_dim": qk_rope_head_dim,
                 "v_head_dim": v_head_dim, "q_lora_rank": q_lora_rank}
        for name, value in sizes.items():
            if (value is not None or name != "q_lora_rank") and (
                    isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise AttentionError(f"{name} must be a positive int; got {value!r}.")
        check_flag(bias, "bias")
        check_flag(causal, "causal")
        check_flag(shared_selection, "shared_selection")
        if indexer is not None and (not isinstance(indexer, LightningIndexer) or shared_selection
                                    or (indexer.embed_dim, indexer.q_lora_rank) != (embed_dim, q_lora_rank)):
            raise AttentionError(f"indexer must be an mh.LightningIndexer over embed_dim={embed_dim} and "
                                 f"q_lora_rank={q_lora_rank} (it reads the low-rank query), without "
                                 f"shared_selection; got {indexer!r} and shared_selection={shared_selection}.")
        check_number(dropout, "dropout", "a probability in [0, 1)", lambda x: 0.0 <= x < 1.0)
        check_number(norm_eps, "norm_eps", "a positive number", lambda x: x > 0)
        if scale is not None:
            check_number(scale, "scale", "a positive finite number or None", lambda x: 0 < x < float("inf"))
        if rope is None:
            rope = RoPE(qk_rope_head_dim, interleaved=True, device=device)
        if not isinstance(rope, RoPE) or rope.head_dim != qk_rope_head_dim:
            raise AttentionError(f"rope must be an mh.RoPE over qk_rope_head_dim={qk_rope_head_dim} features; "
                                 f"got {rope!r}.")
        H, C, Dn, R, Dv = num_heads, kv_lora_rank, qk_nope_head_dim, qk_rope_head_dim, v_head_dim
        self.embed_dim, self.num_heads, self.kv_lora_rank, self.q_lora_rank = embed_dim, H, C, q_lora_rank
        self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim = Dn, R, Dv
        self.scale = float(scale) if scale is not None else (Dn + R) ** -0.5
        self.causal, self.dropout, self.backend = causal, float(dropout), backend
        factory = {"device": device, "dtype": dtype}
        if q_lora_rank is None:
            self.q_proj = nn.Linear(embed_dim, H * (Dn + R), bias=False, **factory)
            self.q_a_proj = self.q_a_layernorm = self.q_b_proj = None
        else:
            self.q_proj = None
            self.q_a_proj = nn.Linear(embed_dim, q_lora_rank, bias=bias, **factory)
            self.q_a_layernorm = nn.RMSNorm(q_lora_rank, eps=norm_eps, **factory)
            self.q_b_proj = nn.Linear(q_lora_rank, H * (Dn + R), bias=False, **factory)
        self.kv_a_proj_with_mqa = nn.Linear(embed_dim, C + R, bias=bias, **factory)
        self.kv_a_layernorm = nn.RMSNorm(C, eps=norm_eps, **factory)
        self.kv_b_proj = nn.Linear(C, H * (Dn + Dv), bias=False, **factory)
        self.o_proj = nn.Linear(H * Dv, embed_dim, bias=bias, **factory)
        self.rope, self.indexer, self.shared_selection = rope, indexer, shared_selection
        self._contiguous_halves = None  # (kv_b_proj's weight, its state, (W_UK, W_UV)): see _absorb_weights

    @classmethod
    def from_module(cls, module: nn.Module) -> MultiHeadLatentAttention:
        """The MLA of a transformers DeepSeek V2/V3/V3.2 or GLM-MoE-DSA attention layer, same weights and outputs
        (the convert tool's work)."""
        return service("latent_from_module")(module)

    def new_cache(self, batch_size: int, max_len: int, *, dtype: torch.dtype | None = None,
                  kv_dtype: torch.dtype | None = None, page_size: int | None = None,
                  num_pages: int | None = None) -> LatentCache:
        """An empty LatentCache: latents (batch_size, max_len, C), rotary keys (batch_size, max_len, R), and
        with an indexer its keys (batch_size, max_len, Di). kv_dtype=torch.int8 or torch.float8_e4m3fn: codes,
        a scale per token for the latent and one for the rotary key. page_size: paged (caches/pages.py)."""
        if kv_dtype in KV_DTYPES and self.sparse:
            raise AttentionError("a quantized latent cache serves dense MLA layers; this layer selects keys "
                                 "per query (indexer or shared selection): use a float cache.")
        return new_cache(LatentCache, self.kv_a_proj_with_mqa.weight, batch_size, max_len,
                         latent_dim=self.kv_lora_rank, rope_dim=self.qk_rope_head_dim,
                         index_dim=None if self.indexer is None else self.indexer.head_dim, dtype=dtype,
                         kv_dtype=kv_dtype, page_size=page_size, num_pages=num_pages)

    @property
    def sparse(self) -> bool:
        """Whether each query attends to selected keys only (an indexer, or shared_selection)."""
        return self.indexer is not None or self.shared_selection

    def forward(self, x: torch.Tensor, *, mask: Mask | None = None, causal: bool = False,
                cache: LatentCache | None = None, positions: torch.Tensor | None = None,
                absorb: bool | None = None, indices: torch.Tensor | None = None,
                return_indices: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """Self-attention of x (B, Lq, E) -> (B, Lq, E).

        mask: a `Mask` broadcastable to (B, H, Lq, Lk) (e.g. Mask.key_padding(pad), True = padding).
        causal=True adds Mask.causal() (always on when built with causal=True).
        cache: a LatentCache from new_cache(); this call's latents are appended and the queries attend
        to everything cached, bottom-right aligned per sequence. With a cache, mask may only be
        Mask.lengths(lens, query_lens=lens) for a right-padded prompt.
        positions: (Lq,) or (B, Lq) integer positions for RoPE (default: arange, after the cache).
        absorb: True for the absorbed computation, False for the naive one; None picks absorbed for a
        one-token step on a cache (decoding) and naive otherwise. Both give the same result.
        indices: (B, Lq, K) integer keys each query attends to, -1 = none (a layer built with
        shared_selection; keys the mask blocks are dropped). return_indices=True (sparse layers): returns
        (output, indices), the keys each query attended to, for the next shared layer.
        """
        self._check_input(x)
        causal = check_flag(causal, "causal") or self.causal
        new_tokens = None if cache is None else self._check_cache(cache, mask, x.shape[0])
        self._check_selection(x, cache, indices, return_indices)
        if cache is None:
            return self._run(x, None, positions, mask, causal, absorb, None, indices, return_indices)
        return self._run(x, cache, positions, None, False, absorb, new_tokens, indices, return_indices)

    def attend_cached(self, x: torch.Tensor, cache: LatentCache, positions: torch.Tensor | None,
                      mask: Mask | None, *, absorb: bool | None = None, indices: torch.Tensor | None = None,
                      return_indices: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
        """x (B, Lq, E) -> (B, Lq, E), appending to `cache` like forward, but attending under the caller's
        `mask` over every cached key (B|1, H|1, Lq, Lc), Lc the cache's length after this call, in place
        of the cache's own causal mask (None: that one). For callers that build their own causal and
        padding mask, as transformers does for left-padded batches (multihead.hf.use_latent_cache).
        indices and return_indices: as in forward."""
        self._check_input(x)
        self._check_cache(cache, None, x.shape[0])
        self._check_selection(x, cache, indices, return_indices)
        return self._run(x, cache, positions, mask, False, absorb, None, indices, return_indices)

    def _check_selection(self, x, cache, indices, return_indices) -> None:
        """AttentionError, before anything is written, for indices= and return_indices= this layer cannot take."""
        check_flag(return_indices, "return_indices")
        if return_indices and not self.sparse:
            raise AttentionError("return_indices=True needs a sparse layer (an indexer, or shared_selection); "
                                 "this one attends to every key.")
        if (indices is not None) != self.shared_selection:
            got = "None" if indices is None else "a tensor"
            raise AttentionError("a layer built with shared_selection=True attends to the keys given as indices= "
                                 "(B, Lq, K) at every call; other layers take no indices= (their indexer picks, "
                                 f"or they attend to every key); got indices={got}.")
        if indices is not None:
            B, Lq, _ = x.shape
            Lk = Lq + (0 if cache is None else cache.held)
            check_indices(indices, B, Lq, Lk, x.device)

    def _check_cache(self, cache, mask, B: int):
        """AttentionError unless `cache` is this module's LatentCache for batch B, and the mask one a cache
        takes. Returns the per-sequence new-token counts or None."""
        return as_cache(cache, LatentCache, "mla.new_cache()").check_call(mask, B, 1, self.head_dim)

    def _run(self, x, cache, positions, mask, causal, absorb, new_tokens, indices, return_indices):
        """Project, turn, append to the cache (if any), select keys (sparse layers), attend naive or
        absorbed, project out."""
        B, Lq, _ = x.shape
        q_nope, q_rope, latent, k_rope, q_resid = self._project(x)
        if positions is None:
            positions = cache.positions(Lq) if cache is not None else torch.arange(Lq, device=x.device)
        q_rope, k_rope = self.rope(q_rope, k_rope[:, None], positions)  # (B, H, Lq, R), (B, 1, Lq, R)
        index_q = index_k = None
        if self.indexer is not None:  # (B, Lq, Hi, Di), (B, Lq, Di), (B, Lq, Hi)
            index_q, index_k, index_w = self.indexer.project(x, q_resid, positions)
        if cache is not None:
            keys, cache_mask = cache.append_latent(latent, k_rope[:, 0], new_tokens, index_k)  # (B, 1, Lc, C + R)
            mask = cache_mask if mask is None else mask  # the cache's: causal within each sequence's length
            if index_k is not None:
                index_k = cache.index_keys[:, :keys.shape[2]]  # (B, Lc, Di)
        else:
            keys = torch.cat((latent[:, None], k_rope), dim=-1)  # (B, 1, Lk, C + R)
        if self.sparse:  # the mask and causality now decide which keys may be selected, and nothing else
            allowed = allowed_keys(mask, causal, B, Lq, keys.shape[2], x.device, x.dtype)
            if index_q is not None:
                indices = self.indexer.select(index_q, index_w, index_k, allowed)  # (B, Lq, K)
            else:
                indices = restrict_indices(indices, allowed)
            mask, causal = None, False
        absorb = (cache is not None and Lq == 1) if absorb is None else check_flag(absorb, "absorb")
        absorb = absorb or (cache is not None and cache.codec.quantized)  # codes are attended absorbed, never decompressed per head
        attend = self._absorbed if absorb else self._naive
        out = attend(q_nope, q_rope, keys, mask, causal, indices)  # (B, H, Lq, Dv)
        out = self.o_proj(out.transpose(1, 2).reshape(B, Lq, self.num_heads * self.v_head_dim))  # (B, Lq, E)
        return (out, indices) if return_indices else out

    @property
    def num_kv_heads(self) -> int:
        """1: the cache holds one shared key/value head, the latent (what the cache's check_call compares)."""
        return 1

    @property
    def head_dim(self) -> int:
        """C + R: the width of the cached key [latent | rotary key]."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    def _project(self, x: torch.Tensor):
        """x (B, L, E) -> q_nope (B, H, L, Dn), q_rope (B, H, L, R), latent (B, L, C), k_rope (B, L, R),
        and the normalised low-rank query (B, L, Cq) (None without q_lora_rank)."""
        B, L, _ = x.shape
        Dn, R, C = self.qk_nope_head_dim, self.qk_rope_head_dim, self.kv_lora_rank
        q_resid = None if self.q_proj is not None else self.q_a_layernorm(self.q_a_proj(x))
        q = self.q_proj(x) if q_resid is None else self.q_b_proj(q_resid)
        q = q.view(B, L, self.num_heads, Dn + R).transpose(1, 2)  # (B, H, L, Dn + R)
        latent, k_rope = self.kv_a_proj_with_mqa(x).split((C, R), dim=-1)  # (B, L, C), (B, L, R)
        return q[..., :Dn], q[..., Dn:], self.kv_a_layernorm(latent), k_rope, q_resid

    def up_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """W_UK (H, Dn, C) and W_UV (H, Dv, C): the two halves of kv_b_proj, per head (views)."""
        w = self.kv_b_proj.weight.view(self.num_heads, self.qk_nope_head_dim + self.v_head_dim, self.kv_lora_rank)
        return w[:, :self.qk_nope_head_dim], w[:, self.qk_nope_head_dim:]

    def _absorb_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """`up_weights` as contiguous tensors, copied once per version of kv_b_proj's weight: the C++ products
        (latent_products) need them so, and bmm on the CPU would copy the strided halves at every bf16 call
        (2·H·Dn·C values per decode step). The views where autograd needs the weight, under torch.compile,
        and for inference tensors (no version counter)."""
        w = self.kv_b_proj.weight
        if (w.requires_grad and torch.is_grad_enabled()) or torch.compiler.is_compiling() or w.is_inference():
            return self.up_weights()
        state = (w._version, w.data_ptr(), w.dtype, w.device)  # `.to()` swaps a parameter's data in place
        kept = self._contiguous_halves
        if kept is None or kept[0] is not w or kept[1] != state:
            kept = self._contiguous_halves = (w, state, tuple(t.contiguous() for t in self.up_weights()))
        return kept[2]

    def _attend(self, q, k, v, mask, causal, indices) -> torch.Tensor:
        """mh.attention, or attend_selected over each query's `indices` (B, Lq, K) in a sparse layer."""
        options = {"scale": self.scale, "dropout": self.dropout if self.training else 0.0, "backend": self.backend}
        if indices is not None:
            return attend_selected(q, k, v, indices, **options)
        return attention(q, k, v, mask, causal=causal, **options)

    def _naive(self, q_nope, q_rope, keys, mask, causal, indices) -> torch.Tensor:
        """Decompress every head's keys and values from keys (B, 1, Lk, C + R), then attend: (B, H, Lq, Dv)."""
        B, _, Lk, _ = keys.shape
        H, Dn, Dv, C = self.num_heads, self.qk_nope_head_dim, self.v_head_dim, self.kv_lora_rank
        kv = self.kv_b_proj(keys[:, 0, :, :C]).view(B, Lk, H, Dn + Dv).transpose(1, 2)  # (B, H, Lk, Dn + Dv)
        k = torch.cat((kv[..., :Dn], keys[..., C:].expand(B, H, Lk, -1)), dim=-1)  # (B, H, Lk, Dn + R)
        q = torch.cat((q_nope, q_rope), dim=-1)  # (B, H, Lq, Dn + R)
        return self._attend(q, k, kv[..., Dn:], mask, causal, indices)

    def _absorbed(self, q_nope, q_rope, keys, mask, causal, indices) -> torch.Tensor:
        """Fold W_UK into the queries, attend over keys (B, 1, Lk, C + R) as MQA with values = the latents
        keys[..., :C], then apply W_UV: (B, H, Lq, Dv).

        The values passed are the whole cached rows [c | k_rope] and the last R output features are
        dropped: with q, k and v of one width, torch's fused CPU kernel runs (it needs Dv == D), and
        reads the cache once for both."""
        w_uk, w_uv = self._absorb_weights()
        q_latent = fold(q_nope, w_uk)  # (B, H, Lq, Dn) @ (H, Dn, C) -> (B, H, Lq, C)
        q = torch.cat((q_latent, q_rope), dim=-1)  # (B, H, Lq, C + R)
        out = self._attend(q, keys, keys, mask, causal, indices)  # (B, H, Lq, C + R)
        return unfold(out[..., :self.kv_lora_rank], w_uv)  # (B, H, Lq, C) @ (H, Dv, C)^T -> (B, H, Lq, Dv)

    def _check_input(self, x) -> None:
        check_hidden(x, self.embed_dim, self.kv_a_proj_with_mqa.weight)

    def extra_repr(self) -> str:
        return (f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, kv_lora_rank={self.kv_lora_rank}, "
                f"q_lora_rank={self.q_lora_rank}, qk_nope_head_dim={self.qk_nope_head_dim}, "
                f"qk_rope_head_dim={self.qk_rope_head_dim}, v_head_dim={self.v_head_dim}, scale={self.scale:.6g}, "
                f"causal={self.causal}" + (", shared_selection=True" if self.shared_selection else ""))
