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
from multihead.explain.topics.base import diff_text, max_diff, pick, topic
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


@topic("linear-d-model", "002",
       ("Why Linear(d_model, d_model): one big projection is H small ones",
        "为什么是 Linear(d_model, d_model)：一个大投影就是 H 个小投影"),
       ("Why are W_q, W_k, W_v `nn.Linear(d_model, d_model)`?", "`self.W_q = nn.Linear(d_model, d_model)` 为什么是这两个参数？"))
def linear_d_model(story: Story) -> None:
    d_model, H = 8, 2
    torch.manual_seed(0)
    model = ClassicTransformerHeads(d_model, H).double()
    x = torch.randn(2, 5, d_model, dtype=torch.float64)      # (B, L, d_model)
    story.text("The input rows have d_model numbers, so in_features = d_model. The output is cut into H heads "
               "of d_k = d_model / H numbers each, so out_features = H * d_k = d_model.",
               "输入的每一行有 d_model 个数，所以 in_features = d_model。输出要切成 H 个头，每个头 "
               "d_k = d_model / H 个数，所以 out_features = H * d_k = d_model。")
    heads = small_projections(model.W_q, H)
    story.code(pick(story,
            "Q = split_heads(W_q(x))          # (B, H, L, d_k)\n"
            "small_h = Linear(d_model, d_k)   # holding rows h*d_k:(h+1)*d_k of W_q",
            "Q = split_heads(W_q(x))          # (B, H, L, d_k)\n"
            "small_h = Linear(d_model, d_k)   # 权重取 W_q 的第 h*d_k:(h+1)*d_k 行"))
    Q = model.split_heads(model.W_q(x))
    story.check("One Linear(d_model, d_model) followed by split_heads equals H separate Linear(d_model, d_k), "
                "one per head (float64)",
                "一个 Linear(d_model, d_model) 再 split_heads，等于 H 个独立的 Linear(d_model, d_k)，每个头一个（float64）",
                all(max_diff(Q[:, h], small(x)) < 1e-12 for h, small in enumerate(heads)))
    story.check("…with the same number of parameters: H * (d_model * d_k + d_k) = d_model * d_model + d_model",
                "……参数个数也一样：H * (d_model * d_k + d_k) = d_model * d_model + d_model",
                sum(param_count(s) for s in heads) == param_count(model.W_q))
    out = model(x, x, x)
    story.check("W_o = Linear(d_model, d_model) glues the heads back: the output is (B, L, d_model), ready for x + out",
                "W_o = Linear(d_model, d_model) 把各个头拼回去：输出是 (B, L, d_model)，可以直接做残差 x + out",
                out.shape == x.shape and (x + out).shape == x.shape, str(tuple(out.shape)))
    story.text("d_model out is a convention, not a law. Document 003's PrepareForMultiHeadAttention projects to "
               "heads * d_k, and multihead lets you pick head_dim; only W_o has to map back to d_model.",
               "输出取 d_model 是一种约定，而不是定律。文档 003 的 PrepareForMultiHeadAttention 投影到 "
               "heads * d_k，multihead 也允许你自己指定 head_dim；只有 W_o 必须映射回 d_model。")
    other = mh.MultiHeadAttention(d_model, H, head_dim=3).double()
    story.check("mh.MultiHeadAttention(8, 2, head_dim=3): q_proj is Linear(8, 6), and the output is still (B, L, 8)",
                "mh.MultiHeadAttention(8, 2, head_dim=3)：q_proj 是 Linear(8, 6)，输出仍然是 (B, L, 8)",
                tuple(other.q_proj.weight.shape) == (6, 8) and other(x).shape == x.shape)


@topic("stacked-vs-split", "001",
       ("Stacked heads vs weight-split heads: the same function, fewer calls", "堆叠实现与权重分割实现：同一个函数，更少的调用"),
       ("Stacked heads and weight-split heads: are they the same, and why is the split version faster?",
        "多头注意力的堆叠实现和权重分割实现是一回事吗？为什么权重分割更高效？"))
