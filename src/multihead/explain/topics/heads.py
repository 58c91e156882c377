"""Heads and their cost: Linear(d_model, d_model) as H small projections (002), stacked vs split heads
(001), and parameters and FLOPs against the number of heads (004)."""
from __future__ import annotations

import collections
import statistics
import time

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

import multihead as mh
from multihead.explain.story import Story
from multihead.explain.topics.base import Say, diff_text, max_diff, topic
from multihead.textbook import ClassicTransformerHeads, FoldedBatchHeads, SplitHeads, StackedHeads

HEAD_COUNTS = (1, 2, 4, 8)


def param_count(module: nn.Module) -> int:
    return sum(p.numel() for p in module.parameters())


def small_projections(big: nn.Linear, num_heads: int) -> list[nn.Linear]:
    """Cut a Linear(E_in, H*D) into H Linear(E_in, D): head h owns output rows [h*D, (h+1)*D)."""
    D = big.out_features // num_heads
    heads = []
    for h in range(num_heads):
        small = nn.Linear(big.in_features, D, bias=big.bias is not None, dtype=big.weight.dtype)
        with torch.no_grad():
            small.weight.copy_(big.weight[h * D:(h + 1) * D])
            if big.bias is not None:
                small.bias.copy_(big.bias[h * D:(h + 1) * D])
        heads.append(small)
    return heads


def split_from_stacked(stacked: StackedHeads, context_length: int) -> SplitHeads:
    """Document 001's weight-split module holding exactly the stacked heads' weights (Wo = identity)."""
    first = stacked.heads[0]
    H, dim_in, d = len(stacked.heads), first.W_query.in_features, first.W_query.out_features
    split = SplitHeads(dim_in, H * d, context_length, 0.0, H)
    with torch.no_grad():
        for mine, theirs in (("Wq", "W_query"), ("Wk", "W_key"), ("Wv", "W_value")):
            # stack the heads' (d, dim_in) matrices on top of each other: (H*d, dim_in)
            getattr(split, mine).weight.copy_(torch.cat([getattr(h, theirs).weight for h in stacked.heads]))
        split.Wo.weight.copy_(torch.eye(H * d))
        split.Wo.bias.zero_()
    return split


MATMULS = ("linear", "matmul", "bmm", "__matmul__")


class _CallCounter(TorchFunctionMode):
    """Counts torch calls by name, and the FLOPs of the matrix multiplications (2 * outputs * inner size)."""

    def __init__(self):
        super().__init__()
        self.calls: collections.Counter[str] = collections.Counter()
        self.flops = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        self.calls[name] += 1
        out = func(*args, **(kwargs or {}))
        if name in MATMULS:
            self.flops += 2 * out.numel() * args[0].shape[-1]
        return out


def _counted(fn) -> _CallCounter:
    """Run fn() without gradients, counting its torch calls and matmul FLOPs."""
    with torch.no_grad(), _CallCounter() as counter:
        fn()
    return counter


def count_calls(fn) -> collections.Counter:
    """How many times each torch function (linear, matmul, softmax...) is called while fn() runs."""
    return _counted(fn).calls


def matmul_flops(fn) -> int:
    """Floating-point operations of the matrix multiplications (linear, matmul, bmm) run by fn()."""
    return _counted(fn).flops


def median_ms(fn, runs: int = 7) -> float:
    """Median wall time of fn() in milliseconds on one thread, after one warm-up call.

    One thread keeps the number stable on a busy machine; it is an illustration, not a benchmark.
    """
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with torch.no_grad():
            fn()
            times = []
            for _ in range(runs):
                start = time.perf_counter()
                fn()
                times.append((time.perf_counter() - start) * 1e3)
    finally:
        torch.set_num_threads(threads)
    return statistics.median(times)


def d2l_param_counts(num_hiddens: int = 16) -> dict[int, int]:
    """Document 004's module: parameter count for each number of heads, num_hiddens fixed."""
    return {H: param_count(FoldedBatchHeads(num_hiddens, num_hiddens, num_hiddens, num_hiddens, H, 0.0))
            for H in HEAD_COUNTS}


def claimed_param_counts(counts: dict[int, int], num_hiddens: int = 16) -> dict[int, int]:
    """Document 004's claim, taken at its word: Wq, Wk, Wv (num_hiddens x num_hiddens each, no bias)
    multiplied by the number of heads, W_o counted once, starting from the one-head module's count."""
    qkv = 3 * num_hiddens * num_hiddens
    return {H: counts[1] + (H - 1) * qkv for H in counts}


@topic("linear-d-model", "002")
def linear_d_model(story: Story, say: Say) -> None:
    d_model, H = 8, 2
    torch.manual_seed(0)
    model = ClassicTransformerHeads(d_model, H).double()
    x = torch.randn(2, 5, d_model, dtype=torch.float64)      # (B, L, d_model)
    say.text("text.input-rows-have-d")
    heads = small_projections(model.W_q, H)
    say.code("code.q-split-heads-w")
    Q = model.split_heads(model.W_q(x))
    say.check("check.one-linear-d-model",
              all(max_diff(Q[:, h], small(x)) < 1e-12 for h, small in enumerate(heads)))
    say.check("check.same-number-parameters-h", sum(param_count(s) for s in heads) == param_count(model.W_q))
    out = model(x, x, x)
    say.check("check.w-o-linear-d",
              out.shape == x.shape and (x + out).shape == x.shape, f"{say('shape')} {tuple(out.shape)}")
    say.text("text.d-model-out-convention")
    other = mh.MultiHeadAttention(d_model, H, head_dim=3).double()
    say.check("check.mh-multiheadattention-8-2",
              tuple(other.q_proj.weight.shape) == (6, 8) and other(x).shape == x.shape)


