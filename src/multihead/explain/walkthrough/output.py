"""Walkthrough steps 9-11: merge the heads, the output projection, and the check against the fused path.

Shapes: B batch, H heads, L tokens, D head dim, O output features.
"""
from __future__ import annotations

import multihead as mh
from multihead.explain.story import Story
from multihead.explain.walkthrough.checks import check_close, head_columns_diff, max_diff, tolerance


def step_merge(story: Story, p) -> None:
    """(B, H, L, D) -transpose-> (B, L, H, D) -contiguous().view-> (B, L, H*D)."""
    B, L, H, D = p.dims
    ctx = p.t["ctx"]
    story.code(story.pick(
        "ctx = ctx.transpose(1, 2)      # (B, H, L, D) -> (B, L, H, D): not contiguous\n"
        "ctx.view(B, L, H * D)          # RuntimeError: view needs compatible strides\n"
        "merged = ctx.contiguous().view(B, L, H * D)   # copy into row order, then view\n"
        "# the same as ctx.reshape(B, L, H * D), which copies only when it must",
        "ctx = ctx.transpose(1, 2)      # (B, H, L, D) -> (B, L, H, D)：不再连续\n"
        "ctx.view(B, L, H * D)          # RuntimeError：步幅无法合并，view 做不到\n"
        "merged = ctx.contiguous().view(B, L, H * D)   # 先按行拷贝成连续的，再 view\n"
        "# 等同于 ctx.reshape(B, L, H * D)：它只在必要时才拷贝",
    ))
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
    story.text(
        "Why: merging undoes the split, putting the heads back side by side in the last dimension; "
        "view can only do that once the numbers lie in row order, which is what contiguous() makes.",
        "为什么：合并多头是拆分的逆操作，把各个头重新并排放进最后一维；只有数据在内存中按行排列时 view "
        "才能做到，contiguous() 正是负责把它变成连续的。",
    )
    split_heads_apart = L > 1 and H > 1
    story.check(
        "view on the transposed tensor raises RuntimeError (its strides cannot be merged).",
        "直接对转置后的张量调用 view 会抛出 RuntimeError（它的步幅无法合并）。",
        error is not None or not split_heads_apart,
        f"RuntimeError: {str(error).splitlines()[0][:50]}…" if error else "",
    )
    story.check(
        "contiguous() made a copy in new memory; reshape gives exactly the same merged tensor.",
        "contiguous() 在新的内存里复制了一份；reshape 得到完全相同的合并结果。",
        (packed.data_ptr() != ctx_t.data_ptr() or not split_heads_apart)
        and max_diff(ctx_t.reshape(B, L, H * D), merged) == 0.0,
    )
    worst = head_columns_diff(ctx, merged)
    story.check(
        "Head h's output sits in columns h*D..(h+1)*D-1 of merged, the same columns it came from.",
        "头 h 的输出位于 merged 的第 h*D..(h+1)*D-1 列，正是它拆分前所在的那几列。",
        worst == 0.0, f"max |diff| = {worst:.1e}",
    )
    p.t["merged"] = merged


def step_out_proj(story: Story, p) -> None:
    """out (B, L, O) = out_proj(merged)."""
    m, merged = p.setup.module, p.t["merged"]
    story.code("out = attn.out_proj(merged)   # (B, L, H*D) -> (B, L, O)")
    out = m.out_proj(merged)  # (B, L, O)
    story.tensor("out", out, rows=p.setup.tokens)
    story.text(
        "Why: the output projection mixes the heads' results, so every output feature can draw on every head.",
        "为什么：输出投影把各个头的结果混合起来，让每个输出特征都能用上所有头的信息。",
    )
    W, b = m.out_proj.weight, m.out_proj.bias
    check_close(story, "out_proj(merged) is exactly merged @ Wo.T (+ bias).",
                "out_proj(merged) 就是 merged @ Wo.T（再加偏置）。", out, merged @ W.T + (0 if b is None else b))
    expected = p.setup.expected
    if expected is not None:
        en, zh = p.setup.expected_from
        worst = max_diff(out, expected.expand_as(out))
        story.check(
            f"The output matches {en} (to their 4 decimals).",
            f"输出与{zh}一致（精确到它给出的 4 位小数）。",
            worst <= 5e-5 + 1e-6, f"max |diff| = {worst:.1e}",
        )
    p.t["out"] = out


def step_verify(story: Story, p) -> None:
    """The same numbers from mh.attention (SDPA) and from the whole module in one call."""
    m, x, causal = p.setup.module, p.t["x"], p.setup.causal
    q, k, v = p.t["q_heads"], p.t["k_heads"], p.t["v_heads"]
    fused_line = f"fused = mh.attention(q, k, v, causal={causal}, backend=\"sdpa\")"
    module_line = f"y = attn(x, causal={causal})"
    story.code(story.pick(
        f"# steps 4-8 in one fused kernel:\n{fused_line}\n# steps 2-10 in one call of the module:\n{module_line}",
        f"# 第 4–8 步，一个融合内核就能完成：\n{fused_line}\n# 第 2–10 步，调用一次模块就能完成：\n{module_line}",
    ))
    fused = mh.attention(q, k, v, causal=causal, backend="sdpa")  # (B, H, L, D)
    y = m(x, causal=causal)  # (B, L, O)
    rows = [
        ["mh.attention(..., backend=\"sdpa\")", "ctx", f"{max_diff(fused, p.t['ctx']):.2e}"],
        ["mh.MultiHeadAttention", "out", f"{max_diff(y, p.t['out']):.2e}"],
    ]
    story.table([story.pick("fused path", "融合实现"), story.pick("compared with", "对照"), "max |diff|"], rows)
    story.text(
        "Why: the fused kernel never stores the (L, L) weights it does not need to, so it is the one to "
        "use; the step-by-step path above is how it is defined.",
        "为什么：融合内核不需要把 (L, L) 的权重矩阵存下来，实际使用时应该调用它；上面一步步算出来的，正是它的定义。",
    )
    check_close(
        story,
        f"mh.attention with SDPA gives the same ctx as steps 4-8 (tolerance {tolerance(p.t['ctx']):.0e}).",
        f"用 SDPA 的 mh.attention 与第 4–8 步得到的 ctx 相同（容差 {tolerance(p.t['ctx']):.0e}）。",
        fused, p.t["ctx"],
    )
    check_close(
        story,
        f"mh.MultiHeadAttention with the same weights gives the same output (tolerance {tolerance(p.t['out']):.0e}).",
        f"同样权重的 mh.MultiHeadAttention 给出相同的输出（容差 {tolerance(p.t['out']):.0e}）。",
        y, p.t["out"],
    )
    p.t.update(fused=fused, y=y)
