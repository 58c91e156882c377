"""Attention scores: K.transpose(-2, -1), document 003's einsum, and the 1/sqrt(d_k) scale."""
from __future__ import annotations

import math

import torch

from multihead.explain.story import Story
from multihead.explain.topics.base import error_of, error_text, max_diff, pick, stride_text, topic
from multihead.textbook import SeqFirstEinsumHeads


def _randn(*shape: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def scores_by_loops(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """(B, H, Lq, D), (B, H, Lk, D) -> (B, H, Lq, Lk): every entry its own dot product, no matmul."""
    B, H, Lq, _ = q.shape
    out = torch.empty(B, H, Lq, k.shape[2], dtype=q.dtype)
    for b, h, i, j in torch.cartesian_prod(*(torch.arange(n) for n in out.shape)).tolist():
        out[b, h, i, j] = torch.dot(q[b, h, i], k[b, h, j])
    return out


def einsum_as_matmul(query: torch.Tensor, key: torch.Tensor) -> torch.Tensor:
    """The einsum 'ibhd,jbhd->ijbh' done as a batched matmul: (Lq, B, H, D), (Lk, B, H, D) -> (Lq, Lk, B, H)."""
    q = query.permute(1, 2, 0, 3)                # (B, H, Lq, D)
    k = key.permute(1, 2, 3, 0)                  # (B, H, D, Lk)
    return (q @ k).permute(2, 3, 0, 1)           # (B, H, Lq, Lk) -> (Lq, Lk, B, H)


def saturation(d_k: int, scaled: bool, rows: int = 128, keys: int = 16, seed: int = 0) -> dict[str, float]:
    """Softmax over `keys` random scores q.k with unit-variance q, k of size d_k, with or without 1/sqrt(d_k).

    Returns the scores' std, the mean largest weight, the mean entropy (nats) and the mean |gradient|
    that reaches the scores through the softmax (for a random upstream gradient).
    """
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, d_k, generator=g)
    k = torch.randn(rows, keys, d_k, generator=g)
    upstream = torch.randn(rows, keys, generator=g)
    scores = torch.einsum("rd,rkd->rk", q, k) / (math.sqrt(d_k) if scaled else 1.0)   # (rows, keys)
    scores.requires_grad_(True)
    weights = scores.softmax(dim=-1)
    (weights * upstream).sum().backward()
    entropy = -(weights * weights.clamp_min(1e-30).log()).sum(-1).mean()
    return {"std": scores.std().item(), "max_weight": weights.max(-1).values.mean().item(),
            "entropy": entropy.item(), "grad": scores.grad.abs().mean().item()}


@topic("k-transpose", "002",
       ("Why K.transpose(-2, -1) in matmul(Q, K^T)", "为什么计算注意力分数时要 K.transpose(-2, -1)"),
       ("Why is K transposed with `K.transpose(-2, -1)` in `torch.matmul(Q, K.transpose(-2, -1))`?",
        "`attn_scores = torch.matmul(Q, K.transpose(-2, -1))` 为什么要这样转置？"))
def k_transpose(story: Story) -> None:
    Q, K = _randn(1, 2, 3, 4, seed=1), _randn(1, 2, 5, 4, seed=2)   # (B, H, Lq=3, d_k), (B, H, Lk=5, d_k)
    story.heading("Both Q and K are (B, H, L, d_k)", "Q 和 K 的形状都是 (B, H, L, d_k)")
    story.code("Q: (1, 2, 3, 4)   K: (1, 2, 5, 4)\ntorch.matmul(Q, K)")
    err = error_of(lambda: torch.matmul(Q, K))
    story.check("Without the transpose, matmul refuses: (3 x 4) @ (5 x 4) has inner sizes 4 and 5",
                "不转置的话 matmul 会报错：(3 x 4) @ (5 x 4) 的内侧维度 4 和 5 对不上",
                isinstance(err, RuntimeError), error_text(err))
    Kt = K.transpose(-2, -1)                     # (B, H, d_k, Lk)
    scores = torch.matmul(Q, Kt)                 # (B, H, Lq, Lk)
    story.code(pick(story,
            "Kt = K.transpose(-2, -1)          # (1, 2, 4, 5): swap the last two axes\n"
            "scores = torch.matmul(Q, Kt)      # (1, 2, 3, 5)",
            "Kt = K.transpose(-2, -1)          # (1, 2, 4, 5)：交换最后两维\n"
            "scores = torch.matmul(Q, Kt)      # (1, 2, 3, 5)"))
    story.tensor("scores (B, H, Lq, Lk)", scores)
    story.check("scores[b, h, i, j] is the dot product of query i with key j (checked entry by entry, float64)",
                "scores[b, h, i, j] 就是第 i 个查询与第 j 个键的点积（逐个元素核对，float64）",
                max_diff(scores, scores_by_loops(Q, K)) < 1e-12)
    story.check("The leading (B, H) axes are a batch: matmul multiplies the last two axes for every head",
                "前面的 (B, H) 两维都当作批量：matmul 对每个头分别乘最后两维",
                tuple(scores.shape) == (1, 2, 3, 5) and max_diff(scores[0, 1], Q[0, 1] @ K[0, 1].T) < 1e-12)
    story.check("The transpose is a free view (no copy): same memory, strides swapped",
                "这个转置只是一个视图，不拷贝数据：内存相同，步幅对调",
                Kt.data_ptr() == K.data_ptr() and Kt.stride()[-2:] == K.stride()[-2:][::-1],
                stride_text(story, K, Kt))
    story.check("transpose(-1, -2) (document 000) and transpose(2, 3) (document 001) are the same thing on 4-D K",
                "transpose(-1, -2)（文档 000）和 transpose(2, 3)（文档 001）对 4 维的 K 是同一回事",
                torch.equal(K.transpose(-1, -2), Kt) and torch.equal(K.transpose(2, 3), Kt))
    flipped = torch.matmul(K, Q.transpose(-2, -1))   # (B, H, Lk, Lq)
    story.check("Order matters: K @ Q^T gives the transposed scores (keys as rows), so a softmax over the last "
                "axis would normalise over queries instead of keys",
                "顺序很重要：K @ Q^T 得到的是转置后的分数（每行是一个键），这时对最后一维做 softmax "
                "就变成对查询归一化了，而不是对键",
                torch.equal(flipped, scores.transpose(-2, -1)))
    story.text("In maths, QK^T pairs every query row with every key row. Both are stored as rows of d_k "
               "numbers, so K has to be turned into columns first: (Lq, d_k) @ (d_k, Lk) -> (Lq, Lk), "
               "one score per (query, key) pair.",
               "数学上 QK^T 是让每个查询行与每个键行配对做点积。两者都按“每行 d_k 个数”存放，"
               "所以要先把 K 转成按列排：(Lq, d_k) @ (d_k, Lk) → (Lq, Lk)，每一对（查询，键）得到一个注意力分数。")


@topic("einsum-scores", "003",
       ("The einsum 'ibhd,jbhd->ijbh', and that it equals the batched matmul",
        "爱因斯坦求和 'ibhd,jbhd->ijbh' 是怎么算的，以及它和批量矩阵乘法完全相同"),
       ("How does `torch.einsum('ibhd,jbhd->ijbh', query, key)` compute the scores?",
        "`torch.einsum('ibhd,jbhd->ijbh', query, key)` 是怎么计算注意力分数的？"))
def einsum_scores(story: Story) -> None:
    model = SeqFirstEinsumHeads(heads=2, d_model=8, dropout_prob=0.0).double()
    query, key = _randn(2, 1, 2, 4, seed=3), _randn(3, 1, 2, 4, seed=4)   # the document's i=2, j=3, b=1, h=2, d=4
    scores = model.get_score(query, key)         # (i, j, b, h)
    story.heading("The document's example: i=2, j=3, b=1, h=2, d=4", "文档里的例子：i=2, j=3, b=1, h=2, d=4")
    story.code("# query (2, 1, 2, 4), key (3, 1, 2, 4)\nscores = torch.einsum('ibhd,jbhd->ijbh', query, key)")
    story.check("The result has shape (i, j, b, h) = (2, 3, 1, 2)", "结果的形状是 (i, j, b, h) = (2, 3, 1, 2)",
                tuple(scores.shape) == (2, 3, 1, 2), str(tuple(scores.shape)))
    by_hand = sum(query[1, 0, 1, d] * key[2, 0, 1, d] for d in range(4))
    story.check("scores[i, j, b, h] = sum over d of query[i, b, h, d] * key[j, b, h, d] (entry [1, 2, 0, 1] by hand)",
                "scores[i, j, b, h] = 对 d 求和 query[i, b, h, d] * key[j, b, h, d]（手算 [1, 2, 0, 1] 这一项）",
                abs(scores[1, 2, 0, 1].item() - by_hand.item()) < 1e-12, f"{scores[1, 2, 0, 1].item():.6f}")
    story.heading("The rule: letters missing from the output are summed", "规则：输出里没有的字母就求和")
    story.text("b and h appear in both inputs and in the output, so they are simply lined up, like a batch. "
               "d appears in both inputs but not in the output, so it is summed away: that is the dot product. "
               "i and j each appear in one input and both survive, giving every (query, key) pair. "
               "A small clarification to the document: repeating a letter does not by itself mean summing; "
               "leaving it out of the output does.",
               "b 和 h 在两个输入和输出里都出现，所以只是对齐，相当于批量维。d 在两个输入里出现、"
               "输出里没有，所以被求和消掉：这就是点积。i 和 j 各在一个输入里出现，都保留下来，"
               "于是得到每一对（查询，键）。对文档的一点补充：字母重复并不意味着求和，"
               "真正决定求和的是它有没有出现在输出里。")
    kept_d = torch.einsum("ibhd,jbhd->ijbhd", query, key)
    story.check("Keeping d in the output ('->ijbhd') and summing it afterwards gives the same scores",
                "在输出里保留 d（'->ijbhd'），事后再对 d 求和，得到的分数完全一样",
                max_diff(kept_d.sum(-1), scores) < 1e-12)
    story.check("The einsum equals the batched matmul (B, H, Lq, D) @ (B, H, D, Lk), permuted to (i, j, b, h)",
                "这个 einsum 与批量矩阵乘法 (B, H, Lq, D) @ (B, H, D, Lk) 再换成 (i, j, b, h) 的顺序完全相等",
                max_diff(einsum_as_matmul(query, key), scores) < 1e-12)
    attn = model.softmax(scores)                 # nn.Softmax(dim=1): over j, the keys
    story.check("In this (i, j, b, h) layout the keys are axis 1, so nn.Softmax(dim=1) makes each query's "
                "weights sum to 1, exactly as softmax(-1) does in the (b, h, i, j) layout",
                "在 (i, j, b, h) 这种排列里，键在第 1 维，所以 nn.Softmax(dim=1) 让每个查询的权重之和为 1，"
                "和 (b, h, i, j) 排列下的 softmax(-1) 完全一致",
                max_diff(attn.sum(dim=1), torch.ones(2, 1, 2)) < 1e-12
                and max_diff(attn, scores.permute(2, 3, 0, 1).softmax(-1).permute(2, 3, 0, 1)) < 1e-12)
    value = _randn(3, 1, 2, 4, seed=5)
    out = torch.einsum("ijbh,jbhd->ibhd", attn, value)
    ref = (attn.permute(2, 3, 0, 1) @ value.permute(1, 2, 0, 3)).permute(2, 0, 1, 3)   # (i, b, h, d)
    story.check("The second einsum 'ijbh,jbhd->ibhd' sums over j: the weighted sum of values, same as weights @ V",
                "第二个 einsum 'ijbh,jbhd->ibhd' 对 j 求和：就是对值做加权求和，与 weights @ V 相同",
                max_diff(out, ref) < 1e-12)
    story.check("A small correction: after self.query the tensor is already (L, B, heads, d_k) (4-D), not "
                "(L, B, heads * d_k); the einsum needs those four letters",
                "一点小更正：经过 self.query 之后张量已经是 (L, B, heads, d_k) 四维了，而不是 "
                "(L, B, heads * d_k)；einsum 需要的正是这四个字母",
                tuple(model.query(_randn(3, 1, 8)).shape) == (3, 1, 2, 4))


@topic("scale-sqrt-dk", "003",
       ("Why scale the scores by 1/sqrt(d_k): the softmax saturating, measured",
        "为什么要除以 sqrt(d_k)：实测 softmax 的饱和"),
       ("Why are the scores multiplied by 1/sqrt(d_k) before the softmax?",
        "为什么在 softmax 之前要把注意力分数乘以 1/sqrt(d_k)（缩放点积）？"))
def scale_sqrt_dk(story: Story) -> None:
    sizes = (4, 16, 64, 256, 1024)
    raw = {d: saturation(d, scaled=False) for d in sizes}
    scaled = {d: saturation(d, scaled=True) for d in sizes}
    story.text("Take q and k with unit-variance entries. q·k is a sum of d_k products of variance 1, so its "
               "variance is d_k and its spread grows like sqrt(d_k). We measure 128 softmaxes over 16 keys "
               "for each d_k. For comparison, uniform weights over 16 keys have a largest weight of 0.0625 "
               "and an entropy of 2.773; a one-hot row has 1 and 0.",
               "取每个分量方差为 1 的 q 和 k。q·k 是 d_k 个方差为 1 的乘积之和，所以方差是 d_k，"
               "波动幅度按 sqrt(d_k) 增长。下面对每个 d_k 测 128 次、每次 16 个键的 softmax。作为对照："
               "16 个键上的均匀分布，最大权重是 0.0625，熵是 2.773；one-hot 的一行则分别是 1 和 0。")
    story.code(pick(story,
            "scores = q @ k.T                 # unscaled\nscores = q @ k.T / sqrt(d_k)     # scaled dot product",
            "scores = q @ k.T                 # 不缩放\nscores = q @ k.T / sqrt(d_k)     # 缩放点积"))
    columns = ["d_k", pick(story, "std of the scores", "分数的标准差"),
               pick(story, "largest weight", "最大权重"), pick(story, "entropy", "熵")]
    for measured, title in ((raw, pick(story, "unscaled: q @ k.T", "不缩放：q @ k.T")),
                            (scaled, pick(story, "scaled: q @ k.T / sqrt(d_k)", "缩放：q @ k.T / sqrt(d_k)"))):
        story.table(columns, [[d, f"{measured[d]['std']:.2f}", f"{measured[d]['max_weight']:.3f}",
                               f"{measured[d]['entropy']:.3f}"] for d in sizes], title=title)
    story.check("Unscaled, the scores' std grows like sqrt(d_k) (within 15% for every d_k)",
                "不缩放时，分数的标准差随 sqrt(d_k) 增长（每个 d_k 误差都在 15% 以内）",
                all(abs(raw[d]["std"] / math.sqrt(d) - 1) < 0.15 for d in sizes))
    story.check("Scaled by 1/sqrt(d_k), the std stays near 1 for every d_k",
                "乘以 1/sqrt(d_k) 之后，无论 d_k 多大，标准差都保持在 1 附近",
                all(abs(scaled[d]["std"] - 1) < 0.15 for d in sizes))
    story.check("Unscaled, the softmax saturates: at d_k = 1024 the largest weight averages above 0.9 (almost one-hot)",
                "不缩放时 softmax 会饱和：d_k = 1024 时最大权重平均超过 0.9，几乎成了 one-hot",
                raw[1024]["max_weight"] > 0.9 and raw[1024]["max_weight"] > raw[4]["max_weight"],
                f"{raw[1024]['max_weight']:.3f}")
    story.check("Scaled, the weights look the same at every d_k (largest weight between 0.15 and 0.35)",
                "缩放之后，各个 d_k 下权重的样子都差不多（最大权重都在 0.15 到 0.35 之间）",
                all(0.15 < scaled[d]["max_weight"] < 0.35 for d in sizes))
    ratio = raw[1024]["grad"] / scaled[1024]["grad"]
    story.check("A saturated softmax passes back little gradient: at d_k = 1024 the scores get under a quarter "
                "of the scaled version's gradient",
                "饱和的 softmax 几乎传不回梯度：d_k = 1024 时，不缩放的分数得到的梯度不到缩放版本的四分之一",
                ratio < 0.25, pick(story, f"ratio {ratio:.3f}", f"比值 {ratio:.3f}"))
    story.text("This is what document 003 means by \"preventing vanishing gradients\": dividing by sqrt(d_k) "
               "keeps the scores at unit scale, so the softmax stays soft and keeps learning whatever the head size.",
               "这就是文档 003 所说的“防止 Softmax 梯度消失”：除以 sqrt(d_k) 让分数保持在单位尺度上，"
               "softmax 保持“柔和”，无论头维度多大都能继续学习。")


TOPICS = (k_transpose, einsum_scores, scale_sqrt_dk)
