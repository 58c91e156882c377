"""Splitting and merging heads: reshape, transpose(1, 2), and combine_heads (documents 000 and 002).

Every demo runs on a "labelled" tensor whose numbers say where they came from:
value = 1000*batch + 100*token + 10*head + feature, so a wrong split is visible at a glance.
"""
from __future__ import annotations

import torch

from multihead.explain.story import Story
from multihead.explain.topics.base import Say, error_of, error_text, stride_text, topic


def labelled_tensor(B: int = 1, L: int = 3, H: int = 2, D: int = 2) -> torch.Tensor:
    """(B, L, H*D) integer tensor with value 1000*b + 100*token + 10*head + feature (all sizes <= 10)."""
    b, t, h, f = torch.meshgrid(torch.arange(B), torch.arange(L), torch.arange(H), torch.arange(D), indexing="ij")
    return (1000 * b + 100 * t + 10 * h + f).reshape(B, L, H * D)  # (B, L, E)


def decode(value: float) -> tuple[int, int, int, int]:
    """(batch, token, head, feature) that a labelled value names."""
    v = int(value)
    return v // 1000, (v // 100) % 10, (v // 10) % 10, v % 10


def split_right(x: torch.Tensor, H: int) -> torch.Tensor:
    """(B, L, E) -> (B, H, L, D): reshape to (B, L, H, D), then swap L and H."""
    B, L, E = x.shape
    return x.reshape(B, L, H, E // H).transpose(1, 2)  # (B, H, L, D)


def split_wrong(x: torch.Tensor, H: int) -> torch.Tensor:
    """(B, L, E) -> (B, H, L, D) by one direct reshape: the shape is right, the content is not."""
    B, L, E = x.shape
    return x.reshape(B, H, L, E // H)  # (B, H, L, D), but cut in memory order


def misplaced(split: torch.Tensor) -> list[tuple[int, int, int, int]]:
    """Slots (b, h, t, f) of a split labelled tensor that hold a value from another token or head."""
    bad = []
    for b, h, t, f in torch.cartesian_prod(*(torch.arange(n) for n in split.shape)).tolist():
        if decode(split[b, h, t, f].item()) != (b, t, h, f):
            bad.append((b, h, t, f))
    return bad


def slot_sources(split: torch.Tensor, h: int) -> list[tuple[int, int]]:
    """The (token, head) pairs whose numbers landed in head slot h of batch 0, in slot order."""
    seen = []
    for value in split[0, h].flatten().tolist():
        _, token, head, _ = decode(value)
        if (token, head) not in seen:
            seen.append((token, head))
    return seen


def combine_heads(x: torch.Tensor) -> torch.Tensor:
    """(B, H, L, D) -> (B, L, H*D), document 002's way: transpose, contiguous, view."""
    B, H, L, D = x.size()
    return x.transpose(1, 2).contiguous().view(B, L, H * D)  # (B, L, E)


def _pairs(pairs: list[tuple[int, int]], say: Say) -> str:
    return ", ".join(say("label.token-head", token=t, head=h) for t, h in pairs)


@topic("reshape-then-transpose", "000")
def reshape_then_transpose(story: Story, say: Say) -> None:
    H = 2
    x = labelled_tensor(B=1, L=3, H=H, D=2)
    say.heading("heading.tensor-whose-numbers-say")
    say.text("text.each-number-100-token")
    story.code("x = 100*token + 10*head + feature   # (B=1, L=3, hidden=4), H=2, d=2")
    story.tensor("x (B, L, H*d)", x, layout=True)

    right, wrong = split_right(x, H), split_wrong(x, H)
    say.heading("heading.two-candidates")
    say.code("code.right-x-reshape-b")
    story.tensor(say("label.right-b-h-l"), right, layout=True, dims="BHLD")
    story.tensor(say("label.wrong-b-h-l"), wrong, layout=True, dims="BHLD")
    story.table([say("label.head-slot"), "reshape + transpose", "reshape(B, H, L, d)"],
                [[h, _pairs(slot_sources(right, h), say), _pairs(slot_sources(wrong, h), say)]
                 for h in range(H)],
                title=say("label.whose-numbers-land-each"))
    say.check("check.reshape-transpose-every-slot",
              not misplaced(right),
              say("detail.misplaced", misplaced=len(misplaced(right))))
    wrong_sources = slot_sources(wrong, 0)
    say.check("check.direct-reshape-mixes-heads",
              {h for _, h in wrong_sources} == {0, 1}, _pairs(wrong_sources, say))
    say.check("check.mixes-tokens-head-slot",
              decode(wrong[0, 0, 1, 0].item())[1] == 0, f"wrong[0, 0, 1] = {wrong[0, 0, 1].tolist()}")
    say.text("text.reshape-cuts-numbers-memory")
    say.text("text.gentle-correction-document-000")
    say.check("check.correct-split-head-1",
              [decode(v)[1:3] for v in right[0, 1, 0].tolist()] == [(0, 1)] * right.shape[-1],
              f"right[0, 1, 0] = {right[0, 1, 0].tolist()}")


@topic("split-heads-transpose", "002")
def split_heads_transpose(story: Story, say: Say) -> None:
    x = labelled_tensor(B=1, L=3, H=2, D=2)
    viewed = x.view(1, 3, 2, 2)                 # (B, L, H, d_k)
    turned = viewed.transpose(1, 2)             # (B, H, L, d_k)
    say.heading("heading.step-1-view-splits")
    story.code("viewed = x.view(batch_size, seq_length, num_heads, d_k)   # (1, 3, 2, 2)")
    story.tensor("viewed (B, L, H, d_k)", viewed, layout=True, dims="BLHD")
    say.heading("heading.step-2-transpose-1")
    story.code("turned = viewed.transpose(1, 2)   # (1, 2, 3, 2)")
    story.tensor("turned (B, H, L, d_k)", turned, layout=True, dims="BHLD")
    story.table([say("tensor"), say("shape"), say("stride"),
                 "is_contiguous()"],
                [["viewed", tuple(viewed.shape), viewed.stride(), viewed.is_contiguous()],
                 ["turned", tuple(turned.shape), turned.stride(), turned.is_contiguous()]])
    say.text("text.transpose-does-not-move")
    same = all(turned[b, h, t, k] == viewed[b, t, h, k]
               for b, h, t, k in torch.cartesian_prod(*(torch.arange(n) for n in turned.shape)).tolist())
    say.check("check.turned-b-h-t", same)
    say.check("check.no-copy-both-share",
              turned.data_ptr() == viewed.data_ptr() and turned.stride() == (12, 2, 4, 1)
              and viewed.stride() == (12, 4, 2, 1), stride_text(story, viewed, turned))
    say.check("check.transpose-1-2-permutation", torch.equal(turned, viewed.permute(0, 2, 1, 3)))
    big = torch.empty(2, 10, 512).view(2, 10, 8, 64).transpose(1, 2)
    say.check("check.document-s-example", tuple(big.shape) == (2, 8, 10, 64), f"{say('shape')} {tuple(big.shape)}")
    say.text("text.heads-now-sit-axis")


@topic("combine-heads", "002")
def combine_heads_topic(story: Story, say: Say) -> None:
    x = labelled_tensor(B=1, L=3, H=2, D=2)
    heads = split_right(x, 2).contiguous()       # stands for the attention output, (B, H, L, d_k)
    say.heading("heading.start-one-output-per")
    say.text("text.pretend-attention-output-our")
    story.tensor("heads (B, H, L, d_k)", heads, layout=True, dims="BHLD")
    say.heading("heading.1-transpose-1-2")
    turned = heads.transpose(1, 2)               # (B, L, H, d_k)
    story.tensor("heads.transpose(1, 2) (B, L, H, d_k)", turned, layout=True, dims="BLHD")
    say.check("check.after-transpose-tensor-no", not turned.is_contiguous(), stride_text(story, turned))
    say.heading("heading.2-view-needs-contiguous")
    err = error_of(lambda: turned.view(1, 3, 4))
    say.code("code.heads-transpose-1-2")
    say.check("check.view-right-after-transpose", isinstance(err, RuntimeError), error_text(err))
    packed = turned.contiguous()
    story.tensor("heads.transpose(1, 2).contiguous()", packed, layout=True)
    say.check("check.contiguous-copies-numbers-into",
              packed.is_contiguous() and packed.data_ptr() != turned.data_ptr(),
              stride_text(story, packed))
    say.check("check.tensor-that-already-contiguous", packed.contiguous() is packed)
    say.heading("heading.3-view-b-l")
    merged = combine_heads(heads)
    story.tensor("combined (B, L, d_model)", merged, layout=True)
    say.check("check.combine-heads-exactly-undoes", torch.equal(merged, x))
    say.check("check.transpose-1-2-reshape", torch.equal(heads.transpose(1, 2).reshape(1, 3, 4), merged))
    skipped = heads.reshape(1, 3, 4)             # the transpose forgotten: (B, H, L, d_k) read in memory order
    say.check("check.reshape-without-transpose-mixes", not torch.equal(skipped, merged)
              and not torch.equal(skipped[0, 0], x[0, 0]),
              say("detail.row-0", row=", ".join(str(int(n)) for n in skipped[0, 0].tolist())))
    say.text("text.reshape-view-when-strides")


TOPICS = (reshape_then_transpose, split_heads_transpose, combine_heads_topic)
