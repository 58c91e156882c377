"""Walkthrough steps 1-3: the input, the Q/K/V projections, and splitting them into heads.

Each step reads and writes the pass's tensors `p.t` under the names its code shows.
Shapes: B batch, L tokens, E input features, H heads, D head dim.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from multihead.explain.story import Story
from multihead.explain.walkthrough.checks import check_close, head_columns_diff, tolerance


def step_input(story: Story, p) -> None:
    """x (B, L, E): one row of E numbers per token."""
    x = p.setup.x
    B, L, _, _ = p.dims
    story.code(story.pick(*p.setup.input_code))
    story.tensor("x", x, rows=p.setup.tokens)
    story.text(
        "Why: each row is one token's vector; attention will build each output row as a mix of these rows.",
        "为什么：每一行是一个词元的向量；注意力的每一行输出，都是这些行按权重混合出来的。",
    )
    story.check(
        f"x has shape (B, L, E) = {tuple(x.shape)}, one row per token ({L} tokens).",
        f"x 的形状是 (B, L, E) = {tuple(x.shape)}，每个词元一行（共 {L} 个词元）。",
        x.dim() == 3 and x.shape[1] == len(p.setup.tokens) and x.shape[0] == B,
    )
    p.t["x"] = x


def step_project(story: Story, p) -> None:
    """q, k, v (B, L, H*D): one big Linear each, all heads at once."""
    m, x = p.setup.module, p.t["x"]
    _, _, H, D = p.dims
    story.code(story.pick(
        "q = attn.q_proj(x)   # x @ Wq.T (+ bias): (B, L, E) -> (B, L, H*D)\n"
        "k = attn.k_proj(x)\n"
        "v = attn.v_proj(x)",
        "q = attn.q_proj(x)   # x @ Wq.T（+ 偏置）：(B, L, E) -> (B, L, H*D)\n"
        "k = attn.k_proj(x)\n"
        "v = attn.v_proj(x)",
    ))
    q, k, v = m.q_proj(x), m.k_proj(x), m.v_proj(x)
    for name, value in (("q", q), ("k", k), ("v", v)):
        story.tensor(name, value, rows=p.setup.tokens)
    story.text(
        f"Why: one Linear of width H*D = {H * D} computes every head's projection in a single matrix "
        f"multiply; columns 0..{D - 1} belong to head 0, the next {D} to head 1, and so on.",
        f"为什么：一个宽度为 H*D = {H * D} 的 Linear 用一次矩阵乘法算出所有头的投影；"
        f"第 0..{D - 1} 列属于头 0，接下来的 {D} 列属于头 1，依此类推。",
    )
    W, b = m.q_proj.weight, m.q_proj.bias
    check_close(story, "q_proj(x) is exactly x @ Wq.T (+ bias).", "q_proj(x) 就是 x @ Wq.T（再加偏置）。",
                q, x @ W.T + (0 if b is None else b))
    rows = [slice(h * D, (h + 1) * D) for h in range(H)]
    small = torch.stack([F.linear(x, W[r], None if b is None else b[r]) for r in rows], dim=1)  # (B, H, L, D)
    worst = head_columns_diff(small, q)
    story.check(
        f"One big projection equals {H} small ones: head h's columns of q are x projected by rows "
        f"h*D..(h+1)*D-1 of Wq alone.",
        f"一个大投影等于 {H} 个小投影：q 中属于头 h 的那几列，正是只用 Wq 的第 h*D..(h+1)*D-1 行投影 x 的结果。",
        worst <= tolerance(q), f"max |diff| = {worst:.2e}",
    )
    p.t.update(q=q, k=k, v=v)


def step_split(story: Story, p) -> None:
    """(B, L, H*D) -view-> (B, L, H, D) -transpose(1, 2)-> (B, H, L, D), no copy at all."""
    B, L, H, D = p.dims
    q = p.t["q"]
    story.code(story.pick(
        "q = q.view(B, L, H, D)  # (B, L, H*D) -> (B, L, H, D): same memory\n"
        "q = q.transpose(1, 2)   # (B, L, H, D) -> (B, H, L, D): swaps 2 strides\n"
        "# k and v: the same two lines",
        "q = q.view(B, L, H, D)  # (B, L, H*D) -> (B, L, H, D)：还是同一块内存\n"
        "q = q.transpose(1, 2)   # (B, L, H, D) -> (B, H, L, D)：交换两个步幅\n"
        "# k 和 v 也是这两行",
    ))
    q_view = q.view(B, L, H, D)  # (B, L, H, D)
    q_heads = q_view.transpose(1, 2)  # (B, H, L, D)
    story.tensor("q", q, layout=True, rows=p.setup.tokens)
    story.tensor("q.view(B, L, H, D)", q_view, layout=True, dims="BLHD", tokens=p.setup.tokens)
    story.tensor("q.view(B, L, H, D).transpose(1, 2)", q_heads, layout=True, dims="BHLD", tokens=p.setup.tokens)
    story.text(
        "Why: view only relabels the same memory, and transpose swaps two strides, so each head becomes "
        "its own (L, D) matrix and all heads run in one batched matmul, without copying a number.",
        "为什么：view 只是给同一块内存换个形状，转置只交换两个步幅；这样每个头都成了自己的 (L, D) 矩阵，"
        "所有头可以用一次批量矩阵乘法并行计算，一个数都不用复制。",
    )
    story.check(
        "view and transpose share q's memory (same data pointer): no copy.",
        "view 和转置都与 q 共用同一块内存（数据指针相同）：没有复制。",
        q_view.data_ptr() == q.data_ptr() == q_heads.data_ptr(),
    )
    story.check(
        f"After transpose the tensor is not contiguous: strides {tuple(q_heads.stride())} no longer "
        "run in row order.",
        f"转置之后张量不再连续：步幅 {tuple(q_heads.stride())} 不再是按行排列的顺序。",
        not q_heads.is_contiguous() or L == 1 or H == 1,
    )
    worst = head_columns_diff(q_heads, q)
    story.check(
        "Head h is exactly columns h*D..(h+1)*D-1 of q: q_heads[:, h] == q[..., h*D:(h+1)*D].",
        "头 h 恰好就是 q 的第 h*D..(h+1)*D-1 列：q_heads[:, h] == q[..., h*D:(h+1)*D]。",
        worst == 0.0, f"max |diff| = {worst:.1e}",
    )
    k_heads = p.t["k"].view(B, L, H, D).transpose(1, 2)  # (B, H, L, D)
    v_heads = p.t["v"].view(B, L, H, D).transpose(1, 2)  # (B, H, L, D)
    p.t.update(q_heads=q_heads, k_heads=k_heads, v_heads=v_heads)

