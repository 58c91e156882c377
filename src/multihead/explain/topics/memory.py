"""Memory order: what reshape and view read, what transpose changes, and when contiguous() is needed
(documents 000 and 001)."""
from __future__ import annotations

import math

import torch

from multihead.explain.story import Story
from multihead.explain.topics.base import error_of, error_text, memory_order, pick, stride_text, topic
from multihead.explain.topics.layout import decode, labelled_tensor, split_right


def row_major_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides a contiguous tensor of this shape has: each is the product of the sizes after it."""
    return tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))


def shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when a and b are views of the same storage (no copy was made)."""
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _layout_row(name: str, t: torch.Tensor) -> list:
    return [name, tuple(t.shape), t.stride(), t.is_contiguous(), t.flatten().tolist(), memory_order(t).tolist()]


@topic("memory-order", "000",
       ("How reshape reads memory order (and what transpose really changes)",
        "reshape 的工作原理：它按什么顺序读内存，transpose 又改变了什么"),
       ("How does reshape work, and what is the memory order after reshape, and after transpose?",
        "reshape 的工作原理是什么？reshape 之后、transpose 之后，内存顺序各是什么样的？"))
def memory_order_topic(story: Story) -> None:
    cols = [pick(story, "tensor", "张量"), pick(story, "shape", "形状"), pick(story, "stride", "步幅"),
            pick(story, "contiguous", "连续"), pick(story, "logical order (flatten)", "逻辑顺序 (flatten)"),
            pick(story, "memory order", "内存顺序")]
    x = torch.arange(6).reshape(2, 3)           # (2, 3): the document's [[a, b, c], [d, e, f]]
    r = x.reshape(3, 2)
    t = x.t()
    story.heading("The document's 2 x 3 example", "文档里 2 x 3 的例子")
    story.code(pick(story,
            "x = torch.arange(6).reshape(2, 3)   # a..f = 0..5\n"
            "r = x.reshape(3, 2)\n"
            "t = x.t()                            # transpose",
            "x = torch.arange(6).reshape(2, 3)   # a..f = 0..5\n"
            "r = x.reshape(3, 2)\n"
            "t = x.t()                            # 转置"))
    story.table(cols, [_layout_row("x", x), _layout_row("x.reshape(3, 2)", r), _layout_row("x.t()", t)])
    story.check("On a contiguous tensor, reshape reads the numbers in memory order and shares the memory",
                "对内存连续的张量，reshape 按内存顺序读数，而且和原张量共用同一块内存",
                r.flatten().tolist() == memory_order(x).tolist() and shares_memory(r, x))
    story.check("transpose leaves the memory untouched: x.t() has the same memory order as x",
                "transpose 完全不碰内存：x.t() 的内存顺序和 x 一模一样",
                shares_memory(t, x) and memory_order(t).tolist() == memory_order(x).tolist(),
                stride_text(story, x, t))
    rt = t.reshape(6)
    story.check("reshape follows the logical order, not memory: x.t().reshape(6) is [0, 3, 1, 4, 2, 5] "
                "and, since memory cannot be read that way, it makes a copy",
                "reshape 跟随的是逻辑顺序而不是内存：x.t().reshape(6) 得到 [0, 3, 1, 4, 2, 5]，"
                "而内存里不是这个顺序，所以它只能拷贝一份",
                rt.tolist() == [0, 3, 1, 4, 2, 5] and not shares_memory(rt, x), str(rt.tolist()))
    story.text("So the precise rule is: reshape reads elements in the tensor's logical row-major order. "
               "When that order matches memory (a contiguous tensor) it returns a view of the same memory; "
               "otherwise it copies. \"reshape never rearranges data\" is only true in the first case.",
               "所以准确的说法是：reshape 按张量的逻辑顺序（行优先）读元素。这个顺序恰好和内存一致时"
               "（内存连续的张量），它返回同一块内存的视图；不一致时就拷贝一份。"
               "“reshape 从不重排数据”只在前一种情况下成立。")

    story.heading("Back to split_head: the memory order after reshape, and after transpose",
                  "回到 split_head：reshape 之后与 transpose 之后的内存顺序")
    lab = labelled_tensor(B=1, L=3, H=2, D=2)    # value = 100*token + 10*head + feature
    split = split_right(lab, 2)                  # (B, H, L, d), a view
    packed = split.contiguous()
    story.code(pick(story,
            "# x: value = 100*token + 10*head + feature\n"
            "split = x.reshape(B, L, H, d).transpose(1, 2)\n"
            "packed = split.contiguous()",
            "# x：数值 = 100*词 + 10*头 + 特征\n"
            "split = x.reshape(B, L, H, d).transpose(1, 2)\n"
            "packed = split.contiguous()"))
    story.table(cols[:4] + [cols[5]], [r[:4] + [r[5]] for r in
                (_layout_row("x", lab), _layout_row("split", split), _layout_row("split.contiguous()", packed))])
    tokens_in_memory = [decode(v)[1] for v in memory_order(split).tolist()]
    story.check("After reshape + transpose the memory is still token after token (token 0's heads, then token 1's...)",
                "reshape + transpose 之后，内存里仍然是一个词接一个词（先词0的各个头，再词1的……）",
                tokens_in_memory == sorted(tokens_in_memory) and shares_memory(split, lab),
                pick(story, f"tokens in memory: {tokens_in_memory}", f"内存里依次是词：{tokens_in_memory}"))
    heads_in_memory = [decode(v)[2] for v in memory_order(packed).tolist()]
    story.check("Only contiguous() rewrites memory head after head (head 0 for all tokens, then head 1)",
                "只有 contiguous() 才会把内存改写成一个头接一个头（先所有词的头0，再头1）",
                heads_in_memory == sorted(heads_in_memory),
                pick(story, f"heads in memory: {heads_in_memory}", f"内存里依次是头：{heads_in_memory}"))
    story.check("The split result is not contiguous, so reshape + transpose does not keep memory contiguous",
                "拆分后的结果并不是内存连续的：reshape + transpose 并不能“保持数据连续性”",
                not split.is_contiguous(), stride_text(story, split))
    story.text("A friendly correction of document 000's second answer: it writes the same memory order "
               "(\"head 1 token 1 -> head 1 token 2 -> ...\") for both the direct reshape and reshape + "
               "transpose, and credits reshape with keeping the data contiguous. Measured: transpose never "
               "moves memory; after it the memory is still token by token, the tensor is simply not "
               "contiguous any more, and head-by-head memory only appears after contiguous() (or a reshape "
               "that has to copy). What makes the correct split correct is the logical order, not memory.",
               "对文档 000 第二个回答的一点友好更正：它给“直接 reshape”和“reshape + transpose”写了同样的"
               "内存顺序（头1的词1 → 头1的词2 → ……），还说 reshape 保证了数据连续。实际测量：transpose "
               "从不移动内存；转置之后内存里仍是一个词接一个词，只是张量不再连续了；"
               "要等到 contiguous()（或者一次不得不拷贝的 reshape）之后，内存才变成一个头接一个头。"
               "正确切分之所以正确，靠的是逻辑顺序，而不是内存顺序。")


