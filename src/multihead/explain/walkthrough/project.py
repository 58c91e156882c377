"""Walkthrough steps 1-3: the input, the Q/K/V projections, and splitting them into heads.

Each step reads and writes the pass's tensors `p.t` under the names its code shows.
Shapes: B batch, L tokens, E input features, H heads, D head dim.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from multihead.explain.say import walkthrough_say
from multihead.explain.story import Story
from multihead.explain.walkthrough.checks import check_close, head_columns_diff, tolerance


def step_input(story: Story, p) -> None:
    """x (B, L, E): one row of E numbers per token."""
    x = p.setup.x
    B, L, _, _ = p.dims
    say = walkthrough_say(story, "input")
    story.code(story.pick(*p.setup.input_code))
    story.tensor("x", x, rows=p.setup.tokens)
    say.text("why")
    say.check("check.shape", x.dim() == 3 and x.shape[1] == len(p.setup.tokens) and x.shape[0] == B,
              shape=tuple(x.shape), L=L)
    p.t["x"] = x


def step_project(story: Story, p) -> None:
    """q, k, v (B, L, H*D): one big Linear each, all heads at once."""
    m, x = p.setup.module, p.t["x"]
    _, _, H, D = p.dims
    say = walkthrough_say(story, "project")
    say.code("code")
    q, k, v = m.q_proj(x), m.k_proj(x), m.v_proj(x)
    for name, value in (("q", q), ("k", k), ("v", v)):
        story.tensor(name, value, rows=p.setup.tokens)
    say.text("why", HD=H * D, last=D - 1, D=D)
    W, b = m.q_proj.weight, m.q_proj.bias
    check_close(say, "check.linear", q, x @ W.T + (0 if b is None else b))
    rows = [slice(h * D, (h + 1) * D) for h in range(H)]
    small = torch.stack([F.linear(x, W[r], None if b is None else b[r]) for r in rows], dim=1)  # (B, H, L, D)
    worst = head_columns_diff(small, q)
    say.check("check.big-is-small", worst <= tolerance(q), f"max |diff| = {worst:.2e}", H=H)
    p.t.update(q=q, k=k, v=v)


def step_split(story: Story, p) -> None:
    """(B, L, H*D) -view-> (B, L, H, D) -transpose(1, 2)-> (B, H, L, D), no copy at all."""
    B, L, H, D = p.dims
    q = p.t["q"]
    say = walkthrough_say(story, "split")
    say.code("code")
    q_view = q.view(B, L, H, D)  # (B, L, H, D)
    q_heads = q_view.transpose(1, 2)  # (B, H, L, D)
    story.tensor("q", q, layout=True, rows=p.setup.tokens)
    story.tensor("q.view(B, L, H, D)", q_view, layout=True, dims="BLHD", tokens=p.setup.tokens)
    story.tensor("q.view(B, L, H, D).transpose(1, 2)", q_heads, layout=True, dims="BHLD", tokens=p.setup.tokens)
    say.text("why")
    say.check("check.no-copy", q_view.data_ptr() == q.data_ptr() == q_heads.data_ptr())
    say.check("check.not-contiguous", not q_heads.is_contiguous() or L == 1 or H == 1,
              strides=tuple(q_heads.stride()))
    worst = head_columns_diff(q_heads, q)
    say.check("check.head-columns", worst == 0.0, f"max |diff| = {worst:.1e}")
    k_heads = p.t["k"].view(B, L, H, D).transpose(1, 2)  # (B, H, L, D)
    v_heads = p.t["v"].view(B, L, H, D).transpose(1, 2)  # (B, H, L, D)
    p.t.update(q_heads=q_heads, k_heads=k_heads, v_heads=v_heads)

