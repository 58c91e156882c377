"""Multi-head latent attention (DeepSeek V2/V3): why a latent, what absorbing W_UK and W_UV means, a live
proof that the absorbed form equals the naive one, and cache bytes per token for MHA, GQA, MQA and MLA.

Shapes: B batch, L tokens, E embed, H heads, C latent width (kv_lora_rank), Dn / R the non-rotary /
rotary parts of a query-key head, Dv value head dim.
"""
from __future__ import annotations

import torch

import multihead as mh
from multihead.explain.story import Story
from multihead.explain.topics.base import Say, diff_text, max_diff, topic
from multihead.explain.topics.decoding import flop_counts
from multihead.caches.latent import LatentCache

# DeepSeek-V2-Lite's attention (public config): layers, hidden, heads, C, Dn, R, Dv; D = hidden / heads
LITE = {"layers": 27, "hidden": 2048, "heads": 16, "C": 512, "Dn": 128, "R": 64, "Dv": 128}


def small_mla(E: int = 64, H: int = 4, C: int = 16, Dn: int = 8, R: int = 4,
              Dv: int = 8) -> mh.MultiHeadLatentAttention:
    """A causal float64 MLA small enough to print, with DeepSeek's layer names."""
    return mh.MultiHeadLatentAttention(E, H, kv_lora_rank=C, qk_nope_head_dim=Dn, qk_rope_head_dim=R, v_head_dim=Dv,
                                       causal=True, dtype=torch.float64)


def cache_bytes(cache: mh.KVCache) -> int:
    """Bytes the cache's buffers really hold (keys and values once each, lengths left out)."""
    seen = {cache.keys.untyped_storage().data_ptr(): cache.keys.untyped_storage().nbytes()}
    seen.setdefault(cache.values.untyped_storage().data_ptr(), cache.values.untyped_storage().nbytes())
    return sum(seen.values())


