"""Masks: masked_fill and -1e9 (document 002), the fill value in half precision and fully masked rows
(documents 000, 002, 004), and document 003's mask asserts next to multihead's Mask."""
from __future__ import annotations

import torch

import multihead as mh
from multihead.explain.story import Story
from multihead.explain.topics.base import diff_text, error_of, error_text, max_diff, pick, topic
from multihead.textbook import ClassicTransformerHeads, SeqFirstEinsumHeads

CAUSAL_KEEP = torch.tril(torch.ones(3, 3, dtype=torch.int64))   # (Lq, Lk), document 002: 1 = keep


def _qkv(B=1, H=2, Lq=3, Lk=3, D=4, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(B, H, L, D, generator=g, dtype=dtype) for L in (Lq, Lk, Lk)]


def masked_weights(scores: torch.Tensor, keep: torch.Tensor, fill: float) -> torch.Tensor:
    """softmax over the last axis after filling the positions where keep == 0 with `fill`."""
    return scores.masked_fill(keep == 0, fill).softmax(dim=-1)


def fill_in(dtype: torch.dtype, value: float = -1e9) -> float:
    """What a literal fill value becomes once stored in `dtype` (-1e9 in float16 is -inf)."""
    return torch.tensor(value, dtype=dtype).item()


def fill_text(value: float) -> str:
    """A fill value as a short number: -1e+09, -9.98244e+08, -65504, -inf."""
    return f"{value:.6g}"


def labml_mask_asserts(mask: torch.Tensor, query_shape, key_shape) -> torch.Tensor:
    """Document 003's prepare_mask as written: three bare asserts, then a trailing head axis."""
    assert mask.shape[0] == 1 or mask.shape[0] == query_shape[0]
    assert mask.shape[1] == key_shape[0]
    assert mask.shape[2] == 1 or mask.shape[2] == query_shape[1]
    return mask.unsqueeze(-1)


def assert_verdicts(mask_shape, query_shape, key_shape) -> tuple[bool, bool, bool]:
    """Which of document 003's three asserts a mask of this shape passes."""
    return (mask_shape[0] in (1, query_shape[0]), mask_shape[1] == key_shape[0],
            mask_shape[2] in (1, query_shape[1]))


@topic("masked-fill", "002",
       ("Why masked_fill(mask == 0, -1e9) before the softmax", "为什么要在 softmax 之前 masked_fill(mask == 0, -1e9)"),
       ("Why does the code do `attn_scores.masked_fill(mask == 0, -1e9)`, and why -1e9?",
        "`attn_scores.mask_fill(mask == 0, -1e9)` 为什么要做这个操作，为什么填 -1e9？"))