@topic("stacked-vs-split", "001")
def stacked_vs_split(story: Story, say: Say) -> None:
    dim_in, d, H, L = 4, 2, 3, 6
    torch.manual_seed(123)
    stacked = StackedHeads(dim_in, d, L, 0.0, num_heads=H)
    split = split_from_stacked(stacked, L)
    x = torch.randn(2, L, dim_in)                            # (B, L, dim_in)
    say.code("code.split-wq-weight-torch")
    say.check("check.stacked-heads-weights-piled",
              max_diff(stacked(x), split(x)) < 1e-6, diff_text(stacked(x), split(x)))
    calls_stacked, calls_split = count_calls(lambda: stacked(x)), count_calls(lambda: split(x))
    names = ("linear", "matmul", "softmax")
    story.table([say("label.call"), say("label.stacked"), say("label.split")],
                [[n, calls_stacked[n], calls_split[n]] for n in names],
                title=say("label.torch-calls-one-forward", H=H))
    say.check("check.stacked-runs-h-times",
              (calls_stacked["linear"], calls_stacked["matmul"], calls_stacked["softmax"]) == (3 * H, 2 * H, H)
              and (calls_split["linear"], calls_split["matmul"], calls_split["softmax"]) == (4, 2, 1), H=H)
    wo_flops = matmul_flops(lambda: split.Wo(torch.zeros(2, L, H * d)))
    say.check("check.yet-arithmetic-same-apart",
              matmul_flops(lambda: split(x)) - wo_flops == matmul_flops(lambda: stacked(x)))
    say.text("text.so-split-version-faster")
    big_H, big_d, big_L = 8, 4, 32
    big_stacked = StackedHeads(32, big_d, big_L, 0.0, num_heads=big_H)
    big_split = split_from_stacked(big_stacked, big_L)
    xb = torch.randn(4, big_L, 32)
    t_stacked, t_split = median_ms(lambda: big_stacked(xb)), median_ms(lambda: big_split(xb))
    story.table([say("label.version"), say("label.median-ms-7-runs")],
                [[say("label.stacked"), f"{t_stacked:.2f}"], [say("label.split"), f"{t_split:.2f}"]],
                title=f"B=4, L={big_L}, dim_in=32, H={big_H}, head_dim={big_d}")


def counts_text(say: Say, counts: dict[int, int]) -> str:
    """"parameters with 1, 2, 4, 8 heads: 1024, 1024, 1024, 1024" in the story's language."""
    separator = say.story.pick(", ", "、")
    return say("detail.counts", heads=separator.join(map(str, counts)),
               counts=separator.join(map(str, counts.values())))


@topic("param-count", "004")
def param_count_topic(story: Story, say: Say) -> None:
    num_hiddens = 16
    counts = d2l_param_counts(num_hiddens)
    ours = {H: param_count(mh.MultiHeadAttention(num_hiddens, H)) for H in HEAD_COUNTS}
    full_width = {H: param_count(StackedHeads(num_hiddens, num_hiddens, 4, 0.0, H)) for H in HEAD_COUNTS}
    say.text("text.document-004-s-last")
    claimed = claimed_param_counts(counts, num_hiddens)
    story.table(["num_heads", say("label.d2l-module"),
                 say("label.claimed-wq-wk-wv"),
                 "multihead", say("label.stacked-full-width-heads")],
                [[H, counts[H], claimed[H], ours[H], full_width[H]] for H in HEAD_COUNTS])
    say.check("check.fixed-num-hiddens-d2l",
              len(set(counts.values())) == 1 and counts[1] == 4 * num_hiddens * num_hiddens, counts_text(say, counts))
    top = HEAD_COUNTS[-1]
    say.check("check.so-claim-does-not",
              all(counts[H] != claimed[H] for H in HEAD_COUNTS if H > 1),
              top=top, claimed=claimed[top], counts=counts[top])
    say.check("check.same-holds-mh-multiheadattention", len(set(ours.values())) == 1, counts_text(say, ours))
    say.check("check.what-does-grow-heads", all(full_width[H] == full_width[1] * H for H in HEAD_COUNTS))
    say.text("text.each-head-does-own")


@topic("head-cost", "004")
def head_cost(story: Story, say: Say) -> None:
    num_hiddens, B, L = 16, 2, 8
    torch.manual_seed(0)
    x = torch.randn(B, L, num_hiddens)
    rows = {}
    for H in HEAD_COUNTS:
        model = FoldedBatchHeads(num_hiddens, num_hiddens, num_hiddens, num_hiddens, H, 0.0)
        flops = matmul_flops(lambda: model(x, x, x, None))
        rows[H] = (num_hiddens // H, param_count(model), flops, model.attention.attention_weights.numel())
    story.table(["num_heads", say("label.head-dim"), say("label.parameters"),
                 say("label.matmul-flops"), say("label.attention-weights")],
                [[H, *rows[H]] for H in HEAD_COUNTS], title=f"B={B}, L={L}, num_hiddens={num_hiddens}")
    say.check("check.parameters-matmul-flops-are",
              len({r[1] for r in rows.values()}) == 1 and len({r[2] for r in rows.values()}) == 1)
    say.check("check.what-grows-number-attention", all(rows[H][3] == B * H * L * L for H in HEAD_COUNTS))
    say.text("text.qk-t-costs-b")


TOPICS = (stacked_vs_split, linear_d_model, param_count_topic, head_cost)
