"""DeepSeek V4's K = V head, the last part of the sparse-attention topic: one head of D features is the key
and the value of every query head, so a cache stores each token once; and since the values then carry
the keys' RoPE turn, each head's output is turned back at its query's position, which leaves every value
turned by the distance j - i alone. Plain torch, checked against mh.SharedKVAttention and the caches.

Shapes: B batch, L tokens, E embed dim, H heads, D head dim, R rotary features (the last R of D), W window.
"""
from __future__ import annotations

import torch

import multihead as mh
from multihead.layers.compressor import CompressorState
from multihead.explain.story import Story
from multihead.explain.topics.base import Say, diff_text, max_diff
from multihead.caches.latent import LatentCache
from multihead.caches.shared_kv import SharedKVCache

# DeepSeek V4-Flash (transformers' DeepseekV4Config defaults): heads, head dim D, rotary R, window W,
# compressed-sparse rate m, indexer head dim Di, entries kept; DeepSeek V3's latent C and rotary key R3
# (V3.2 adds an indexer key of Di32); Mistral 7B's GQA: Hkv heads of Dg
V4 = {"H": 64, "D": 512, "R": 64, "W": 128, "m": 4, "Di": 128, "topk": 512}
V3 = {"C": 512, "R3": 64, "Di32": 128}
GQA = {"Hkv": 8, "Dg": 128}
BASE = 10000.0


def small_v4(W: int = 6) -> mh.SharedKVAttention:
    """A float64 sliding-window V4 layer small enough to print: 4 heads of 16 features, the last 8 turned."""
    layer = mh.SharedKVAttention(32, 4, 16, q_lora_rank=12, rope=mh.RoPE(8, BASE, interleaved=True), window=W,
                                 o_groups=2, o_lora_rank=8, dtype=torch.float64).eval()
    with torch.no_grad():
        layer.sinks.copy_(torch.linspace(-1.0, 1.0, layer.num_heads))     # sinks start at 0; any values do
    return layer


def turn_last(x: torch.Tensor, positions: torch.Tensor, R: int, back: bool = False) -> torch.Tensor:
    """RoPE on the last R features of x (..., L, D), interleaved pairs (a, b) turned by position · base^(-2j/R)
    (minus that with back=True), the angles in x's dtype."""
    inv_freq = 1.0 / BASE ** (torch.arange(0, R, 2, dtype=x.dtype) / R)           # (R/2,)
    angles = positions[:, None].to(x.dtype) * inv_freq * (-1 if back else 1)      # (L, R/2)
    cos, sin = angles.cos(), angles.sin()
    a, b = x[..., -R::2], x[..., -R + 1::2]                                        # (..., L, R/2) each
    turned = torch.stack((a * cos - b * sin, a * sin + b * cos), dim=-1).flatten(-2)
    return torch.cat((x[..., :-R], turned), dim=-1)


