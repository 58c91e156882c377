"""Gated attention (Qwen3-Next): the merged heads are multiplied by sigmoid(gate_proj(x)) before out_proj,
so each head feature of each token has a learned volume knob between 0 and 1.

Shapes: B batch, L tokens, E embed, H heads, D head dim.
"""
from __future__ import annotations

import torch

import multihead as mh
from multihead.explain.story import Story
from multihead.explain.topics.base import Say, diff_text, max_diff, topic

E, H, L = 16, 2, 5


def merged_heads(mod: mh.MultiHeadAttention, x: torch.Tensor) -> torch.Tensor:
    """The module's heads, merged, before any gate or output projection: (B, L, H*D)."""
    B = x.shape[0]
    q = mod.q_proj(x).view(B, L, H, -1).transpose(1, 2)  # (B, H, L, D)
    k = mod.k_proj(x).view(B, L, H, -1).transpose(1, 2)
    v = mod.v_proj(x).view(B, L, H, -1).transpose(1, 2)
    return mh.attention(q, k, v, causal=True).transpose(1, 2).reshape(B, L, -1)


@topic("gated-attention")
def gated_attention(story: Story, say: Say) -> None:
    torch.manual_seed(0)
    mod = mh.GatedMultiHeadAttention(E, H, causal=True, dtype=torch.float64)
    x = torch.randn(1, L, E, dtype=torch.float64)
    say.text("text.idea")
    say.code("code.gate")
    with torch.no_grad():
        heads = merged_heads(mod, x)  # (B, L, H*D)
        gate = torch.sigmoid(mod.gate_proj(x))  # (B, L, H*D)
        by_hand = mod.out_proj(heads * gate)
        out = mod(x)
    say.check("check.by-hand", max_diff(out, by_hand) < 1e-12, diff_text(out, by_hand))
    say.check("check.between", bool(((gate > 0) & (gate < 1)).all()),
              say("detail.range", low=float(gate.min()), high=float(gate.max())))
    story.table([say("label.token"), say("label.gate")],
                [[t, " ".join(f"{g:.2f}" for g in gate[0, t, :6])] for t in range(L)], title=say("label.gates"))
    say.heading("heading.off")
    with torch.no_grad():
        mod.gate_proj.bias.fill_(-60.0)  # sigmoid(-60) ~ 1e-26: every gate shut
        silent = mod(x)
    expected = mod.out_proj.bias.expand_as(silent)
    say.check("check.shut", max_diff(silent, expected) < 1e-12, diff_text(silent, expected))
    extra = mod.gate_proj.weight.numel() + mod.gate_proj.bias.numel()
    query = mod.q_proj.weight.numel() + mod.q_proj.bias.numel()
    say.check("check.cost", extra == query, say("detail.parameters", extra=extra, query=query), n=extra)
    say.text("text.closing")
