"""Splitting and merging heads: reshape, transpose(1, 2), and combine_heads (documents 000 and 002).

Every demo runs on a "labelled" tensor whose numbers say where they came from:
value = 1000*batch + 100*token + 10*head + feature, so a wrong split is visible at a glance.
"""
from __future__ import annotations

import torch

from multihead.explain.story import Story
from multihead.explain.topics.base import error_of, error_text, pick, stride_text, topic


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


def _pairs(pairs: list[tuple[int, int]], story: Story) -> str:
    word = pick(story, "token {} head {}", "词{} 头{}")
    return ", ".join(word.format(t, h) for t, h in pairs)


@topic("reshape-then-transpose", "000",
       ("Why reshape(B, L, H, d).transpose(1, 2), not reshape(B, H, L, d)",
        "为什么先 reshape(B, L, H, d) 再 transpose(1, 2)，而不直接 reshape(B, H, L, d)"),
       ("Why does split_head reshape to (B, L, H, d) and transpose, instead of reshaping straight to (B, H, L, d)?",
        "split_head 里为什么要先 reshape 成 (B, L, H, d) 再 transpose(1, 2)，不能直接 reshape 成 (B, H, L, d) 吗？"))
def reshape_then_transpose(story: Story) -> None:
    H = 2
    x = labelled_tensor(B=1, L=3, H=H, D=2)
    story.heading("A tensor whose numbers say where they come from", "一个会“自报家门”的张量")
    story.text("Each number is 100*token + 10*head + feature: 111 means token 1, head 1, feature 1. "
               "The projection gives each token one row of hidden_size = H*d numbers, head 0's block first.",
               "每个数都等于 100*词 + 10*头 + 特征：111 就是“词1、头1、特征1”。线性投影之后，"
               "每个词占一行 hidden_size = H*d 个数，头0的那一段在前，头1的在后。")
    story.code("x = 100*token + 10*head + feature   # (B=1, L=3, hidden=4), H=2, d=2")
    story.tensor("x (B, L, H*d)", x, layout=True)

    right, wrong = split_right(x, H), split_wrong(x, H)
    story.heading("The two candidates", "两种写法")
    story.code(pick(story,
            "right = x.reshape(B, L, H, d).transpose(1, 2)   # (B, H, L, d)\n"
            "wrong = x.reshape(B, H, L, d)                  # (B, H, L, d) too",
            "right = x.reshape(B, L, H, d).transpose(1, 2)   # (B, H, L, d)\n"
            "wrong = x.reshape(B, H, L, d)                  # 形状也是 (B, H, L, d)"))
    story.tensor(pick(story, "right (B, H, L, d)", "正确 (B, H, L, d)"), right, layout=True)
    story.tensor(pick(story, "wrong (B, H, L, d)", "错误 (B, H, L, d)"), wrong, layout=True)
    story.table([pick(story, "head slot", "头的位置"), "reshape + transpose", "reshape(B, H, L, d)"],
                [[h, _pairs(slot_sources(right, h), story), _pairs(slot_sources(wrong, h), story)]
                 for h in range(H)],
                title=pick(story, "whose numbers land in each head", "每个头里装的是谁的数"))
    story.check("reshape + transpose: every slot (head h, position t) holds exactly token t's head-h features",
                "reshape + transpose：位置 (头 h, 第 t 个词) 里装的恰好是词 t 的头 h 特征",
                not misplaced(right),
                pick(story, f"misplaced slots: {len(misplaced(right))}", f"放错的位置：{len(misplaced(right))} 个"))
    wrong_sources = slot_sources(wrong, 0)
    story.check("The direct reshape mixes heads: head slot 0 receives numbers from both head 0 and head 1",
                "直接 reshape 会把头混在一起：头0 里既有头0的特征，也有头1的特征",
                {h for _, h in wrong_sources} == {0, 1}, _pairs(wrong_sources, story))
    story.check("…and it mixes tokens: head slot 0's second position still holds token 0, not token 1",
                "……还会把词混在一起：头0 的第 2 个位置装的仍是词0，而不是词1",
                decode(wrong[0, 0, 1, 0].item())[1] == 0, f"wrong[0, 0, 1] = {wrong[0, 0, 1].tolist()}")
    story.text("reshape cuts the numbers in memory order, and memory holds token after token. Cutting "
               "(L, H*d) straight into (H, L, d) therefore slices across token boundaries. Reshaping to "
               "(B, L, H, d) only splits each token's own row into heads; transpose(1, 2) then just relabels "
               "the axes so that heads come first, without moving a single number.",
               "reshape 是按内存顺序“切”数的，而内存里是一个词接一个词地存放。直接把 (L, H*d) 切成 "
               "(H, L, d)，刀口就会落在词与词之间。先 reshape 成 (B, L, H, d)，只是把每个词自己那一行切成"
               "几个头；随后的 transpose(1, 2) 只是给维度换个顺序，让“头”排在前面，一个数都没有搬动。")
    story.text("A gentle correction of document 000: its first answer lists \"head 1 gets token 1's head-1 "
               "features and head 2 gets token 1's head-2 features\" as the error. That is exactly what the "
               "correct split does (checked below); the real error is the mixing shown above.",
               "对文档 000 的一点小小更正：它的第一个回答把“头1分到词1的头1特征，头2分到词1的头2特征”"
               "当成了错误，其实这恰恰是正确的切分（下面用数据验证）；真正的错误是上面看到的“串词串头”。")
    story.check("In the correct split, head 1 at token 0 holds token 0's head-1 features (what 000 called wrong)",
                "正确切分里，头1在词0处装的就是词0的头1特征（也就是文档 000 误认为错误的情形）",
                [decode(v)[1:3] for v in right[0, 1, 0].tolist()] == [(0, 1)] * right.shape[-1],
                f"right[0, 1, 0] = {right[0, 1, 0].tolist()}")