def shared_kv_by_hand(layer: mh.SharedKVAttention, x: torch.Tensor, start: int = 0,
                      turn_back: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    """A sliding V4 layer's attention written out for x (B, L, E) at positions start ... start + L - 1:
    (per-head output before o_a_proj (B, H, L, D), the K = V rows (B, 1, L, D))."""
    B, L, _ = x.shape
    H, D, R, W = layer.num_heads, layer.head_dim, layer.rope.head_dim, layer.window
    positions = start + torch.arange(L)
    q = layer.q_b_proj(layer.q_a_norm(layer.q_a_proj(x))).view(B, L, H, D).transpose(1, 2)   # (B, H, L, D)
    q = q * torch.rsqrt(q.square().mean(-1, keepdim=True) + layer.norm_eps)                 # RMS, no weight
    kv = layer.kv_norm(layer.kv_proj(x))[:, None]                                            # (B, 1, L, D): one head
    q, kv = turn_last(q, positions, R), turn_last(kv, positions, R)
    scores = q @ kv.transpose(-1, -2) * layer.scale                                          # kv as the keys
    i, j = positions[:, None], positions[None, :]
    scores = scores.masked_fill(~((j <= i) & (j > i - W)), float("-inf"))                   # causal, last W
    sink = layer.sinks.view(1, H, 1, 1).expand(B, H, L, 1)
    weights = torch.softmax(torch.cat((scores, sink), dim=-1), dim=-1)[..., :-1]            # sinks take the rest
    out = weights @ kv                                                                        # kv as the values
    return (turn_last(out, positions, R, back=True) if turn_back else out), kv


def project_out(layer: mh.SharedKVAttention, out: torch.Tensor) -> torch.Tensor:
    """The grouped low-rank output projection: (B, H, L, D) -> (B, L, E)."""
    B, _, L, _ = out.shape
    grouped = out.transpose(1, 2).reshape(B, L, layer.o_a_proj.groups, -1)                   # (B, L, G, H·D / G)
    return layer.o_b_proj(layer.o_a_proj(grouped).flatten(2))


def per_token_bytes(M: int = 16, dtype: torch.dtype = torch.bfloat16) -> dict[str, float]:
    """Bytes one more token costs each cache (one layer, one sequence), from real caches' buffers at the
    released sizes: M tokens' worth of rows, divided by M (V4's window by its W - 1 rows)."""
    D, R, W, m, Di = V4["D"], V4["R"], V4["W"], V4["m"], V4["Di"]
    gqa = mh.KVCache(1, M, GQA["Hkv"], GQA["Dg"], dtype=dtype)
    mqa = mh.KVCache(1, M, 1, D, dtype=dtype)
    mla = LatentCache(1, M, V3["C"], V3["R3"], dtype=dtype)
    v32 = LatentCache(1, M, V3["C"], V3["R3"], index_dim=V3["Di32"], dtype=dtype)
    window = SharedKVCache(1, M, D, W, dtype=dtype)
    csa = SharedKVCache(1, M, D, W, rate=m, dtype=dtype, compressor=CompressorState(1, M // m, D, m, True, dtype=dtype),
                        indexer=CompressorState(1, M // m, Di, m, True, dtype=dtype))
    return {"gqa": (gqa.keys.nbytes + gqa.values.nbytes) / M, "mqa": (mqa.keys.nbytes + mqa.values.nbytes) / M,
            "mla": mla.bytes_per_token(), "v32": v32.bytes_per_token(), "v4": window.window.nbytes / (W - 1),
            "csa": (csa.compressor.entries.nbytes + csa.indexer.entries.nbytes) / M}


def tell_shared_kv(story: Story, say: Say) -> None:
    """V4's layer by hand against the module, its cache rows, bytes per token, and the turn back."""
    say.heading("heading.shared-kv")
    say.text("text.shared-kv", **V4)
    say.code("code.shared-kv")
    layer = small_v4()
    B, L = 1, 10
    x = torch.randn(B, L, layer.embed_dim, dtype=torch.float64)                # (B, L, E)
    cache = layer.new_cache(B, L)
    with torch.no_grad():
        out, kv = shared_kv_by_hand(layer, x)
        mine, theirs = project_out(layer, out), layer(x)
        layer(x, cache=cache)
    say.check("check.v4-by-hand", max_diff(mine, theirs) < 1e-6, diff_text(mine, theirs), H=layer.num_heads,
              D=layer.head_dim)
    kept = kv[:, :, -(layer.window - 1):]
    buffers = dict(cache.named_buffers())
    say.check("check.cache-holds-rows", buffers.keys() == {"window", "lengths"}
              and max_diff(cache.window_rows(), kept) < 1e-6, f"{', '.join(buffers)}: window "
              f"{tuple(cache.window.shape)}; {diff_text(cache.window_rows(), kept)}", kept=layer.window - 1)

    bytes_ = per_token_bytes()
    D, Di, m, C, R3, Hkv, Dg = V4["D"], V4["Di"], V4["m"], V3["C"], V3["R3"], GQA["Hkv"], GQA["Dg"]
    rows = [("gqa", f"{Hkv} × ({Dg} + {Dg})"), ("mqa", f"{D} + {D}"), ("mla", f"{C} + {R3}"),
            ("v32", f"{C} + {R3} + {V3['Di32']}"), ("v4", f"{D}"), ("csa", f"({D} + {Di}) / {m}")]
    story.table([say("label.cache"), say("label.numbers"), say("label.bytes")],
                [[say(f"label.{name}"), numbers, f"{bytes_[name]:,.0f}"] for name, numbers in rows],
                title=say("label.bytes-title"))
    say.check("check.once", bytes_["v4"] == D * 2 and bytes_["mqa"] == 2 * bytes_["v4"]
              and bytes_["v4"] < bytes_["mla"] < bytes_["gqa"], f"{bytes_['v4']:,.0f} B = {D} · 2; "
              f"{bytes_['mqa']:,.0f} B = 2 · {D} · 2", D=D, **{k: f"{bytes_[k]:,.0f}" for k in ("v4", "mla", "gqa")})
    say.check("check.past-window", bytes_["csa"] == (D + Di) / m * 2, f"({D} + {Di}) / {m} · 2 = {bytes_['csa']:g} B",
              D=D, Di=Di, m=m,
              W=V4["W"], topk=V4["topk"])

    say.heading("heading.turn-back")
    say.text("text.turn-back")
    R, shift = layer.rope.head_dim, 1000
    with torch.no_grad():
        here, _ = shared_kv_by_hand(layer, x)
        there, _ = shared_kv_by_hand(layer, x, start=shift)
        raw_here, _ = shared_kv_by_hand(layer, x, turn_back=False)
        raw_there, _ = shared_kv_by_hand(layer, x, start=shift, turn_back=False)
    moved = max_diff(raw_here[..., -R:], raw_there[..., -R:])
    say.check("check.raw-moves", moved > 0.1 and max_diff(raw_here[..., :-R], raw_there[..., :-R]) < 1e-12,
              f"[..., -R:]: max |diff| = {moved:.2f}; [..., :-R]: {diff_text(raw_here[..., :-R], raw_there[..., :-R])}",
              shift=shift, R=R)
    say.check("check.turned-back-stays", max_diff(here, there) < 1e-12, diff_text(here, there), shift=shift,
              next=shift + 1)
    value = torch.randn(1, 1, 1, layer.head_dim, dtype=torch.float64)          # one value row (B, 1, 1, D)
    i, j = 7, 4
    carried = turn_last(turn_last(value, torch.tensor([j]), R), torch.tensor([i]), R, back=True)
    distance = turn_last(value, torch.tensor([j - i]), R)
    say.check("check.relative-turn", max_diff(carried, distance) < 1e-12, diff_text(carried, distance), i=i, j=j,
              d=j - i)