def stacked_vs_split(story: Story) -> None:
    dim_in, d, H, L = 4, 2, 3, 6
    torch.manual_seed(123)
    stacked = StackedHeads(dim_in, d, L, 0.0, num_heads=H)
    split = split_from_stacked(stacked, L)
    x = torch.randn(2, L, dim_in)                            # (B, L, dim_in)
    story.code(pick(story,
            "# the heads' weights, one on top of the other; the same for Wk, Wv\n"
            "split.Wq.weight = torch.cat([head.W_query.weight for head in stacked.heads])\n"
            "split.Wo = identity",
            "# 把各个头的权重上下叠起来；Wk、Wv 同理\n"
            "split.Wq.weight = torch.cat([head.W_query.weight for head in stacked.heads])\n"
            "split.Wo = 单位矩阵"))
    story.check("With the stacked heads' weights piled into one Wq/Wk/Wv, the split module gives the same output",
                "把各个头的权重上下叠成一个大的 Wq/Wk/Wv 之后，权重分割版本的输出与堆叠版本相同",
                max_diff(stacked(x), split(x)) < 1e-6, diff_text(stacked(x), split(x)))
    calls_stacked, calls_split = count_calls(lambda: stacked(x)), count_calls(lambda: split(x))
    names = ("linear", "matmul", "softmax")
    story.table([pick(story, "call", "调用"), pick(story, "stacked", "堆叠"), pick(story, "split", "权重分割")],
                [[n, calls_stacked[n], calls_split[n]] for n in names],
                title=pick(story, f"torch calls for one forward pass, H = {H}", f"一次前向传播中的 torch 调用次数，H = {H}"))
    story.check(f"Stacked runs {H} times the projections, matmuls and softmaxes, one head after another "
                "(split: 3 projections + Wo, 2 matmuls, 1 softmax for all heads)",
                f"堆叠版本的投影、矩阵乘法和 softmax 调用次数是 {H} 倍，一个头接一个头地串行执行"
                "（权重分割：3 次投影 + Wo，2 次矩阵乘法，1 次 softmax 就覆盖所有头）",
                (calls_stacked["linear"], calls_stacked["matmul"], calls_stacked["softmax"]) == (3 * H, 2 * H, H)
                and (calls_split["linear"], calls_split["matmul"], calls_split["softmax"]) == (4, 2, 1))
    wo_flops = matmul_flops(lambda: split.Wo(torch.zeros(2, L, H * d)))
    story.check("Yet the arithmetic is the same: apart from Wo, both do exactly the same matmul FLOPs",
                "但计算量是一样的：除去 Wo，两者的矩阵乘法 FLOPs 完全相同",
                matmul_flops(lambda: split(x)) - wo_flops == matmul_flops(lambda: stacked(x)))
    story.text("So the split version is faster because it launches fewer, bigger operations: every call has "
               "a fixed overhead (Python, dispatch, a kernel launch on a GPU), and one big matmul keeps the "
               "hardware busier than H small ones. Below, a timing on this machine, as an illustration only.",
               "所以权重分割更快，是因为它发起的运算更少、每次更大：每次调用都有固定开销（Python、分派、"
               "GPU 上的内核启动），一次大矩阵乘法也比 H 次小乘法更能让硬件忙起来。下面是在本机上的计时，仅作示意。")
    big_H, big_d, big_L = 8, 4, 32
    big_stacked = StackedHeads(32, big_d, big_L, 0.0, num_heads=big_H)
    big_split = split_from_stacked(big_stacked, big_L)
    xb = torch.randn(4, big_L, 32)
    t_stacked, t_split = median_ms(lambda: big_stacked(xb)), median_ms(lambda: big_split(xb))
    story.table([pick(story, "version", "实现"), pick(story, "median ms (7 runs, 1 thread)", "耗时中位数，毫秒（7 次，单线程）")],
                [[pick(story, "stacked", "堆叠"), f"{t_stacked:.2f}"], [pick(story, "split", "权重分割"), f"{t_split:.2f}"]],
                title=f"B=4, L={big_L}, dim_in=32, H={big_H}, head_dim={big_d}")


@topic("param-count", "004",
       ("The parameter count does not grow with the number of heads", "参数量并不随头数增长"),
       ("Does multi-head attention multiply the trainable parameters by num_heads?",
        "多头注意力的可训练参数，是不是变成了 Wq*num_heads、Wk*num_heads、Wv*num_heads？"))
