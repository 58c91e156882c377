"""What a head is (document 004): heads folded into the batch, where "multi-head" lives, and how heads
differ from convolution kernels."""
from __future__ import annotations

import math

import torch
from torch import nn

import multihead as mh
from multihead.explain.story import Story
from multihead.explain.topics.base import diff_text, max_diff, pick, topic
from multihead.explain.topics.heads import HEAD_COUNTS, d2l_param_counts, param_count
from multihead.explain.topics.layout import decode, labelled_tensor
from multihead.textbook import FoldedBatchHeads, transpose_output, transpose_qkv


def d2l_model(num_heads: int, num_hiddens: int = 8, seed: int = 0) -> FoldedBatchHeads:
    """Document 004's module in float64, all sizes num_hiddens, no dropout."""
    torch.manual_seed(seed)
    return FoldedBatchHeads(num_hiddens, num_hiddens, num_hiddens, num_hiddens, num_heads, 0.0).double()


def per_slice_attention(model: FoldedBatchHeads, x: torch.Tensor) -> torch.Tensor:
    """The module's output rebuilt by hand: single-head attention on each feature slice, then W_o.

    x (B, L, E) -> (B, L, E). No reshape, no fold: just column slices of the projected Q, K, V.
    """
    H = model.num_heads
    q, k, v = model.W_q(x), model.W_k(x), model.W_v(x)          # (B, L, E) each
    d = q.shape[-1] // H
    outs = []
    for h in range(H):
        cols = slice(h * d, (h + 1) * d)
        w = (q[..., cols] @ k[..., cols].transpose(1, 2) / math.sqrt(d)).softmax(-1)   # (B, L, L)
        outs.append(w @ v[..., cols])                              # (B, L, d)
    return model.W_o(torch.cat(outs, dim=-1))                      # (B, L, E)


