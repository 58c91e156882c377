"""Walkthrough steps 9-11: merge the heads, the output projection, and the check against the fused path.

Shapes: B batch, H heads, L tokens, D head dim, O output features.
"""
from __future__ import annotations

import multihead as mh
from multihead.explain.say import walkthrough_say
from multihead.explain.story import Story
from multihead.explain.walkthrough.checks import check_close, head_columns_diff, max_diff, tolerance


def step_merge(story: Story, p) -> None:
    """(B, H, L, D) -transpose-> (B, L, H, D) -contiguous().view-> (B, L, H*D)."""
    B, L, H, D = p.dims
    ctx = p.t["ctx"]
    say = walkthrough_say(story, "merge")
    say.code("code")
    ctx_t = ctx.transpose(1, 2)  # (B, L, H, D)
    story.tensor("ctx.transpose(1, 2)", ctx_t, layout=True, dims="BLHD", tokens=p.setup.tokens)
    error = None
    try:
        ctx_t.view(B, L, H * D)
    except RuntimeError as exc:
        error = exc
    packed = ctx_t.contiguous()  # (B, L, H, D), row order
    merged = packed.view(B, L, H * D)  # (B, L, H*D)
    story.tensor("merged", merged, layout=True, rows=p.setup.tokens)
    say.text("why")
    split_heads_apart = L > 1 and H > 1
    say.check("check.view-raises", error is not None or not split_heads_apart,
              f"RuntimeError: {str(error).splitlines()[0][:50]}…" if error else "")
    say.check("check.copy", (packed.data_ptr() != ctx_t.data_ptr() or not split_heads_apart)
              and max_diff(ctx_t.reshape(B, L, H * D), merged) == 0.0)
    worst = head_columns_diff(ctx, merged)
    say.check("check.head-columns", worst == 0.0, f"max |diff| = {worst:.1e}")
    p.t["merged"] = merged


def step_out_proj(story: Story, p) -> None:
    """out (B, L, O) = out_proj(merged)."""
    m, merged = p.setup.module, p.t["merged"]
    story.code("out = attn.out_proj(merged)   # (B, L, H*D) -> (B, L, O)")
    out = m.out_proj(merged)  # (B, L, O)
    story.tensor("out", out, rows=p.setup.tokens)
    say = walkthrough_say(story, "out_proj")
    say.text("why")
    W, b = m.out_proj.weight, m.out_proj.bias
    check_close(say, "check.linear", out, merged @ W.T + (0 if b is None else b))
    expected = p.setup.expected
    if expected is not None:
        worst = max_diff(out, expected.expand_as(out))
        say.check("check.expected", worst <= 5e-5 + 1e-6, f"max |diff| = {worst:.1e}",
                  source=story.pick(*p.setup.expected_from))
    p.t["out"] = out


def step_verify(story: Story, p) -> None:
    """The same numbers from mh.attention (SDPA) and from the whole module in one call."""
    m, x, causal = p.setup.module, p.t["x"], p.setup.causal
    q, k, v = p.t["q_heads"], p.t["k_heads"], p.t["v_heads"]
    fused_line = f"fused = mh.attention(q, k, v, causal={causal}, backend=\"sdpa\")"
    module_line = f"y = attn(x, causal={causal})"
    say = walkthrough_say(story, "verify")
    say.code("code", fused=fused_line, module=module_line)
    fused = mh.attention(q, k, v, causal=causal, backend="sdpa")  # (B, H, L, D)
    y = m(x, causal=causal)  # (B, L, O)
    rows = [
        ["mh.attention(..., backend=\"sdpa\")", "ctx", f"{max_diff(fused, p.t['ctx']):.2e}"],
        ["mh.MultiHeadAttention", "out", f"{max_diff(y, p.t['out']):.2e}"],
    ]
    story.table([say("col.fused"), say("col.compared"), "max |diff|"], rows)
    say.text("why")
    check_close(say, "check.sdpa", fused, p.t["ctx"], tol=tolerance(p.t["ctx"]))
    check_close(say, "check.module", y, p.t["out"], tol=tolerance(p.t["out"]))
    p.t.update(fused=fused, y=y)