def param_count_topic(story: Story) -> None:
    num_hiddens = 16
    counts = d2l_param_counts(num_hiddens)
    ours = {H: param_count(mh.MultiHeadAttention(num_hiddens, H)) for H in HEAD_COUNTS}
    full_width = {H: param_count(StackedHeads(num_hiddens, num_hiddens, 4, 0.0, H)) for H in HEAD_COUNTS}
    story.text("Document 004's last answers agree that the parameters become Wq*num_heads, Wk*num_heads, "
               "Wv*num_heads. Let us simply count them, for num_hiddens = 16.",
               "文档 004 后面的回答认同“参数变成了 Wq*num_heads、Wk*num_heads、Wv*num_heads”。"
               "我们不妨实际数一数，取 num_hiddens = 16。")
    claimed = claimed_param_counts(counts, num_hiddens)
    story.table(["num_heads", pick(story, "d2l module", "d2l 的模块"),
                 pick(story, "claimed: Wq, Wk, Wv x heads", "文中说法：Wq、Wk、Wv 乘以头数"),
                 "multihead", pick(story, "stacked full-width heads", "堆叠全宽度的头")],
                [[H, counts[H], claimed[H], ours[H], full_width[H]] for H in HEAD_COUNTS])
    story.check("For fixed num_hiddens the d2l module has the same parameter count for 1, 2, 4 and 8 heads",
                "num_hiddens 固定时，d2l 模块在 1、2、4、8 个头下的参数量完全相同",
                len(set(counts.values())) == 1 and counts[1] == 4 * num_hiddens * num_hiddens, str(counts))
    top = HEAD_COUNTS[-1]
    story.check(f"So the claim does not hold: with {top} heads it predicts {top} times the Wq, Wk, Wv, "
                f"{claimed[top]} parameters in all; the module has {counts[top]}",
                f"所以这个说法并不成立：按它的说法，{top} 个头时 Wq、Wk、Wv 要变成 {top} 倍，"
                f"总共 {claimed[top]} 个参数；而模块实际只有 {counts[top]} 个",
                all(counts[H] != claimed[H] for H in HEAD_COUNTS if H > 1))
    story.check("The same holds for mh.MultiHeadAttention (with biases)", "mh.MultiHeadAttention（带偏置）也是如此",
                len(set(ours.values())) == 1, str(ours))
    story.check("What does grow with the heads is stacking full-width heads (each head its own num_hiddens-wide "
                "Wq, Wk, Wv): that is the design the answer describes, not d2l's",
                "真正随头数增长的，是把全宽度的头堆起来（每个头都有自己 num_hiddens 宽的 Wq、Wk、Wv）："
                "那个回答描述的其实是这种设计，而不是 d2l 的",
                all(full_width[H] == full_width[1] * H for H in HEAD_COUNTS))
    story.text("Each head does own its weights, but only a slice: head h uses rows h*d:(h+1)*d of the one W_q. "
               "More heads means thinner slices of the same matrix, not more matrices.",
               "每个头确实有“自己的”权重，但只是一个切片：头 h 用的是同一个 W_q 的第 h*d 到 (h+1)*d 行。"
               "头越多，切片越薄，矩阵还是那一个，并没有变多。")


@topic("head-cost", "004",
       ("Why keep num_hiddens fixed: the cost does not depend on the number of heads", "为什么总隐藏单元数保持不变：代价与头数无关"),
       ("Why is the total number of hidden units kept the same when the heads change?",
        "为什么总隐藏单元数量要保持不变？"))
def head_cost(story: Story) -> None:
    num_hiddens, B, L = 16, 2, 8
    torch.manual_seed(0)
    x = torch.randn(B, L, num_hiddens)
    rows = {}
    for H in HEAD_COUNTS:
        model = FoldedBatchHeads(num_hiddens, num_hiddens, num_hiddens, num_hiddens, H, 0.0)
        flops = matmul_flops(lambda: model(x, x, x, None))
        rows[H] = (num_hiddens // H, param_count(model), flops, model.attention.attention_weights.numel())
    story.table(["num_heads", pick(story, "head dim", "头维度"), pick(story, "parameters", "参数量"),
                 pick(story, "matmul FLOPs", "矩阵乘法 FLOPs"), pick(story, "attention weights", "注意力权重个数")],
                [[H, *rows[H]] for H in HEAD_COUNTS], title=f"B={B}, L={L}, num_hiddens={num_hiddens}")
    story.check("Parameters and matmul FLOPs are identical for 1, 2, 4 and 8 heads",
                "参数量和矩阵乘法 FLOPs 在 1、2、4、8 个头下完全相同",
                len({r[1] for r in rows.values()}) == 1 and len({r[2] for r in rows.values()}) == 1)
    story.check("What grows is the number of attention weights: B * H * L * L, one L x L map per head",
                "增长的是注意力权重的个数：B * H * L * L，每个头一张 L x L 的图",
                all(rows[H][3] == B * H * L * L for H in HEAD_COUNTS))
    story.text("QK^T costs B * H * L * L * (num_hiddens / H) multiply-adds: the H cancels. Keeping num_hiddens "
               "fixed makes the number of heads almost free, so it can be chosen for what the heads learn "
               "(several different attention patterns instead of one), not for the budget. The document's "
               "answer about expressive power is fair; this is the concrete, measurable reason.",
               "QK^T 的乘加次数是 B * H * L * L * (num_hiddens / H)，H 正好约掉。保持 num_hiddens 不变，"
               "头数几乎就成了“免费”的选择：可以按头能学到什么（几种不同的注意力模式，而不是一种）来选，"
               "而不用考虑预算。文档里关于表达能力的回答有道理，这里给出的是具体、可测量的原因。")


TOPICS = (stacked_vs_split, linear_d_model, param_count_topic, head_cost)