@topic("split-heads-transpose", "002",
       ("How view(B, L, H, d_k).transpose(1, 2) gets to (B, H, L, d_k)",
        "view(B, L, H, d_k).transpose(1, 2) 是怎么“转”过来的"),
       ("How does `x.view(batch_size, seq_length, num_heads, d_k).transpose(1, 2)` turn the tensor around?",
        "`x.view(batch_size, seq_length, num_heads, d_k).transpose(1, 2)` 是怎么 transpose 过来的？"))
def split_heads_transpose(story: Story) -> None:
    x = labelled_tensor(B=1, L=3, H=2, D=2)
    viewed = x.view(1, 3, 2, 2)                 # (B, L, H, d_k)
    turned = viewed.transpose(1, 2)             # (B, H, L, d_k)
    story.heading("Step 1: view splits the last axis", "第一步：view 把最后一维拆开")
    story.code("viewed = x.view(batch_size, seq_length, num_heads, d_k)   # (1, 3, 2, 2)")
    story.tensor("viewed (B, L, H, d_k)", viewed, layout=True)
    story.heading("Step 2: transpose(1, 2) swaps axis 1 and axis 2", "第二步：transpose(1, 2) 交换第 1 维和第 2 维")
    story.code("turned = viewed.transpose(1, 2)   # (1, 2, 3, 2)")
    story.tensor("turned (B, H, L, d_k)", turned, layout=True)
    story.table([pick(story, "tensor", "张量"), pick(story, "shape", "形状"), pick(story, "stride", "步幅"),
                 "is_contiguous()"],
                [["viewed", tuple(viewed.shape), viewed.stride(), viewed.is_contiguous()],
                 ["turned", tuple(turned.shape), turned.stride(), turned.is_contiguous()]])
    story.text("transpose does not move any number. It swaps two entries of the shape and the same two "
               "entries of the stride (how many steps in memory one step along an axis takes). "
               "Reading turned[b, h, t, k] therefore lands on the very number viewed[b, t, h, k].",
               "transpose 并不搬动任何数据。它只是把形状里的两项、以及步幅里对应的两项对调"
               "（步幅就是沿某一维走一步，在内存里要跨过几个数）。所以读 turned[b, h, t, k] 时，"
               "落到的正是 viewed[b, t, h, k] 那个数。")
    same = all(turned[b, h, t, k] == viewed[b, t, h, k]
               for b, h, t, k in torch.cartesian_prod(*(torch.arange(n) for n in turned.shape)).tolist())
    story.check("turned[b, h, t, k] == viewed[b, t, h, k] for every index",
                "对所有下标都有 turned[b, h, t, k] == viewed[b, t, h, k]", same)
    story.check("No copy: both share the same memory (same data_ptr), only shape and stride are swapped",
                "没有拷贝：两者共用同一块内存（data_ptr 相同），只是形状和步幅对调了",
                turned.data_ptr() == viewed.data_ptr() and turned.stride() == (12, 2, 4, 1)
                and viewed.stride() == (12, 4, 2, 1), stride_text(story, viewed, turned))
    story.check("transpose(1, 2) is the permutation (0, 2, 1, 3) of the axes",
                "transpose(1, 2) 就是把维度按 (0, 2, 1, 3) 重新排列",
                torch.equal(turned, viewed.permute(0, 2, 1, 3)))
    big = torch.empty(2, 10, 512).view(2, 10, 8, 64).transpose(1, 2)
    story.check("The document's example: (2, 10, 512) -> view (2, 10, 8, 64) -> transpose (2, 8, 10, 64)",
                "文档里的例子：(2, 10, 512) → view 成 (2, 10, 8, 64) → transpose 成 (2, 8, 10, 64)",
                tuple(big.shape) == (2, 8, 10, 64), str(tuple(big.shape)))
    story.text("Heads now sit in axis 1, next to the batch, so one batched matmul computes every head "
               "at once: torch.matmul treats all leading axes (B, H) as a batch.",
               "现在“头”排在第 1 维，紧挨着批量维，一次批量矩阵乘法就能同时算出所有头："
               "torch.matmul 会把前面的 (B, H) 都当作批量维。")