def folded_rows_ok(folded: torch.Tensor, num_heads: int) -> bool:
    """For a folded labelled tensor (B*H, L, d): row r holds batch r // H, head r % H, token t at position t."""
    for r in range(folded.shape[0]):
        for t in range(folded.shape[1]):
            for f, value in enumerate(folded[r, t].tolist()):
                if decode(value) != (r // num_heads, t, r % num_heads, f):
                    return False
    return True


@topic("where-heads-live", "004",
       ("Where the \"multi-head\" lives: in the split, not in extra weights", "“多头”体现在哪里：在切分里，而不在额外的权重里"),
       ("Where in this code is the \"multi-head\"?", "这里的多头体现在哪里呢？"))
def where_heads_live(story: Story) -> None:
    one, four = d2l_model(1), d2l_model(4)
    same_keys = {k: tuple(v.shape) for k, v in one.state_dict().items()} == \
                {k: tuple(v.shape) for k, v in four.state_dict().items()}
    four.load_state_dict(one.state_dict())
    story.code(pick(story,
            "one = MultiHeadAttention(..., num_heads=1)\n"
            "four = MultiHeadAttention(..., num_heads=4)\n"
            "four.load_state_dict(one.state_dict())   # the very same weights",
            "one = MultiHeadAttention(..., num_heads=1)\n"
            "four = MultiHeadAttention(..., num_heads=4)\n"
            "four.load_state_dict(one.state_dict())   # 完全相同的权重"))
    story.check("The 1-head and 4-head modules have the same parameter names and shapes: the weights can be swapped",
                "1 个头和 4 个头的模块，参数名和形状完全相同：权重可以直接互换",
                same_keys, ", ".join(one.state_dict()))
    torch.manual_seed(1)
    x = 3 * torch.randn(1, 5, 8, dtype=torch.float64)               # (B, L, num_hiddens); 3x for sharper maps
    y1, y4 = one(x, x, x, None), four(x, x, x, None)
    story.check("With identical weights the outputs still differ: the only difference left is how the "
                "features are split",
                "权重完全相同，输出却不一样：剩下唯一的区别，就是特征被怎样切分",
                max_diff(y1, y4) > 1e-3, diff_text(y1, y4))
    story.check("The 4-head output is exactly 4 ordinary single-head attentions, each on its own slice of the "
                "projected features (columns h*d:(h+1)*d), concatenated and passed through W_o",
                "4 个头的输出，恰好等于 4 次普通的单头注意力：每次只用投影后特征的一个切片"
                "（第 h*d 到 (h+1)*d 列），拼接后再过 W_o",
                max_diff(y4, per_slice_attention(four, x)) < 1e-12)
    weights = four.attention.attention_weights.reshape(1, 4, 5, 5)[0]     # (B*H, L, L) -> (H, L, L)
    story.figure(pick(story, "the 4 heads' attention weights (same weights, 4 slices)", "4 个头的注意力权重（同一套权重，4 个切片）"),
                 weights)
    story.check("Each head has its own attention map (no two of the 4 maps are equal)",
                "每个头都有自己的一张注意力图（4 张图两两不同）",
                all(max_diff(weights[a], weights[b]) > 1e-3 for a in range(4) for b in range(a + 1, 4)))
    story.text("So multi-head lives in transpose_qkv and the per-head softmax: the one projected vector is cut "
               "into slices, each slice gets its own softmax over the keys, and the results are glued back. "
               "Document 004's answer says each head has its own W_q, W_k, W_v; more exactly, each head uses its "
               "own rows of the shared matrices, with no extra parameters.",
               "所以“多头”体现在 transpose_qkv 和按头分别做的 softmax 上：同一个投影后的向量被切成几段，"
               "每一段对键各做一次 softmax，结果再拼回去。文档 004 的回答说每个头有自己的 W_q、W_k、W_v；"
               "更准确地说，每个头用的是共享矩阵里属于自己的那几行，并没有额外的参数。")


@topic("heads-in-batch", "004",
       ("Heads folded into the batch: the element count is preserved", "把头折进批量维：元素总数保持不变"),
       ("After transpose_qkv, is batch_size * num_heads * L * (num_hiddens / num_heads) the same number of elements?",
        "transpose_qkv 之后，batch_size*num_heads*查询个数*num_hiddens/num_heads 与原来的元素总数是不是不变？"))
def heads_in_batch(story: Story) -> None:
    B, L, H, d = 2, 3, 2, 2
    X = labelled_tensor(B=B, L=L, H=H, D=d)                       # value = 1000*b + 100*t + 10*h + f
    folded = transpose_qkv(X, H)                                  # (B*H, L, d)
    story.text("Again every number names itself: 1000*batch + 100*token + 10*head + feature.",
               "同样，每个数都“自报家门”：1000*批次 + 100*词 + 10*头 + 特征。")
    story.code("# (B, L, num_hiddens) -> (B*H, L, num_hiddens/H)\nfolded = transpose_qkv(X, num_heads)")
    story.tensor("X (B, L, num_hiddens)", X)
    story.tensor("folded (B*H, L, d)", folded)
    story.check("The element count is unchanged: B * L * num_hiddens = (B*H) * L * (num_hiddens/H)",
                "元素总数不变：B * L * num_hiddens = (B*H) * L * (num_hiddens/H)",
                X.numel() == folded.numel() == B * L * H * d, f"{X.numel()} = {folded.numel()}")
    story.check("Row r of the folded batch is batch r // H, head r % H, with the tokens in order",
                "折叠后第 r 行就是第 r // H 个样本的第 r % H 个头，词的顺序保持不变",
                folded_rows_ok(folded, H))
    story.check("transpose_output undoes it exactly: we get X back, bit for bit",
                "transpose_output 恰好把它还原：X 原样回来，一位都不差",
                torch.equal(transpose_output(folded, H), X))
    valid_lens = torch.tensor([3, 2])
    inter = torch.repeat_interleave(valid_lens, repeats=H, dim=0)
    tiled = valid_lens.repeat(H)
    story.table(["r", pick(story, "batch of row r", "第 r 行所属样本"), "repeat_interleave", "repeat"],
                [[r, r // H, inter[r].item(), tiled[r].item()] for r in range(B * H)])
    story.check("repeat_interleave copies each sequence's valid length H times in a row, matching row r's batch r // H",
                "repeat_interleave 把每个样本的有效长度连续复制 H 次，正好对上第 r 行所属的样本 r // H",
                all(inter[r] == valid_lens[r // H] for r in range(B * H)))
    story.check("…while a plain repeat would hand batch 0's heads batch 1's length",
                "……而普通的 repeat 会把样本 1 的长度错配给样本 0 的头",
                not torch.equal(tiled, inter), f"{tiled.tolist()} vs {inter.tolist()}")
    model = d2l_model(2)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    lens = torch.tensor([3, 5])
    ours = mh.MultiHeadAttention.from_module(model)
    story.code(pick(story,
            "ours = mh.MultiHeadAttention.from_module(d2l_model)\n"
            "ours(x, mask=mh.Mask.lengths(valid_lens))   # no folding needed",
            "ours = mh.MultiHeadAttention.from_module(d2l_model)\n"
            "ours(x, mask=mh.Mask.lengths(valid_lens))   # 不需要折叠"))
    story.check("multihead keeps heads as their own axis (B, H, L, d) and gets the same output with Mask.lengths",
                "multihead 让“头”单独占一维 (B, H, L, d)，配合 Mask.lengths 得到同样的输出",
                max_diff(ours(x, mask=mh.Mask.lengths(lens)), model(x, x, x, lens)) < 1e-12)


@topic("heads-vs-conv", "004",
       ("How attention heads differ from convolution kernels", "注意力的头与卷积核有什么不同"),
       ("Is multi-head attention like the many kernels of a CNN, whose count multiplies the parameters?",
        "多头注意力跟卷积神经网络的多个卷积核是不是一样的？卷积核的数目会不会让参数成倍增加？"))
def heads_vs_conv(story: Story) -> None:
    E = 16
    conv_params = {C: param_count(nn.Conv1d(E, C, kernel_size=3)) for C in HEAD_COUNTS}
    attn_params = d2l_param_counts(E)
    story.table([pick(story, "kernels / heads", "卷积核数 / 头数"), "Conv1d(16, C, 3)",
                 pick(story, "d2l attention, num_hiddens=16", "d2l 注意力，num_hiddens=16")],
                [[n, conv_params[n], attn_params[n]] for n in HEAD_COUNTS])
    story.check("Every extra conv kernel brings its own weights (in_channels * kernel_size + 1): "
                "parameters grow linearly",
                "每多一个卷积核，就多一份自己的权重（in_channels * kernel_size + 1）：参数线性增长",
                all(conv_params[n] == n * (E * 3 + 1) for n in HEAD_COUNTS))
    story.check("Extra heads bring no weights: they cut the same width into more slices",
                "多一个头并不带来新的权重：只是把同样的宽度切成更多片",
                len(set(attn_params.values())) == 1)
    torch.manual_seed(0)
    conv = nn.Conv1d(E, 4, kernel_size=3).double()
    x = torch.randn(1, E, 12, dtype=torch.float64)                # (B, channels, positions)
    before = conv(x)
    with torch.no_grad():
        conv.weight[0] += 1.0                                     # change kernel 0 only
    after = conv(x)
    story.check("Kernels do not share weights with each other: changing kernel 0 changes output channel 0 only",
                "卷积核之间并不共享参数：只改第 0 个卷积核，只有第 0 个输出通道会变",
                max_diff(before[:, 0], after[:, 0]) > 0 and max_diff(before[:, 1:], after[:, 1:]) == 0)
    shifted = torch.roll(x, 1, dims=-1)
    story.check("What a conv shares is one kernel across positions: shifting the input shifts the output",
                "卷积真正共享的，是同一个卷积核在不同位置上的权重：输入平移，输出也跟着平移",
                max_diff(conv(shifted)[..., 2:], conv(x)[..., 1:-1]) < 1e-12)
    story.text("A kind correction of document 004: it says conv kernels \"usually share parameters\" with each "
               "other. Measured above: different kernels are independent; the sharing is of one kernel over "
               "all positions.",
               "对文档 004 的一点友善更正：它说卷积核之间“通常会共享参数”。上面的实测表明：不同的卷积核彼此独立；"
               "所谓共享，是同一个卷积核在所有位置上共用一套权重。")
    model = d2l_model(2)
    tokens = torch.randn(1, 12, 8, dtype=torch.float64)          # (B, L, num_hiddens)
    poked = tokens.clone()
    poked[0, 0] += 1.0                                            # change token 0 only
    seq_x, seq_poked = tokens.transpose(1, 2), poked.transpose(1, 2)   # (B, channels, L) for the conv
    conv8 = nn.Conv1d(8, 8, kernel_size=3, padding=1).double()
    story.check("A kernel sees a window (3 positions); a head sees every token: changing token 0 moves the "
                "attention output at the last token, but not the conv output there",
                "卷积核只看一个窗口（3 个位置），而一个头能看到所有的词：改动第 0 个词，最后一个词的注意力输出会变，"
                "卷积输出却不变",
                max_diff(conv8(seq_x)[..., -1], conv8(seq_poked)[..., -1]) == 0
                and max_diff(model(tokens, tokens, tokens, None)[0, -1], model(poked, poked, poked, None)[0, -1]) > 0)
    w_before = model.attention.attention_weights.clone()
    model(tokens, tokens, tokens, None)
    story.check("And a head's weights are computed from the input: two inputs, two different attention maps "
                "from the same parameters (a conv kernel's weights are the parameters themselves)",
                "而且一个头的权重是由输入算出来的：同一套参数，两个输入，得到两张不同的注意力图"
                "（卷积核的权重就是参数本身，固定不变）",
                max_diff(w_before, model.attention.attention_weights) > 1e-6)


TOPICS = (where_heads_live, heads_in_batch, heads_vs_conv)
