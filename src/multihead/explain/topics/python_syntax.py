"""The Python side of document 002: unpacking x.size(), the `_` placeholder, and the `farward` typo."""
from __future__ import annotations

import torch
from torch import nn

from multihead.explain.story import Story
from multihead.explain.topics.base import error_of, error_text, pick, topic
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


@topic("size-unpacking", "002",
       ("batch_size, seq_length, d_model = x.size(): how the names get their values",
        "batch_size, seq_length, d_model = x.size() 是怎么对应赋值的"),
       ("How does `batch_size, seq_length, d_model = x.size()` assign the three values?",
        "`batch_size, seq_length, d_model = x.size()` 这个是怎么进行对应赋值的？"))
def size_unpacking(story: Story) -> None:
    x = torch.zeros(2, 5, 8)                     # (batch_size, seq_length, d_model)
    size = x.size()
    story.heading("x.size() is a tuple", "x.size() 就是一个元组")
    story.code("x = torch.zeros(2, 5, 8)\nsize = x.size()   # torch.Size([2, 5, 8])")
    story.check("torch.Size is a subclass of tuple, and x.size() == x.shape",
                "torch.Size 是 tuple 的子类，而且 x.size() == x.shape",
                isinstance(size, tuple) and size == x.shape,
                f"isinstance(x.size(), tuple) = {isinstance(size, tuple)}")
    batch_size, seq_length, d_model = x.size()
    story.code(pick(story,
            "batch_size, seq_length, d_model = x.size()   # like a, b, c = (1, 2, 3)",
            "batch_size, seq_length, d_model = x.size()   # 就像 a, b, c = (1, 2, 3)"))
    story.table([pick(story, "name", "变量"), pick(story, "value", "值"), pick(story, "same as", "等于")],
                [["batch_size", batch_size, "x.size(0)"], ["seq_length", seq_length, "x.size(1)"],
                 ["d_model", d_model, "x.size(2)"]])
    story.check("Names are filled left to right: batch_size = x.size(0), seq_length = x.size(1), d_model = x.size(2)",
                "从左到右依次赋值：batch_size = x.size(0)，seq_length = x.size(1)，d_model = x.size(2)",
                (batch_size, seq_length, d_model) == (x.size(0), x.size(1), x.size(2)) == (2, 5, 8))
    story.check("The values are plain Python ints, ready for view(...)", "拿到的是普通的 Python 整数，可以直接交给 view(...)",
                all(type(v) is int for v in (batch_size, seq_length, d_model)))
    too_few = error_of(lambda: _two_names(x))
    story.check("The number of names must match the number of dimensions, or Python raises ValueError",
                "变量个数必须和维度个数一样多，否则 Python 会抛出 ValueError",
                isinstance(too_few, ValueError), "a, b = x.size() -> " + error_text(too_few))
    head_shape = x.shape[:-1]
    story.text("Two relatives: x.size(0) asks for one dimension (document 000), and x.shape[:-1] keeps all "
               "but the last, which document 003 uses to split heads with view(*head_shape, heads, d_k).",
               "两个近亲写法：x.size(0) 只取一个维度（文档 000）；x.shape[:-1] 取除最后一维外的所有维度，"
               "文档 003 就是用它配合 view(*head_shape, heads, d_k) 来拆分多头的。")
    story.check("x.shape[:-1] is (2, 5) and view(*head_shape, 2, 4) splits d_model into (heads, d_k)",
                "x.shape[:-1] 是 (2, 5)，view(*head_shape, 2, 4) 把 d_model 拆成 (heads, d_k)",
                tuple(head_shape) == (2, 5) and tuple(x.view(*head_shape, 2, 4).shape) == (2, 5, 2, 4))


@topic("underscore-placeholder", "002",
       ("The `_` in batch_size, _, seq_length, d_k = x.size(), and the unused d_k",
        "batch_size, _, seq_length, d_k = x.size() 里的 `_`，以及没用上的 d_k"),
       ("Why is there a `_` in `batch_size, _, seq_length, d_k = x.size()`, and what is the point of d_k "
        "if it is unused?",
        "`batch_size, _, seq_length, d_k = x.size()` 为什么空一个下划线？d_k 没有直接使用，意义是什么？"))