@topic("combine-heads", "002",
       ("combine_heads: transpose(1, 2).contiguous().view(B, L, d_model)",
        "combine_heads：transpose(1, 2).contiguous().view(B, L, d_model) 各做了什么"),
       ("What do transpose, contiguous and view each do in `combine_heads`?",
        "`x.transpose(1, 2).contiguous().view(batch_size, seq_length, self.d_model)` 这些操作是干嘛的？"))
def combine_heads_topic(story: Story) -> None:
    x = labelled_tensor(B=1, L=3, H=2, D=2)
    heads = split_right(x, 2).contiguous()       # stands for the attention output, (B, H, L, d_k)
    story.heading("Start: one output per head", "起点：每个头各有一份输出")
    story.text("Pretend the attention output is our labelled tensor, split into heads (B, H, L, d_k).",
               "假设注意力的输出就是我们的“自报家门”张量按头拆开后的样子，形状 (B, H, L, d_k)。")
    story.tensor("heads (B, H, L, d_k)", heads, layout=True)
    story.heading("1. transpose(1, 2): tokens back in front", "1. transpose(1, 2)：把词维换回前面")
    turned = heads.transpose(1, 2)               # (B, L, H, d_k)
    story.tensor("heads.transpose(1, 2) (B, L, H, d_k)", turned, layout=True)
    story.check("After transpose the tensor is no longer contiguous", "转置之后，张量不再是内存连续的",
                not turned.is_contiguous(), stride_text(story, turned))
    story.heading("2. view needs contiguous memory", "2. view 需要内存连续")
    err = error_of(lambda: turned.view(1, 3, 4))
    story.code(pick(story,
            "heads.transpose(1, 2).view(B, L, d_model)   # without contiguous()",
            "heads.transpose(1, 2).view(B, L, d_model)   # 不调用 contiguous()"))
    story.check("view right after transpose raises a RuntimeError", "转置后直接 view 会抛出 RuntimeError",
                isinstance(err, RuntimeError), error_text(err))
    packed = turned.contiguous()
    story.tensor("heads.transpose(1, 2).contiguous()", packed, layout=True)
    story.check("contiguous() copies the numbers into a fresh, row-major block of memory",
                "contiguous() 把数据按行优先的顺序拷贝到一块新内存里",
                packed.is_contiguous() and packed.data_ptr() != turned.data_ptr(),
                stride_text(story, packed))
    story.check("On a tensor that is already contiguous, contiguous() returns the tensor itself (no copy)",
                "如果张量本来就是连续的，contiguous() 直接返回它自己，不做拷贝",
                packed.contiguous() is packed)
    story.heading("3. view(B, L, d_model): glue the heads side by side", "3. view(B, L, d_model)：把各个头并排拼回去")
    merged = combine_heads(heads)
    story.tensor("combined (B, L, d_model)", merged, layout=True)
    story.check("combine_heads exactly undoes split_heads: we get the original x back",
                "combine_heads 恰好是 split_heads 的逆操作：原来的 x 原样回来了", torch.equal(merged, x))
    story.check("transpose(1, 2).reshape(B, L, d_model) (document 000's way) gives the same result",
                "transpose(1, 2).reshape(B, L, d_model)（文档 000 的写法）结果完全相同",
                torch.equal(heads.transpose(1, 2).reshape(1, 3, 4), merged))
    story.text("reshape is view when the strides allow it and contiguous().view otherwise, so document "
               "000's reshape and document 002's contiguous().view do the same work here.",
               "reshape 在步幅允许时就是 view，不允许时就是 contiguous().view，所以文档 000 的 reshape "
               "和文档 002 的 contiguous().view 在这里做的是同一件事。")


TOPICS = (reshape_then_transpose, split_heads_transpose, combine_heads_topic)
