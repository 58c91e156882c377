"""Latent decode: one MLA decode step at DeepSeek-V2-Lite's dimensions, absorbed against naive and HF's.

One layer, random weights: hidden E=2048, H=16 heads, latent C=512, Dn=128 (nope), R=64 (rope), Dv=128,
no query compression; B=1, context N=4096, fp32 (bf16 too in the full run). Five steps, each appending
one token to its own cache, all five caches holding the same context:

- ours, absorbed: MultiHeadLatentAttention + LatentCache; the query takes W_UK, attention runs as
  multi-query attention over the cached [latent | rotary key] (C + R = 576 wide), then W_UV;
- ours, naive: the same module and cache content with absorb=False: every cached latent is expanded
  through kv_b_proj into per-head keys and values at every step (what HF's layer does too);
- HF: transformers' DeepseekV3Attention (SDPA attention) with its own DynamicCache, identical weights;
- HF with a StaticCache, eager, and the same step under torch.compile (default mode): the call a user who
  wants HF's speed makes. The goal is taken against HF at its best call, the fastest of its three rows.
  (Every head has its own key here, so HF's SDPA call never repeats K and V: compiling fuses the
  per-step expansion of the latents, and the compiled step is HF's fastest, one graph, no break.)

Bytes read per step (a model of the traffic, not a counter): the weights (W), the latents
N·(C + R), and for the expanding steps the per-head keys and values they write and attention reads
back, N·H·(Dn + R + Dv); HF's StaticCache step expands all of its slots, filled or not. The cache table gives the bytes one token costs per layer: MLA's latent
against MHA, GQA and MQA caches of the same width (H heads of D = E / H), and DeepSeek's expanded
per-head keys and values.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from multihead.bench.machine import load_average
from multihead.bench.plots import DRAWERS
from multihead.bench.results import SuiteResult, Target
from multihead.bench.suites.context import Context
from multihead.bench.timing import compare, ratio
from multihead.layers.latent import MultiHeadLatentAttention
from multihead.positions import apply_rotary

GOAL_HF = 30.0  # HF's step / the absorbed step
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
COLUMNS = ["case", "implementation", "ms", "MB read", "GB/s", "x ours", "max |diff|", "bytes/token", "x MLA"]
ABSORBED, NAIVE, HF = "ours: absorbed (MLA + LatentCache)", "ours: naive over the same cache", \
    "HF DeepseekV3Attention + DynamicCache (sdpa)"
HF_STATIC = "HF DeepseekV3Attention + StaticCache, torch.compile (sdpa)"
HF_STATIC_EAGER = "HF DeepseekV3Attention + StaticCache (sdpa), eager"
HF_CALLS = (HF, HF_STATIC_EAGER, HF_STATIC)


@dataclass(frozen=True)
class Sizes:
    context: int = 4096
    hidden: int = 2048
    heads: int = 16
    kv_lora_rank: int = 512
    qk_nope_head_dim: int = 128
    qk_rope_head_dim: int = 64
    v_head_dim: int = 128
    gqa_kv_heads: int = 4
    dtypes: tuple[str, ...] = ("fp32", "bf16")

    @classmethod
    def full(cls) -> Sizes:
        return cls()

    @classmethod
    def quick(cls) -> Sizes:
        return cls(context=512, dtypes=("fp32",))


def run(ctx: Context, sizes: Sizes) -> SuiteResult:
    s = sizes
    result = SuiteResult(
        "latent",
        f"Latent decode: one MLA layer at DeepSeek-V2-Lite's dimensions (E={s.hidden}, H={s.heads}, "
        f"C={s.kv_lora_rank}, Dn={s.qk_nope_head_dim}, R={s.qk_rope_head_dim}, Dv={s.v_head_dim}), B=1, "
        f"N={s.context}",
        COLUMNS,
    )
    loads = []
    with ctx.bars.task("latent", total=len(s.dtypes)) as steps, torch.no_grad():
        for dtype in s.dtypes:
            steps.describe(f"latent decode N={s.context} {dtype}")
            loads.append(f"{dtype} {load_average()}")
            decode_step(ctx, s, dtype, result)
            steps.advance()
    cache_sizes(s, result)
    result.notes.append("load average (1, 5, 15 min) at the start of each part: " + "; ".join(loads))
    return result


def build_pair(s: Sizes, dtype: torch.dtype, seed: int = 0):
    """(HF DeepseekV3Attention, its rotary embedding, our MLA from it): eval, `dtype`, identical weights."""
    from transformers import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3Attention, DeepseekV3RotaryEmbedding

    config = DeepseekV3Config(hidden_size=s.hidden, num_attention_heads=s.heads, num_key_value_heads=s.heads,
                              kv_lora_rank=s.kv_lora_rank, q_lora_rank=None, qk_nope_head_dim=s.qk_nope_head_dim,
                              qk_rope_head_dim=s.qk_rope_head_dim, v_head_dim=s.v_head_dim, num_hidden_layers=1,
                              vocab_size=4, max_position_embeddings=2 * s.context + 64, attention_bias=False)
    config._attn_implementation = "sdpa"
    torch.manual_seed(seed)
    hf = DeepseekV3Attention(config, layer_idx=0)
    with torch.no_grad():  # HF's init is zeros/ones for some weights; draw every one so outputs differ
        for param in hf.parameters():
            param.normal_(1.0 if param.dim() == 1 else 0.0, 0.02)
    hf = hf.to(dtype).eval()
    return hf, DeepseekV3RotaryEmbedding(config), MultiHeadLatentAttention.from_module(hf).eval()


def fill(mla: MultiHeadLatentAttention, context: torch.Tensor, headroom: int):
    """Two LatentCaches and one DynamicCache holding the latents and turned rotary keys of context (1, N, E)
    (the projections a prefill computes, without its attention), with room for `headroom` more tokens."""
    from transformers import DynamicCache

    B, N, _ = context.shape
    C, R = mla.kv_lora_rank, mla.qk_rope_head_dim
    latent, k_rope = mla.kv_a_proj_with_mqa(context).split((C, R), dim=-1)  # (B, N, C), (B, N, R)
    latent = mla.kv_a_layernorm(latent)
    cos, sin = mla.rope.cos_sin(torch.arange(N), context.dtype)  # (1, N, R)
    k_rope = apply_rotary(k_rope[:, None], cos, sin, mla.rope.interleaved)[:, 0]  # (B, N, R), pairs (2k, 2k+1)
    caches = []
    for _ in range(2):
        cache = mla.new_cache(B, N + headroom)
        cache.append_latent(latent, k_rope)
        caches.append(cache)
    hf_cache = DynamicCache()
    halves = torch.cat((torch.arange(0, R, 2), torch.arange(1, R, 2)))  # HF V3 keeps turned pairs de-interleaved
    hf_cache.update(latent[:, None].clone(), k_rope[:, None, :, halves].clone(), 0)
    return caches, hf_cache


def static_cache(hf, hf_cache, slots: int):
    """A StaticCache of `slots` positions holding what the DynamicCache `hf_cache` holds (latents as keys,
    turned rotary keys as values, HF V3's layout)."""
    from transformers import StaticCache

    cache = StaticCache(config=hf.config, max_cache_len=slots)
    cache.update(hf_cache.layers[0].keys.clone(), hf_cache.layers[0].values.clone(), 0)
    return cache


def static_step(hf, rotary, cache, x: torch.Tensor) -> torch.Tensor:
    """x (1, 1, E) -> (1, 1, E): one step of HF's layer on its StaticCache. The position and the mask over the
    cache's slots come from its length tensor, so every step has the same shapes (one compiled graph)."""
    length = cache.layers[0].cumulative_length  # () tensor: tokens cached so far
    slots = cache.layers[0].keys.shape[2]
    mask = (torch.arange(slots) <= length).view(1, 1, 1, slots)  # the cached slots and this one
    return hf(x, position_embeddings=rotary(x, length.view(1, 1)), attention_mask=mask, cache=cache)[0]


def decode_step(ctx: Context, s: Sizes, dtype: str, result: SuiteResult) -> None:
    dt = DTYPES[dtype]
    hf, rotary, mla = build_pair(s, dt)
    rounds = 2 * ctx.rounds
    headroom = 4 + 2 * ctx.warmup + rounds
    g = torch.Generator().manual_seed(1)
    context = torch.randn(1, s.context, s.hidden, generator=g).to(dt)
    (absorbed_cache, naive_cache), hf_cache = fill(mla, context, headroom)
    x = torch.randn(1, 1, s.hidden, generator=g).to(dt)  # (1, 1, E): the next token

    def hf_step():
        position = torch.full((1, 1), hf_cache.get_seq_length(), dtype=torch.long)
        return hf(x, position_embeddings=rotary(x, position), attention_mask=None, cache=hf_cache)[0]

    hf_static, hf_eager = (static_cache(hf, hf_cache, s.context + headroom) for _ in range(2))
    compiled = torch.compile(static_step)
    fns = {ABSORBED: lambda: mla(x, cache=absorbed_cache),
           NAIVE: lambda: mla(x, cache=naive_cache, absorb=False),
           HF: hf_step,
           HF_STATIC_EAGER: lambda: static_step(hf, rotary, hf_eager, x),
           HF_STATIC: lambda: compiled(hf, rotary, hf_static, x)}
    first = {name: fn() for name, fn in fns.items()}  # one step each (HF compiled: it compiles), all at N + 1
    t = compare(fns, rounds=rounds, warmup=ctx.warmup, budget_s=ctx.budget_s)
    N, H, es = s.context + 1, s.heads, torch.finfo(dt).bits // 8
    weights = sum(p.numel() * p.element_size() for p in mla.parameters())
    latents = N * (s.kv_lora_rank + s.qk_rope_head_dim) * es
    expanded = N * H * (s.qk_nope_head_dim + s.qk_rope_head_dim + s.v_head_dim) * es
    slots = (s.context + headroom) / N  # the StaticCache expands every slot, filled or not
    moved = {ABSORBED: weights + latents, NAIVE: weights + latents + expanded, HF: weights + latents + expanded,
             HF_STATIC_EAGER: weights + slots * (latents + expanded), HF_STATIC: weights + slots * (latents + expanded)}
    case = f"decode step N={s.context} {dtype}"
    for name, timing in t.items():
        result.rows.append({
            "case": case, "implementation": name, "ms": timing.median_s * 1e3, "MB read": moved[name] / 1e6,
            "GB/s": moved[name] / timing.median_s / 1e9, "x ours": ratio(timing, t[ABSORBED]),
            "max |diff|": None if name == ABSORBED else (first[name] - first[ABSORBED]).abs().max().item(),
        })
    best = min(HF_CALLS, key=lambda name: t[name].median_s)
    result.targets.append(Target(
        f"latent decode N={s.context} {dtype}: HF DeepseekV3Attention step at its best call / absorbed step",
        ratio(t[best], t[ABSORBED]), ">=", GOAL_HF,
        note=(f"HF's best: {best}; with the DynamicCache {ratio(t[HF], t[ABSORBED]):.1f}x, StaticCache eager "
              f"{ratio(t[HF_STATIC_EAGER], t[ABSORBED]):.1f}x, StaticCache compiled "
              f"{ratio(t[HF_STATIC], t[ABSORBED]):.1f}x; naive / absorbed {ratio(t[NAIVE], t[ABSORBED]):.1f}x; "
              "per step the absorbed one reads "
              f"{latents / 1e6:.1f} MB of latents and {weights / 1e6:.1f} MB of weights, the expanding ones "
              f"also {expanded / 1e6:.0f} MB of per-head K/V")))


def cache_sizes(s: Sizes, result: SuiteResult) -> None:
    """Bytes one token costs the cache of one layer, per layout of the same width (fp32 and bf16)."""
    D = s.hidden // s.heads
    mla = s.kv_lora_rank + s.qk_rope_head_dim
    layouts = {
        f"MHA: {s.heads} heads x (K {D} + V {D})": 2 * s.heads * D,
        f"GQA: {s.gqa_kv_heads} kv heads x (K {D} + V {D})": 2 * s.gqa_kv_heads * D,
        f"MQA: 1 kv head x (K {D} + V {D})": 2 * D,
        f"MLA: latent {s.kv_lora_rank} + rotary key {s.qk_rope_head_dim}": mla,
        f"DeepSeek expanded: {s.heads} heads x (K {s.qk_nope_head_dim + s.qk_rope_head_dim} + V {s.v_head_dim})":
            s.heads * (s.qk_nope_head_dim + s.qk_rope_head_dim + s.v_head_dim),
    }
    for dtype in ("fp32", "bf16"):
        es = torch.finfo(DTYPES[dtype]).bits // 8
        for name, numbers in layouts.items():
            result.rows.append({"case": f"cache per token per layer, {dtype}", "implementation": name,
                                "bytes/token": numbers * es, "x MLA": numbers / mla})


def plot(plt, r: SuiteResult):
    """Left: ms per decode step (log scale). Right: cache bytes per token per layer, fp32."""
    steps = [row for row in r.rows if row.get("ms") is not None]
    sizes = [row for row in r.rows if row["case"].endswith("fp32") and row.get("bytes/token") is not None]
    fig, (t_ax, c_ax) = plt.subplots(1, 2, figsize=(12, 0.4 * max(len(steps), len(sizes)) + 2))
    t_ax.barh(range(len(steps)), [row["ms"] for row in steps])
    t_ax.set_yticks(range(len(steps)), [f"{row['case'][12:]}: {row['implementation']}" for row in steps], fontsize=7)
    t_ax.set_xscale("log")
    t_ax.set_xlabel("ms per decode step (log)")
    c_ax.barh(range(len(sizes)), [row["bytes/token"] for row in sizes])
    c_ax.set_yticks(range(len(sizes)), [row["implementation"] for row in sizes], fontsize=7)
    c_ax.set_xlabel("cache bytes per token per layer (fp32)")
    for ax in (t_ax, c_ax):
        ax.invert_yaxis()
    fig.suptitle(r.title, fontsize=9)
    return fig


DRAWERS.setdefault("latent", plot)  # `multihead bench --plot` draws this suite with it