def per_token_bytes(dtype: torch.dtype = torch.bfloat16, max_len: int = 8) -> dict[str, int]:
    """Measured bytes per token per layer at DeepSeek-V2-Lite's width: real caches of max_len tokens."""
    H, D = LITE["heads"], LITE["hidden"] // LITE["heads"]
    made = {f"MHA (Hkv = {H})": mh.KVCache(1, max_len, H, D, dtype=dtype),
            "GQA (Hkv = 4)": mh.KVCache(1, max_len, 4, D, dtype=dtype),
            "MQA (Hkv = 1)": mh.KVCache(1, max_len, 1, D, dtype=dtype)}
    made["MLA"] = LatentCache(1, max_len, LITE["C"], LITE["R"], dtype=dtype)  # what mla.new_cache makes
    return {name: cache_bytes(cache) // max_len for name, cache in made.items()}


@topic("mla")
def mla_topic(story: Story, say: Say) -> None:
    torch.manual_seed(0)
    say.text("text.why")
    say.code("code.latent")
    mla = small_mla()
    H, C, Dn, R, Dv = mla.num_heads, mla.kv_lora_rank, mla.qk_nope_head_dim, mla.qk_rope_head_dim, mla.v_head_dim
    B, L = 2, 7
    x = torch.randn(B, L, mla.embed_dim, dtype=torch.float64)                  # (B, L, E)
    cache = mla.new_cache(B, L)
    with torch.no_grad():
        full = mla(x)
        mla(x, cache=cache)
    say.check("check.cache-holds-latents", cache.latents.shape == (B, L, C) and cache.rope_keys.shape == (B, L, R)
              and cache.bytes_per_token() == (C + R) * 8,
              f"latents {tuple(cache.latents.shape)}, rope_keys {tuple(cache.rope_keys.shape)}", C=C, R=R,
              per_head=H * (Dn + R + Dv))

    say.heading("heading.absorb")
    say.code("code.absorb")
    w_uk, w_uv = mla.up_weights()                                             # (H, Dn, C), (H, Dv, C)
    g = torch.Generator().manual_seed(1)
    q_nope = torch.randn(B, H, 1, Dn, generator=g, dtype=torch.float64)      # (B, H, 1, Dn)
    latents = cache.latents[:, None]                                           # (B, 1, L, C)
    with torch.no_grad():
        k_nope = torch.einsum("hdc,bxlc->bhld", w_uk, latents)                 # (B, H, L, Dn): expanded keys
        expanded = q_nope @ k_nope.transpose(-1, -2)                          # (B, H, 1, L)
        absorbed = torch.einsum("bhld,hdc->bhlc", q_nope, w_uk) @ latents.transpose(-1, -2)
        p = torch.softmax(expanded, dim=-1)
        v_expanded = p @ torch.einsum("hvc,bxlc->bhlv", w_uv, latents)          # (B, H, 1, Dv)
        v_absorbed = torch.einsum("bhlc,hvc->bhlv", p @ latents, w_uv)
    say.check("check.scores-absorbed", max_diff(expanded, absorbed) < 1e-12, diff_text(expanded, absorbed))
    say.check("check.values-absorbed", max_diff(v_expanded, v_absorbed) < 1e-12, diff_text(v_expanded, v_absorbed))

    say.heading("heading.proof")
    with torch.no_grad():
        naive, folded = mla(x, absorb=False), mla(x, absorb=True)
        steps = mla.new_cache(B, L)
        rows = torch.cat([mla(x[:, :3], cache=steps)] + [mla(x[:, i:i + 1], cache=steps) for i in range(3, L)], 1)
    say.check("check.absorbed-equals-naive", max_diff(naive, folded) < 1e-12, diff_text(naive, folded), H=H, C=C)
    say.check("check.steps-equal-full", max_diff(rows, full) < 1e-12, diff_text(rows, full))
    N = 64
    big = mla.new_cache(1, N + 1)
    with torch.no_grad():
        mla(torch.randn(1, N, mla.embed_dim, dtype=torch.float64), cache=big)
    token = torch.randn(1, 1, mla.embed_dim, dtype=torch.float64)
    work = {}
    mla.backend = "math"  # plain matmuls, every one of which torch's FLOP counter sees (fused kernels hide theirs)
    for absorb in (False, True):
        trial = big.resized()
        with torch.no_grad():
            work[absorb] = sum(flop_counts(lambda: mla(token, cache=trial, absorb=absorb)).values()) // 2
    mla.backend = "auto"
    expand = (N + 1) * C * H * (Dn + Dv)                                       # kv_b_proj over every cached latent
    say.check("check.naive-expands", work[False] > expand > work[True],
              say("detail.work", naive=work[False], expand=expand, absorbed=work[True]), N=N + 1, expand=expand)

    say.heading("heading.bytes")
    per_token = per_token_bytes()
    mha_bytes = per_token[f"MHA (Hkv = {LITE['heads']})"]
    table = [[name, n, f"{n * LITE['layers'] / 2**10:.1f} KiB", f"{n / mha_bytes:.0%}"]
             for name, n in per_token.items()]
    story.table([say("label.layout"), say("label.per-layer"), say("label.per-model", layers=LITE["layers"]),
                 say("label.of-mha")], table, title=say("label.lite", **LITE))
    D = LITE["hidden"] // LITE["heads"]
    say.check("check.bytes-formula", per_token["MLA"] == (LITE["C"] + LITE["R"]) * 2
              and mha_bytes == 2 * LITE["heads"] * D * 2, f"MLA {per_token['MLA']} B, MHA {mha_bytes} B",
              C=LITE["C"], R=LITE["R"], H=LITE["heads"], D=D)
    say.check("check.between-gqa-and-mqa", per_token["MQA (Hkv = 1)"] < per_token["MLA"] < per_token["GQA (Hkv = 4)"],
              ", ".join(f"{k} {v} B" for k, v in per_token.items()))
    say.text("text.tradeoff")
