"""Memory order: what reshape and view read, what transpose changes, and when contiguous() is needed
(documents 000 and 001)."""
from __future__ import annotations

import math

import torch

from multihead.explain.story import Story
from multihead.explain.topics.base import Say, error_of, error_text, memory_order, stride_text, topic
from multihead.explain.topics.layout import decode, labelled_tensor, split_right


def row_major_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides a contiguous tensor of this shape has: each is the product of the sizes after it."""
    return tuple(math.prod(shape[i + 1:]) for i in range(len(shape)))


def shares_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    """True when a and b are views of the same storage (no copy was made)."""
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


def _layout_row(name: str, t: torch.Tensor) -> list:
    return [name, tuple(t.shape), t.stride(), t.is_contiguous(), t.flatten().tolist(), memory_order(t).tolist()]


@topic("memory-order", "000")
def memory_order_topic(story: Story, say: Say) -> None:
    cols = [say("tensor"), say("shape"), say("stride"),
            say("contiguous"), say("label.logical-order-flatten"),
            say("label.memory-order")]
    x = torch.arange(6).reshape(2, 3)           # (2, 3): the document's [[a, b, c], [d, e, f]]
    r = x.reshape(3, 2)
    t = x.t()
    say.heading("heading.document-s-2x3-example")
    say.code("code.x-torch-arange-6")
    story.table(cols, [_layout_row("x", x), _layout_row("x.reshape(3, 2)", r), _layout_row("x.t()", t)])
    say.check("check.contiguous-tensor-reshape-reads",
              r.flatten().tolist() == memory_order(x).tolist() and shares_memory(r, x))
    say.check("check.transpose-leaves-memory-untouched",
              shares_memory(t, x) and memory_order(t).tolist() == memory_order(x).tolist(),
              stride_text(story, x, t))
    rt = t.reshape(6)
    say.check("check.reshape-follows-logical-order",
              rt.tolist() == [0, 3, 1, 4, 2, 5] and not shares_memory(rt, x),
              say("detail.reshape-order", order=rt.tolist()))
    say.text("text.so-precise-rule-reshape")

    say.heading("heading.back-split-head-memory")
    lab = labelled_tensor(B=1, L=3, H=2, D=2)    # value = 100*token + 10*head + feature
    split = split_right(lab, 2)                  # (B, H, L, d), a view
    packed = split.contiguous()
    say.code("code.split-x-reshape-b")
    story.table(cols[:4] + [cols[5]], [r[:4] + [r[5]] for r in
                (_layout_row("x", lab), _layout_row("split", split), _layout_row("split.contiguous()", packed))])
    tokens_in_memory = [decode(v)[1] for v in memory_order(split).tolist()]
    say.check("check.after-reshape-transpose-memory",
              tokens_in_memory == sorted(tokens_in_memory) and shares_memory(split, lab),
              say("detail.tokens-in-memory", tokens_in_memory=tokens_in_memory))
    heads_in_memory = [decode(v)[2] for v in memory_order(packed).tolist()]
    say.check("check.only-contiguous-rewrites-memory",
              heads_in_memory == sorted(heads_in_memory),
              say("detail.heads-in-memory", heads_in_memory=heads_in_memory))
    say.check("check.split-result-not-contiguous", not split.is_contiguous(), stride_text(story, split))
    say.text("text.friendly-correction-document-000")


@topic("view-vs-contiguous", "001")
def view_vs_contiguous(story: Story, say: Say) -> None:
    b, n, H, d = 2, 6, 2, 2                      # document 001: batch 2, 6 tokens, 2 heads, dim_out 4
    q = torch.randn(b, n, H * d, generator=torch.Generator().manual_seed(123))
    say.heading("heading.what-contiguous-means")
    say.text("text.tensor-contiguous-when-walking")
    heads = q.view(b, n, H, d).transpose(1, 2)   # (b, H, n, d), a view of q
    # Attention weights = identity (each token sees only itself): the context is v's numbers, but in
    # the fresh (b, H, n, d) memory that a matmul writes.
    ctx = torch.eye(n) @ heads                   # (b, H, n, d), contiguous
    back = ctx.transpose(1, 2)                   # (b, n, H, d): not contiguous
    samples = {"q (b, n, dim_out)": q, "q.view(b, n, H, d)": q.view(b, n, H, d),
               "q.view(...).transpose(1, 2)": heads, "context = weights @ heads": ctx,
               "context.transpose(1, 2)": back, "q[:, ::2]": q[:, ::2], "q[:1]": q[:1]}
    say.code("code.heads-q-view-b")
    rows = [[k, tuple(v.shape), v.stride(), row_major_strides(tuple(v.shape)), v.is_contiguous()]
            for k, v in samples.items()]
    story.table([say("tensor"), say("shape"), say("stride"),
                 say("label.row-major-stride"), say("contiguous")], rows)
    say.check("check.contiguous-exactly-stride-row", all((r[2] == r[3]) == r[4] for r in rows))
    say.check("check.document-001-right-that",
              not heads.is_contiguous() and not back.is_contiguous() and not q[:, ::2].is_contiguous()
              and q[:1].is_contiguous())

    say.heading("heading.view-right-after-transpose")
    say.code("code.context-vecs-context-vecs")
    err = error_of(lambda: back.view(b, n, H * d))
    say.check("check.view-fails-runtimeerror-merging", isinstance(err, RuntimeError), error_text(err))
    merged = back.contiguous().view(b, n, H * d)
    story.code("context_vecs.contiguous().view(b, num_tokens, dim_out)")
    say.check("check.contiguous-copies-into-row",
              torch.allclose(merged, q) and not shares_memory(merged, back))
    split_last = back.view(b, n, H, d // 2, 2)   # (b, n, H, d/2, 2): only splits the last axis
    say.check("check.view-not-forbidden-every",
              shares_memory(split_last, back), stride_text(story, split_last))
    say.check("check.reshape-view-when-possible", torch.equal(back.reshape(b, n, H * d), merged))
    say.text("text.view-never-copies-only")


TOPICS = (memory_order_topic, view_vs_contiguous)
