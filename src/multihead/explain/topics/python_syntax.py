"""The Python side of document 002: unpacking x.size(), the `_` placeholder, and the `farward` typo."""
from __future__ import annotations

import torch
from torch import nn

from multihead.explain.story import Story
from multihead.explain.topics.base import Say, error_of, error_text, topic
from multihead.textbook import ClassicTransformerHeads


class ForwardTypo(nn.Module):
    """Document 002's slip: the method is spelled `farward`, so nn.Module finds no `forward`."""

    def __init__(self, d_model: int = 4):
        super().__init__()
        self.W_o = nn.Linear(d_model, d_model)

    def farward(self, Q: torch.Tensor) -> torch.Tensor:  # the typo, on purpose
        return self.W_o(Q)


class ForwardFixed(ForwardTypo):
    """The same module with the name fixed."""

    def forward(self, Q: torch.Tensor) -> torch.Tensor:
        return self.farward(Q)


def _two_names(x: torch.Tensor):
    a, b = x.size()  # x has three dims: ValueError
    return a, b


def _three_of_four(x: torch.Tensor):
    batch_size, _, seq_length = x.size()  # x has four dims: ValueError
    return batch_size, seq_length


def _repeat_underscore(x: torch.Tensor):
    batch_size, _, seq_length, _ = x.size()
    return batch_size, seq_length


def _starred(x: torch.Tensor):
    batch_size, _, seq_length, *rest = x.size()
    return rest


def call_errors() -> dict[str, BaseException | None]:
    """What calling the module, and calling `mask_fill`, really raise."""
    model, x = ForwardTypo(), torch.ones(1, 2, 4)
    return {"model(x)": error_of(lambda: model(x)),
            "scores.mask_fill(...)": error_of(lambda: x.mask_fill(x == 0, -1e9))}


def hooks_seen(model: nn.Module, call) -> int:
    """How many times a forward hook fires while `call()` runs."""
    seen = []
    handle = model.register_forward_hook(lambda *_: seen.append(1))
    try:
        call()
    finally:
        handle.remove()
    return len(seen)


@topic("size-unpacking", "002")
def size_unpacking(story: Story, say: Say) -> None:
    x = torch.zeros(2, 5, 8)                     # (batch_size, seq_length, d_model)
    size = x.size()
    say.heading("heading.x-size-tuple")
    story.code("x = torch.zeros(2, 5, 8)\nsize = x.size()   # torch.Size([2, 5, 8])")
    say.check("check.torch-size-subclass-tuple",
              isinstance(size, tuple) and size == x.shape,
              f"isinstance(x.size(), tuple) = {isinstance(size, tuple)}")
    batch_size, seq_length, d_model = x.size()
    say.code("code.batch-size-seq-length")
    story.table([say("label.name"), say("label.value"), say("label.same")],
                [["batch_size", batch_size, "x.size(0)"], ["seq_length", seq_length, "x.size(1)"],
                 ["d_model", d_model, "x.size(2)"]])
    say.check("check.names-are-filled-left",
              (batch_size, seq_length, d_model) == (x.size(0), x.size(1), x.size(2)) == (2, 5, 8))
    say.check("check.values-are-plain-python", all(type(v) is int for v in (batch_size, seq_length, d_model)))
    too_few = error_of(lambda: _two_names(x))
    say.check("check.number-names-must-match",
              isinstance(too_few, ValueError), "a, b = x.size() -> " + error_text(too_few))
    head_shape = x.shape[:-1]
    say.text("text.two-relatives-x-size")
    say.check("check.x-shape-1-2",
              tuple(head_shape) == (2, 5) and tuple(x.view(*head_shape, 2, 4).shape) == (2, 5, 2, 4))


@topic("underscore-placeholder", "002")
def underscore_placeholder(story: Story, say: Say) -> None:
    model = ClassicTransformerHeads(d_model=8, num_heads=2)
    x = torch.randn(3, 2, 5, 4, generator=torch.Generator().manual_seed(0))   # (B, H, L, d_k)
    batch_size, _, seq_length, d_k = x.size()
    story.code("batch_size, _, seq_length, d_k = x.size()   # x: (B=3, H=2, L=5, d_k=4)")
    say.check("check.ordinary-variable-here-holds",
              _ == 2 and (batch_size, seq_length, d_k) == (3, 5, 4), f"_ = {_}")
    missing = error_of(lambda: _three_of_four(x))
    say.check("check.leaving-d-k-out", isinstance(missing, ValueError), error_text(missing))
    say.check("check.may-repeat-rest-soaks", _repeat_underscore(x) == (3, 5) and _starred(x) == [4])
    say.text("text.gentle-correction-document-002")
    expected = x.transpose(1, 2).reshape(3, 5, 8)   # (B, L, H*d_k), computed without the class
    say.check("check.combine-heads-gives-same", torch.equal(model.combine_heads(x), expected))
    wrong = torch.randn(3, 2, 5, 3)             # d_k = 3, but the model expects 4
    err = error_of(lambda: model.combine_heads(wrong))
    say.check("check.what-d-k-could", isinstance(err, RuntimeError), error_text(err))


@topic("farward-typo", "002")
def farward_typo(story: Story, say: Say) -> None:
    say.code("code.class-multiheadattention-nn-module")
    errors = call_errors()
    err = errors["model(x)"]
    say.check("check.calling-model-raises-notimplementederror",
              isinstance(err, NotImplementedError), error_text(err))
    model, fixed, x = ForwardTypo(), ForwardFixed(), torch.ones(1, 2, 4)
    say.check("check.calling-model-farward-x",
              hooks_seen(model, lambda: model.farward(x)) == 0 and hooks_seen(fixed, lambda: fixed(x)) == 1)
    say.text("text.fix-one-document-gives")
    mask_err = errors["scores.mask_fill(...)"]
    say.check("check.same-document-writes-attn",
              isinstance(mask_err, AttributeError) and hasattr(torch.Tensor, "masked_fill"), error_text(mask_err))


TOPICS = (size_unpacking, underscore_placeholder, farward_typo)
