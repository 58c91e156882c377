"""Grouped-query attention and the K/V cache: a generating model keeps every past token's keys and
values, 2 * layers * Hkv * D numbers per token, so fewer key/value heads (GQA, MQA) shrink the cache;
and GQA computes exactly what MHA computes with each key/value head repeated for its group.

Shapes: B batch, H query heads, Hkv key/value heads (groups of g = H / Hkv queries), L tokens,
D head dim, E embed dim.
"""
from __future__ import annotations

import torch

import multihead as mh
from multihead.explain.story import Story
from multihead.explain.topics.base import Say, diff_text, max_diff, topic

# (name, layers, query heads, key/value heads, head dim): public configurations, all float16/bfloat16
KNOWN_CONFIGS = (
    ("Llama 2 7B (MHA)", 32, 32, 32, 128),
    ("Llama 3 8B (GQA)", 32, 32, 8, 128),
    ("MQA, same size", 32, 32, 1, 128),
)


def cache_bytes_per_token(layers: int, kv_heads: int, head_dim: int, dtype: torch.dtype) -> int:
    """The formula: keys and values (2), for every layer and key/value head, D numbers of `dtype`."""
    return 2 * layers * kv_heads * head_dim * torch.empty(0, dtype=dtype).element_size()


def build_cache(layers: list[mh.MultiHeadAttention], x: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """What a generating model keeps: each layer's keys and values (B, Hkv, L, D) for the tokens x (B, L, E)."""
    B, L, _ = x.shape
    cache = []
    for attn in layers:
        Hkv, D = attn.num_kv_heads, attn.head_dim
        k = attn.k_proj(x).view(B, L, Hkv, D).transpose(1, 2)     # (B, Hkv, L, D)
        v = attn.v_proj(x).view(B, L, Hkv, D).transpose(1, 2)
        cache.append((k.contiguous(), v.contiguous()))
    return cache


def measured_bytes_per_token(cache: list[tuple[torch.Tensor, torch.Tensor]], tokens: int) -> float:
    """Bytes the cache's tensors really hold, per token."""
    return sum(t.untyped_storage().nbytes() for pair in cache for t in pair) / tokens


def repeat_kv(t: torch.Tensor, groups: int) -> torch.Tensor:
    """(B, Hkv, L, D) -> (B, Hkv * groups, L, D): kv head j serves query heads j*g .. j*g + g - 1."""
    return t.repeat_interleave(groups, dim=1)


def as_mha(gqa: mh.MultiHeadAttention) -> mh.MultiHeadAttention:
    """An ordinary multi-head module (Hkv = H) whose key/value projections repeat the GQA module's
    kv heads for their groups: the same function with a g times larger cache."""
    H, Hkv, D, E = gqa.num_heads, gqa.num_kv_heads, gqa.head_dim, gqa.embed_dim
    mha = mh.MultiHeadAttention(E, H, head_dim=D, bias=False).to(gqa.q_proj.weight.dtype)
    mha.load_state_dict({**gqa.state_dict(), **{
        f"{name}.weight": getattr(gqa, name).weight.view(Hkv, D, E).repeat_interleave(H // Hkv, 0).reshape(H * D, E)
        for name in ("k_proj", "v_proj")}})
    return mha


@topic("gqa-memory")
def gqa_memory(story: Story, say: Say) -> None:
    torch.manual_seed(0)
    n_layers, E, H, Hkv, D, L = 4, 64, 8, 2, 16, 10
    say.text("text.cache")
    say.code("code.formula")

    say.heading("heading.measured")
    x = torch.randn(1, L, E, dtype=torch.float16)                   # (B, L, E)
    rows, measured = [], {}
    for kv in (H, Hkv, 1):
        layers = [mh.MultiHeadAttention(E, H, num_kv_heads=kv, head_dim=D, bias=False, dtype=torch.float16)
                  for _ in range(n_layers)]
        with torch.no_grad():
            measured[kv] = measured_bytes_per_token(build_cache(layers, x), L)
        rows.append([kv, f"{measured[kv]:.0f}", cache_bytes_per_token(n_layers, kv, D, torch.float16)])
    story.table(["Hkv", say("label.measured"), "2 * layers * Hkv * D * bytes"], rows,
                title=say("label.cache-setup", layers=n_layers, H=H, D=D, L=L))
    say.check("check.formula-matches-cache",
              all(measured[kv] == cache_bytes_per_token(n_layers, kv, D, torch.float16) for kv in measured))
    say.check("check.gqa-saves-by-groups", measured[H] == measured[Hkv] * (H // Hkv) == measured[1] * H,
              say("detail.bytes", mha=f"{measured[H]:.0f}", gqa=f"{measured[Hkv]:.0f}", mqa=f"{measured[1]:.0f}",
                  g=H // Hkv, H=H), H=H, Hkv=Hkv, g=H // Hkv)
    context = 4096
    story.table([say("label.config"), "layers", "H", "Hkv", "D", say("label.per-token"),
                 say("label.per-context", tokens=context)],
                [[name, layers_, h, kv, d, f"{cache_bytes_per_token(layers_, kv, d, torch.float16) / 2**10:.0f} KiB",
                  f"{context * cache_bytes_per_token(layers_, kv, d, torch.float16) / 2**20:.0f} MiB"]
                 for name, layers_, h, kv, d in KNOWN_CONFIGS],
                title=say("label.known-configs"))

    say.heading("heading.same-function")
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, H, L, D, generator=g, dtype=torch.float64)   # (B, H, L, D)
    k, v = (torch.randn(1, Hkv, L, D, generator=g, dtype=torch.float64) for _ in range(2))   # (B, Hkv, L, D)
    say.code("code.repeat")
    grouped = mh.attention(q, k, v, causal=True)
    repeated = mh.attention(q, repeat_kv(k, H // Hkv), repeat_kv(v, H // Hkv), causal=True)
    say.check("check.gqa-equals-repeated", max_diff(grouped, repeated) < 1e-12, diff_text(grouped, repeated),
              H=H, Hkv=Hkv)
    group = H // Hkv
    per_head = torch.cat([mh.attention(q[:, h:h + 1], k[:, h // group:h // group + 1], v[:, h // group:h // group + 1],
                                       causal=True) for h in range(H)], dim=1)
    say.check("check.head-reads-its-group", max_diff(grouped, per_head) < 1e-12, diff_text(grouped, per_head), g=group)
    tiled = mh.attention(q, k.repeat(1, group, 1, 1), v.repeat(1, group, 1, 1), causal=True)
    say.check("check.tiling-is-wrong", max_diff(grouped, tiled) > 1e-3, diff_text(grouped, tiled))
    gqa = mh.MultiHeadAttention(E, H, num_kv_heads=Hkv, head_dim=D, bias=False).double()
    mha = as_mha(gqa)
    xs = torch.randn(2, L, E, dtype=torch.float64)
    with torch.no_grad():
        same = max_diff(gqa(xs, causal=True), mha(xs, causal=True))
    say.check("check.module-equals-mha", same < 1e-12 and gqa.k_proj.out_features * group == mha.k_proj.out_features,
              f"max |diff| = {same:.1e}", Hkv=Hkv, small=gqa.k_proj.out_features, big=mha.k_proj.out_features)
    say.text("text.tradeoff")