def underscore_placeholder(story: Story) -> None:
    model = ClassicTransformerHeads(d_model=8, num_heads=2)
    x = torch.randn(3, 2, 5, 4, generator=torch.Generator().manual_seed(0))   # (B, H, L, d_k)
    batch_size, _, seq_length, d_k = x.size()
    story.code("batch_size, _, seq_length, d_k = x.size()   # x: (B=3, H=2, L=5, d_k=4)")
    story.check("`_` is an ordinary variable: here it holds the head count 2; the name only says \"not used\"",
                "`_` 就是一个普通变量：这里它存的是头数 2；这个名字只是在说“我用不上它”",
                _ == 2 and (batch_size, seq_length, d_k) == (3, 5, 4), f"_ = {_}")
    missing = error_of(lambda: _three_of_four(x))
    story.check("Leaving d_k out is not allowed: four dimensions need four names",
                "不能把 d_k 省掉：四个维度就需要四个名字",
                isinstance(missing, ValueError), error_text(missing))
    story.check("`_` may repeat, and `*rest` soaks up the tail: both unpack without naming d_k",
                "`_` 可以重复使用，`*rest` 可以收走剩下的维度：两种写法都不必给 d_k 起名",
                _repeat_underscore(x) == (3, 5) and _starred(x) == [4])
    story.text("A gentle correction of document 002: it says d_k is used \"implicitly\" because view relies "
               "on self.d_model. It is not: combine_heads reads self.d_model from __init__, so the unpacked "
               "d_k is simply unused, and the result is the same whether or not we name it.",
               "对文档 002 的一点温和更正：它说 d_k 被“隐式使用”了，因为 view 依赖 self.d_model。其实不是："
               "combine_heads 读的是 __init__ 里的 self.d_model，解包出来的 d_k 根本没被用到，"
               "给不给它起名，结果都一样。")
    expected = x.transpose(1, 2).reshape(3, 5, 8)   # (B, L, H*d_k), computed without the class
    story.check("combine_heads gives the same (B, L, d_model) as a version that never unpacks d_k",
                "combine_heads 的结果，和一个完全不解包 d_k 的写法完全相同",
                torch.equal(model.combine_heads(x), expected))
    wrong = torch.randn(3, 2, 5, 3)             # d_k = 3, but the model expects 4
    err = error_of(lambda: model.combine_heads(wrong))
    story.check("What d_k could be used for: a shape check. Without it, a wrong d_k only surfaces as view's "
                "less helpful error",
                "d_k 的一个真实用处是做形状检查。不检查的话，d_k 不对时只会得到 view 的一条不太好懂的报错",
                isinstance(err, RuntimeError), error_text(err))


@topic("farward-typo", "002",
       ("The `farward` typo: what nn.Module really does", "拼写错误 `farward`：nn.Module 实际会怎样"),
       ("What happens when forward is misspelled `farward` (and `masked_fill` as `mask_fill`)?",
        "把 forward 写成 `farward`（以及把 `masked_fill` 写成 `mask_fill`）会发生什么？"))
def farward_typo(story: Story) -> None:
    story.code(pick(story,
            "class MultiHeadAttention(nn.Module):\n    def farward(self, Q, K, V, mask=None):   # typo\n        ...",
            "class MultiHeadAttention(nn.Module):\n    def farward(self, Q, K, V, mask=None):   # 拼写错误\n        ..."))
    errors = call_errors()
    err = errors["model(x)"]
    story.check("Calling the model raises NotImplementedError: nn.Module looks for a method named forward",
                "调用模型会抛出 NotImplementedError：nn.Module 只认名为 forward 的方法",
                isinstance(err, NotImplementedError), error_text(err))
    model, fixed, x = ForwardTypo(), ForwardFixed(), torch.ones(1, 2, 4)
    story.check("Calling model.farward(x) by hand runs, but skips hooks: none fire, while the fixed "
                "model(x) fires one",
                "手动调用 model.farward(x) 能跑，但会绕过钩子：一次也不触发；改好后的 model(x) 会触发一次",
                hooks_seen(model, lambda: model.farward(x)) == 0 and hooks_seen(fixed, lambda: fixed(x)) == 1)
    story.text("The fix is the one the document gives: rename it to forward. model(x) goes through "
               "nn.Module.__call__, which runs hooks and then self.forward.",
               "改法就是文档说的那样：改名为 forward。model(x) 会经过 nn.Module.__call__，"
               "它先处理钩子，再调用 self.forward。")
    mask_err = errors["scores.mask_fill(...)"]
    story.check("The same document writes attn_scores.mask_fill(...): tensors have no such method (AttributeError); "
                "the real name is masked_fill",
                "同一份文档里还写了 attn_scores.mask_fill(...)：张量没有这个方法（AttributeError），"
                "正确的名字是 masked_fill",
                isinstance(mask_err, AttributeError) and hasattr(torch.Tensor, "masked_fill"), error_text(mask_err))


TOPICS = (size_unpacking, underscore_placeholder, farward_typo)