@topic("view-vs-contiguous", "001",
       ("view, contiguous() and why view fails after transpose",
        "view 与 contiguous()：为什么转置之后 view 会报错"),
       ("Why does the weight-split version need contiguous() before view, and what does contiguous mean?",
        "权重分割实现里，为什么 view 之前要先 contiguous()？“内存连续”到底是什么意思？"))
def view_vs_contiguous(story: Story) -> None:
    b, n, H, d = 2, 6, 2, 2                      # document 001: batch 2, 6 tokens, 2 heads, dim_out 4
    q = torch.randn(b, n, H * d, generator=torch.Generator().manual_seed(123))
    story.heading("What \"contiguous\" means", "“内存连续”是什么意思")
    story.text("A tensor is contiguous when walking its elements in logical order walks memory one step at "
               "a time. Then every stride equals the product of the sizes after it.",
               "所谓内存连续，就是按逻辑顺序一个个走元素时，在内存里也恰好一步一步往前走。"
               "这时每个步幅都等于它后面各维大小的乘积。")
    heads = q.view(b, n, H, d).transpose(1, 2)   # (b, H, n, d), a view of q
    # Attention weights = identity (each token sees only itself): the context is v's numbers, but in
    # the fresh (b, H, n, d) memory that a matmul writes.
    ctx = torch.eye(n) @ heads                   # (b, H, n, d), contiguous
    back = ctx.transpose(1, 2)                   # (b, n, H, d): not contiguous
    samples = {"q (b, n, dim_out)": q, "q.view(b, n, H, d)": q.view(b, n, H, d),
               "q.view(...).transpose(1, 2)": heads, "context = weights @ heads": ctx,
               "context.transpose(1, 2)": back, "q[:, ::2]": q[:, ::2], "q[:1]": q[:1]}
    story.code(pick(story,
            "heads = q.view(b, n, H, d).transpose(1, 2)   # (b, H, n, d)\n"
            "# weights = identity here, so context holds q's numbers:\n"
            "context = weights @ heads",
            "heads = q.view(b, n, H, d).transpose(1, 2)   # (b, H, n, d)\n"
            "# 这里权重取单位矩阵，所以 context 装的就是 q 的数：\n"
            "context = weights @ heads"))
    rows = [[k, tuple(v.shape), v.stride(), row_major_strides(tuple(v.shape)), v.is_contiguous()]
            for k, v in samples.items()]
    story.table([pick(story, "tensor", "张量"), pick(story, "shape", "形状"), pick(story, "stride", "步幅"),
                 pick(story, "row-major stride", "行优先步幅"), pick(story, "contiguous", "连续")], rows)
    story.check("is_contiguous() is exactly \"stride == row-major stride\" for each tensor above",
                "对上表每个张量，is_contiguous() 恰好等价于“步幅 == 行优先步幅”",
                all((r[2] == r[3]) == r[4] for r in rows))
    story.check("Document 001 is right that transposes and some slices break contiguity (q[:, ::2]); "
                "a slice of whole leading rows (q[:1]) stays contiguous",
                "文档 001 说得对：转置和某些切片（q[:, ::2]）会破坏连续性；"
                "而只取前面整行的切片（q[:1]）仍然连续",
                not heads.is_contiguous() and not back.is_contiguous() and not q[:, ::2].is_contiguous()
                and q[:1].is_contiguous())

    story.heading("view right after transpose", "转置之后直接 view")
    story.code(pick(story,
            "context_vecs = context_vecs.transpose(1, 2)   # (b, num_tokens, H, head_dim)\n"
            "context_vecs.view(b, num_tokens, dim_out)      # without contiguous()",
            "context_vecs = context_vecs.transpose(1, 2)   # (b, num_tokens, H, head_dim)\n"
            "context_vecs.view(b, num_tokens, dim_out)      # 不调用 contiguous()"))
    err = error_of(lambda: back.view(b, n, H * d))
    story.check("view fails with a RuntimeError: merging (H, head_dim) would need one stride, but the "
                "transposed memory has two",
                "view 抛出 RuntimeError：把 (H, head_dim) 合成一维需要一个统一的步幅，而转置后的内存给不出",
                isinstance(err, RuntimeError), error_text(err))
    merged = back.contiguous().view(b, n, H * d)
    story.code("context_vecs.contiguous().view(b, num_tokens, dim_out)")
    story.check("contiguous() copies into row-major memory, then view works and returns q's numbers",
                "contiguous() 先按行优先拷贝一份，然后 view 就能成功，并且得到的正是 q 的数据",
                torch.allclose(merged, q) and not shares_memory(merged, back))
    split_last = back.view(b, n, H, d // 2, 2)   # (b, n, H, d/2, 2): only splits the last axis
    story.check("view is not forbidden on every non-contiguous tensor: splitting the last axis of the "
                "transposed tensor works, because that can still be described by strides",
                "并不是所有不连续的张量都不能 view：把转置后张量的最后一维再拆开就可以，因为这仍然能用步幅描述",
                shares_memory(split_last, back), stride_text(story, split_last))
    story.check("reshape = view when possible, otherwise contiguous().view: same numbers here",
                "reshape = 能 view 就 view，不能就 contiguous().view：这里结果完全一样",
                torch.equal(back.reshape(b, n, H * d), merged))
    story.text("view never copies: it only reinterprets strides, so it refuses shapes that memory cannot "
               "express. contiguous() pays for one copy to make any shape possible again. That is why "
               "document 001 writes context_vecs.contiguous().view(...) after the transpose.",
               "view 从不拷贝，它只是重新解释步幅，所以内存表达不了的形状它就拒绝。contiguous() "
               "花一次拷贝的代价，让任何形状都重新变得可行。这就是文档 001 在转置之后写 "
               "context_vecs.contiguous().view(...) 的原因。")


TOPICS = (memory_order_topic, view_vs_contiguous)