def masked_fill_topic(story: Story) -> None:
    q, k, v = _qkv()
    scores = (q @ k.transpose(-2, -1))[0, 0] / 2.0          # (Lq, Lk) for head 0, scaled by sqrt(4)
    keep = CAUSAL_KEEP
    story.heading("A causal keep mask: 1 = may attend, 0 = blocked", "一个因果掩码：1 = 可以关注，0 = 屏蔽")
    story.tensor("mask (Lq, Lk)", keep)
    story.tensor(pick(story, "scores (Lq, Lk)", "注意力分数 (Lq, Lk)"), scores)
    w = masked_weights(scores, keep, -1e9)
    story.code("weights = scores.masked_fill(mask == 0, -1e9).softmax(dim=-1)")
    story.tensor(pick(story, "weights", "注意力权重"), w)
    story.check("Blocked positions get exactly 0 weight: exp(-1e9 - max) underflows to 0",
                "被屏蔽的位置权重恰好为 0：exp(-1e9 - max) 下溢成 0",
                bool((w[keep == 0] == 0).all()) and max_diff(w.sum(-1), torch.ones(3)) < 1e-12)
    zero = masked_weights(scores, keep, 0.0)
    story.check("Filling with 0 instead does not block anything: exp(0) = 1, so blocked keys still get weight",
                "如果填 0，根本屏蔽不了：exp(0) = 1，被屏蔽的键照样分到权重",
                bool((zero[keep == 0] > 0).all()),
                pick(story, f"{zero[0, 1].item():.3f} on a future token", f"未来的词元分到 {zero[0, 1].item():.3f}"))
    story.check("Multiplying the scores by the mask is the same mistake as filling 0",
                "把分数直接乘以掩码，和填 0 是同一个错误", torch.equal((scores * keep).softmax(-1), zero))
    story.check("-inf gives the same weights as -1e9 while each row keeps at least one key",
                "只要每一行至少保留一个键，填 -inf 和填 -1e9 得到的权重完全一样",
                torch.equal(masked_weights(scores, keep, float("-inf")), w))
    inplace = scores.clone()
    returned = inplace.masked_fill_(keep == 0, -1e9)
    story.check("masked_fill_ (document 001, trailing underscore) fills in place and returns the same tensor; "
                "masked_fill returns a new one",
                "masked_fill_（文档 001，带下划线）原地修改并返回同一个张量；masked_fill 返回一个新张量",
                returned is inplace and torch.equal(inplace, scores.masked_fill(keep == 0, -1e9)))
    model = ClassicTransformerHeads(d_model=8, num_heads=2).double()
    ours = mh.attention(q, k, v, mask=mh.Mask.keep(keep))
    story.code(pick(story,
            "# multihead: the same mask, its meaning (1 = keep) said by name\n"
            "mh.attention(q, k, v, mask=mh.Mask.keep(mask))",
            "# multihead：同一个掩码，用名字写明它的含义（1 = 保留）\n"
            "mh.attention(q, k, v, mask=mh.Mask.keep(mask))"))
    story.check("Document 002's scaled_dot_product_attention with -1e9 equals mh.attention with Mask.keep",
                "文档 002 用 -1e9 的 scaled_dot_product_attention，与 mh.attention 配 Mask.keep 的结果相同",
                max_diff(model.scaled_dot_product_attention(q, k, v, keep), ours) < 1e-12)
    story.figure(pick(story, "attention weights per head (causal)", "每个头的注意力权重（因果掩码）"),
                 masked_weights((q @ k.transpose(-2, -1))[0] / 2.0, keep, -1e9))
    story.text("The softmax turns scores into weights with exp, so \"ignore this key\" has to mean "
               "\"make its exp zero\": a huge negative score. The next topic, mask-fill-value, shows where -1e9 "
               "breaks and what multihead fills instead.",
               "softmax 用 exp 把分数变成权重，所以“忽略这个键”就意味着“让它的 exp 变成 0”，"
               "也就是给它一个极大的负分数。下一个专题 mask-fill-value 会展示 -1e9 在哪里会出问题，"
               "以及 multihead 实际填的是什么。")


@topic("mask-fill-value", "002",
       ("-1e9 in float16, fully masked rows, and the safe fill", "float16 里的 -1e9、整行被屏蔽，以及安全的填充值"),
       ("Is -1e9 always a safe fill value? What happens in float16 and when a whole row is masked?",
        "-1e9 一定安全吗？在 float16 下、以及整行都被屏蔽时会怎样？"))
def mask_fill_value(story: Story) -> None:
    dtypes = (torch.float16, torch.bfloat16, torch.float32)
    story.table(["dtype", "-1e9", "-1e6 (d2l)", "finfo(dtype).min"],
                [[str(d), *(fill_text(v) for v in (fill_in(d, -1e9), fill_in(d, -1e6), torch.finfo(d).min))]
                 for d in dtypes],
                title=pick(story, "the fill value once stored in each dtype", "填充值存进各种 dtype 之后变成了什么"))
    story.check("float16 tops out at 65504: -1e9 (and d2l's -1e6) become -inf",
                "float16 最大只能表示 65504：-1e9（以及 d2l 的 -1e6）都会变成 -inf",
                fill_in(torch.float16) == float("-inf") and fill_in(torch.float16, -1e6) == float("-inf"))
    q, k, _ = _qkv(dtype=torch.float32)
    scores_h = (q @ k.transpose(-2, -1))[0, 0].half()       # (Lq, Lk) in float16
    err = error_of(lambda: scores_h.masked_fill(CAUSAL_KEEP == 0, -1e9))
    story.check("masked_fill(..., -1e9) on float16 scores refuses outright",
                "对 float16 的分数做 masked_fill(..., -1e9) 会直接报错",
                isinstance(err, RuntimeError), error_text(err))
    block = torch.tensor([[0, 1, 1], [0, 0, 1], [1, 1, 1]]).half()   # document 000: 1 = blocked; row 2 all blocked
    story.code(pick(story,
            "# document 000's way, in float16; row 2 is fully blocked\n"
            "scores = scores + attention_mask * -1e9",
            "# 文档 000 的写法，float16；第 2 行全部被屏蔽\n"
            "scores = scores + attention_mask * -1e9"))
    added = scores_h + block * -1e9
    story.check("Document 000's additive mask in float16 turns blocked scores into -inf, and the fully blocked "
                "row into NaN after the softmax",
                "文档 000 的加法掩码在 float16 下把被屏蔽的分数变成 -inf，整行被屏蔽的那一行 softmax 后变成 NaN",
                bool(torch.isinf(added[block == 1]).all()) and bool(added.float().softmax(-1)[2].isnan().all()))
    premade = block * torch.tensor(-1e9, dtype=torch.float16)   # the constant made in float16 first
    story.check("Worse, if -1e9 is turned into a float16 tensor first, 0 * (-inf) = NaN lands on the kept positions",
                "更糟的是：如果先把 -1e9 变成 float16 张量再相乘，0 * (-inf) = NaN 会落在本该保留的位置上",
                int(premade.isnan().sum()) == int((block == 0).sum()), pick(story, f"{int(premade.isnan().sum())} NaN", f"{int(premade.isnan().sum())} 个 NaN"))
    story.heading("A fully masked row in float32", "float32 下整行都被屏蔽")
    row = scores_h.float()[0]
    everything = torch.ones(3, dtype=torch.bool)  # block every key of the row
    story.table([pick(story, "fill", "填充值"), pick(story, "weights of the fully masked row", "整行被屏蔽时的权重")],
                [[fill_text(f), ", ".join(f"{w:.4f}" for w in row.masked_fill(everything, f).softmax(-1))]
                 for f in (float("-inf"), -1e9, -1e6)])
    story.check("With -inf the row is 0/0: every weight is NaN (and the NaN flows on into the output)",
                "填 -inf 时这一行成了 0/0：所有权重都是 NaN（NaN 还会继续流进输出）",
                bool(row.masked_fill(everything, float("-inf")).softmax(-1).isnan().all()))
    story.check("With -1e9 (or -1e6) the row silently becomes uniform: a padding query attends equally to "
                "every key, blocked ones included",
                "填 -1e9（或 -1e6）时这一行悄悄变成均匀分布：一个填充位置的查询平均地关注所有键，包括被屏蔽的键",
                max_diff(row.masked_fill(everything, -1e9).softmax(-1), torch.full((3,), 1 / 3)) < 1e-6)
    story.heading("What multihead does", "multihead 的做法")
    story.text("Compute the softmax in float32 whatever the input dtype, fill blocked scores with "
               "torch.finfo(float32).min (finite, so max - max is 0, never NaN), and set the weights of "
               "blocked positions to exactly 0 afterwards, so a fully masked query row outputs exact zeros.",
               "无论输入是什么 dtype，softmax 都在 float32 下计算；被屏蔽的分数填 torch.finfo(float32).min"
               "（它是有限数，最大值减最大值得 0，永远不会出现 NaN）；softmax 之后再把被屏蔽位置的权重"
               "置为恰好 0，于是整行被屏蔽的查询输出恰好是 0。")
    safe = row.masked_fill(everything, torch.finfo(torch.float32).min).softmax(-1)
    story.check("finfo(float32).min never produces NaN, even on a fully masked row",
                "finfo(float32).min 即使在整行被屏蔽时也不会产生 NaN", bool(torch.isfinite(safe).all()))
    keep = (block == 0)                          # (Lq, Lk), True = keep; row 2 keeps nothing
    qh, kh, vh = (t.half().requires_grad_(True) for t in _qkv(dtype=torch.float32))
    out = mh.attention(qh, kh, vh, mask=mh.Mask.keep(keep))
    out.float().sum().backward()
    story.code(pick(story,
            "# row 2 keeps nothing\n"
            "out = mh.attention(q.half(), k.half(), v.half(), mask=mh.Mask.keep(keep))",
            "# 第 2 行什么都不保留\n"
            "out = mh.attention(q.half(), k.half(), v.half(), mask=mh.Mask.keep(keep))"))
    story.tensor("out[0, 0] (Lq, D), float16", out[0, 0])
    story.check("In float16, mh.attention gives no NaN or inf, and the fully masked row is exactly 0 with 0 gradient",
                "在 float16 下，mh.attention 没有任何 NaN 或 inf，整行被屏蔽的那一行输出恰好为 0，梯度也恰好为 0",
                bool(torch.isfinite(out).all()) and bool((out[..., 2, :] == 0).all())
                and bool((qh.grad[..., 2, :] == 0).all()))
    ref = mh.attention(*(t.detach().double() for t in (qh, kh, vh)), mask=mh.Mask.keep(keep))
    story.check("The kept rows match a float64 reference to float16 precision",
                "保留的那些行与 float64 参考结果在 float16 精度内一致", max_diff(out[..., :2, :], ref[..., :2, :]) < 5e-3,
                diff_text(out[..., :2, :], ref[..., :2, :]))


@topic("mask-asserts", "003",
       ("What each mask assert in document 003 checks, and what Mask does instead",
        "文档 003 里每个掩码 assert 在检查什么，以及 Mask 是怎么做的"),
       ("What do the three asserts in prepare_mask check?", "prepare_mask 里的三条 assert 语句分别在检查什么？"))
def mask_asserts(story: Story) -> None:
    Lq, Lk, B, H = 4, 5, 2, 2
    query_shape, key_shape = (Lq, B, 8), (Lk, B, 8)          # sequence-first (L, B, d_model)
    story.text("Document 003 is sequence-first: query is (Lq, B, d_model), so query_shape[0] is the query length "
               "and query_shape[1] is the batch. Its mask is (Lq, Lk, B), 0 = blocked. A gentle correction: "
               "the document's explanation calls mask dim 0 the batch and the mask (batch, key, query); measured below, "
               "dim 0 is the queries, dim 1 the keys and dim 2 the batch.",
               "文档 003 是序列优先的：query 的形状是 (Lq, B, d_model)，所以 query_shape[0] 是查询长度，"
               "query_shape[1] 才是批量大小。它的掩码形状是 (Lq, Lk, B)，0 表示屏蔽。温和地更正一下："
               "文中的解析把掩码第 0 维说成批量、把掩码说成 (batch, key, query)；下面实测可见，"
               "第 0 维是查询，第 1 维是键，第 2 维是批量。")
    story.code(pick(story,
            "assert mask.shape[0] == 1 or mask.shape[0] == query_shape[0]   # 1: queries\n"
            "assert mask.shape[1] == key_shape[0]                           # 2: keys\n"
            "assert mask.shape[2] == 1 or mask.shape[2] == query_shape[1]   # 3: batch\n"
            "# 1 and 3 also accept size 1 (shared); 2 wants the key length exactly",
            "assert mask.shape[0] == 1 or mask.shape[0] == query_shape[0]   # 1：查询\n"
            "assert mask.shape[1] == key_shape[0]                           # 2：键\n"
            "assert mask.shape[2] == 1 or mask.shape[2] == query_shape[1]   # 3：批量\n"
            "# 第 1、3 条也接受大小 1（共用）；第 2 条要求恰好等于键的长度"))
    cases = [((Lq, Lk, B), ("full", "完整掩码")),
             ((1, Lk, B), ("padding, shared by all queries", "填充掩码，所有查询共用")),
             ((Lq, Lk, 1), ("causal, shared by the batch", "因果掩码，整个批量共用")),
             ((1, Lk, 1), ("one row for everything", "一个掩码，全部共用")),
             ((Lq, 1, B), ("keys broadcast", "键这一维也想靠广播")),
             ((B, Lk, Lq), ("(batch, key, query), as the document says", "文中说的 (batch, key, query)"))]
    model = SeqFirstEinsumHeads(heads=H, d_model=8)
    rows, agree = [], True
    for shape, note in cases:
        verdict = assert_verdicts(shape, query_shape, key_shape)
        mask = torch.ones(shape)
        accepted = error_of(lambda: model.prepare_mask(mask, query_shape, key_shape)) is None
        bare = error_of(lambda: labml_mask_asserts(mask, query_shape, key_shape))
        agree &= accepted == all(verdict) == (bare is None)
        rows.append([str(shape), pick(story, *note), *("✓" if v else "✗" for v in verdict)])
    story.table([pick(story, "mask shape", "掩码形状"), pick(story, "meaning", "含义"),
                 "assert 1", "assert 2", "assert 3"], rows)
    story.check("The three asserts, the textbook's prepare_mask and the verdicts above agree on every shape",
                "对每种形状，三条 assert、教材版 prepare_mask 与上表的判断完全一致", agree)
    scores_shape = (Lq, Lk, B, H)
    story.check("Every accepted mask, after unsqueeze(-1), broadcasts against the scores (Lq, Lk, B, H): the "
                "size-1 dims are copied along queries, batch and heads",
                "每个被接受的掩码在 unsqueeze(-1) 之后都能和分数 (Lq, Lk, B, H) 广播：大小为 1 的维度会沿查询、"
                "批量和头复制", all(torch.broadcast_shapes(s + (1,), scores_shape) == scores_shape
                                  for s, _ in cases if all(assert_verdicts(s, query_shape, key_shape))))
    story.check("Assert 2 allows no size 1: a (Lq, 1, B) mask would broadcast, but the key axis must be spelled out",
                "第 2 条 assert 不允许大小为 1：(Lq, 1, B) 的掩码本可以广播，但键这一维必须写全",
                torch.broadcast_shapes((Lq, 1, B, 1), scores_shape) == scores_shape
                and not assert_verdicts((Lq, 1, B), query_shape, key_shape)[1])
    story.check("The (batch, key, query) layout the document describes fails the asserts",
                "文中描述的 (batch, key, query) 排列通不过这些 assert",
                not all(assert_verdicts((B, Lk, Lq), query_shape, key_shape)))
    bare = error_of(lambda: labml_mask_asserts(torch.ones(B, Lk, Lq), query_shape, key_shape))
    story.check("A failing bare assert says nothing about what was expected", "一条失败的裸 assert 什么都不告诉你",
                isinstance(bare, AssertionError) and str(bare) == "", error_text(bare))
    silent = error_of(lambda: exec(compile("assert False", "<mask>", "exec", optimize=1)))
    story.check("…and under python -O asserts are removed entirely, so nothing is checked at all",
                "……而且在 python -O 下 assert 会被整个删掉，什么都不检查", silent is None)
    story.heading("multihead's Mask instead", "multihead 的 Mask")
    g = torch.Generator().manual_seed(0)
    labml = (torch.rand(Lq, Lk, B, generator=g) > 0.3).long()
    labml[:, 0] = 1                               # every query keeps key 0
    ours = mh.Mask.keep(labml.permute(2, 0, 1).unsqueeze(1))   # (Lq, Lk, B) -> (B, 1, Lq, Lk)
    story.code(pick(story,
            "# (Lq, Lk, B) -> (B, 1, Lq, Lk), 1 = keep\n"
            "mask = mh.Mask.keep(m.permute(2, 0, 1).unsqueeze(1))",
            "# (Lq, Lk, B) -> (B, 1, Lq, Lk)，1 = 保留\n"
            "mask = mh.Mask.keep(m.permute(2, 0, 1).unsqueeze(1))"))
    keep, _ = ours.materialize(B, H, Lq, Lk)
    story.check("Materialised for (B, H, Lq, Lk), it keeps exactly what document 003's mask keeps, for every head",
                "展开到 (B, H, Lq, Lk) 后，它保留的位置与文档 003 的掩码完全相同，每个头都一样",
                torch.equal(keep.expand(B, H, Lq, Lk), labml.permute(2, 0, 1).unsqueeze(1).expand(B, H, Lq, Lk).bool()))
    q, k, v = _qkv(B=B, H=H, Lq=Lq, Lk=Lk)
    scores = torch.einsum("bhid,bhjd->ijbh", q, k) / 2.0      # (Lq, Lk, B, H), document 003's layout
    w = scores.masked_fill(labml.unsqueeze(-1) == 0, float("-inf")).softmax(dim=1)
    ref = torch.einsum("ijbh,bhjd->bhid", w, v)
    story.check("mh.attention with that Mask equals document 003's masked einsum attention",
                "用这个 Mask 的 mh.attention，与文档 003 带掩码的 einsum 注意力结果相同",
                max_diff(mh.attention(q, k, v, mask=ours), ref) < 1e-12)
    err = error_of(lambda: mh.attention(q, k, v, mask=mh.Mask.keep(labml)))
    story.code(pick(story,
            "mh.attention(q, k, v, mask=mh.Mask.keep(m))  # forgot the permute: (Lq, Lk, B)",
            "mh.attention(q, k, v, mask=mh.Mask.keep(m))  # 忘了 permute：(Lq, Lk, B)"))
    story.check("A mask that cannot broadcast raises AttentionError (a ValueError) saying what was expected "
                "and what came",
                "形状无法广播的掩码会抛出 AttentionError（ValueError 的子类），并说明期望什么、收到了什么",
                isinstance(err, mh.AttentionError) and isinstance(err, ValueError) and "expected" in str(err),
                error_text(err))


TOPICS = (masked_fill_topic, mask_fill_value, mask_asserts)
