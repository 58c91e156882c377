"""What a head is (document 004): heads folded into the batch, where "multi-head" lives, and how heads
differ from convolution kernels."""
from __future__ import annotations

import math

import torch
from torch import nn

import multihead as mh
from multihead.explain.story import Story
from multihead.explain.topics.base import Say, diff_text, max_diff, topic
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


@topic("where-heads-live", "004")
def where_heads_live(story: Story, say: Say) -> None:
    one, four = d2l_model(1), d2l_model(4)
    same_keys = {k: tuple(v.shape) for k, v in one.state_dict().items()} == \
                {k: tuple(v.shape) for k, v in four.state_dict().items()}
    four.load_state_dict(one.state_dict())
    say.code("code.one-multiheadattention-num-heads")
    say.check("check.1-head-4-head", same_keys, ", ".join(one.state_dict()))
    torch.manual_seed(1)
    x = 3 * torch.randn(1, 5, 8, dtype=torch.float64)               # (B, L, num_hiddens); 3x for sharper maps
    y1, y4 = one(x, x, x, None), four(x, x, x, None)
    say.check("check.identical-weights-outputs-still", max_diff(y1, y4) > 1e-3, diff_text(y1, y4))
    say.check("check.4-head-output-exactly", max_diff(y4, per_slice_attention(four, x)) < 1e-12)
    weights = four.attention.attention_weights.reshape(1, 4, 5, 5)[0]     # (B*H, L, L) -> (H, L, L)
    story.figure(say("label.4-heads-attention-weights"),
                 weights)
    say.check("check.each-head-has-own",
              all(max_diff(weights[a], weights[b]) > 1e-3 for a in range(4) for b in range(a + 1, 4)))
    say.text("text.so-multi-head-lives")


@topic("heads-in-batch", "004")
def heads_in_batch(story: Story, say: Say) -> None:
    B, L, H, d = 2, 3, 2, 2
    X = labelled_tensor(B=B, L=L, H=H, D=d)                       # value = 1000*b + 100*t + 10*h + f
    folded = transpose_qkv(X, H)                                  # (B*H, L, d)
    say.text("text.again-every-number-names")
    story.code("# (B, L, num_hiddens) -> (B*H, L, num_hiddens/H)\nfolded = transpose_qkv(X, num_heads)")
    story.tensor("X (B, L, num_hiddens)", X)
    story.tensor("folded (B*H, L, d)", folded)
    say.check("check.element-count-unchanged-b",
              X.numel() == folded.numel() == B * L * H * d,
              say("detail.elements", before=X.numel(), after=folded.numel()))
    say.check("check.row-r-folded-batch", folded_rows_ok(folded, H))
    say.check("check.transpose-output-undoes-exactly", torch.equal(transpose_output(folded, H), X))
    valid_lens = torch.tensor([3, 2])
    inter = torch.repeat_interleave(valid_lens, repeats=H, dim=0)
    tiled = valid_lens.repeat(H)
    story.table(["r", say("label.batch-row-r"), "repeat_interleave", "repeat"],
                [[r, r // H, inter[r].item(), tiled[r].item()] for r in range(B * H)])
    say.check("check.repeat-interleave-copies-each",
              all(inter[r] == valid_lens[r // H] for r in range(B * H)))
    say.check("check.while-plain-repeat-would",
              not torch.equal(tiled, inter), say("detail.repeats", tiled=tiled.tolist(), inter=inter.tolist()))
    model = d2l_model(2)
    x = torch.randn(2, 5, 8, dtype=torch.float64)
    lens = torch.tensor([3, 5])
    ours = mh.MultiHeadAttention.from_module(model)
    say.code("code.ours-mh-multiheadattention-from")
    say.check("check.multihead-keeps-heads-their",
              max_diff(ours(x, mask=mh.Mask.lengths(lens)), model(x, x, x, lens)) < 1e-12)


@topic("heads-vs-conv", "004")
def heads_vs_conv(story: Story, say: Say) -> None:
    E = 16
    conv_params = {C: param_count(nn.Conv1d(E, C, kernel_size=3)) for C in HEAD_COUNTS}
    attn_params = d2l_param_counts(E)
    story.table([say("label.kernels-heads"), "Conv1d(16, C, 3)",
                 say("label.d2l-attention-num-hiddens")],
                [[n, conv_params[n], attn_params[n]] for n in HEAD_COUNTS])
    say.check("check.every-extra-conv-kernel", all(conv_params[n] == n * (E * 3 + 1) for n in HEAD_COUNTS))
    say.check("check.extra-heads-bring-no", len(set(attn_params.values())) == 1)
    torch.manual_seed(0)
    conv = nn.Conv1d(E, 4, kernel_size=3).double()
    x = torch.randn(1, E, 12, dtype=torch.float64)                # (B, channels, positions)
    before = conv(x)
    with torch.no_grad():
        conv.weight[0] += 1.0                                     # change kernel 0 only
    after = conv(x)
    say.check("check.kernels-do-not-share",
              max_diff(before[:, 0], after[:, 0]) > 0 and max_diff(before[:, 1:], after[:, 1:]) == 0)
    shifted = torch.roll(x, 1, dims=-1)
    say.check("check.what-conv-shares-one", max_diff(conv(shifted)[..., 2:], conv(x)[..., 1:-1]) < 1e-12)
    say.text("text.kind-correction-document-004")
    model = d2l_model(2)
    tokens = torch.randn(1, 12, 8, dtype=torch.float64)          # (B, L, num_hiddens)
    poked = tokens.clone()
    poked[0, 0] += 1.0                                            # change token 0 only
    seq_x, seq_poked = tokens.transpose(1, 2), poked.transpose(1, 2)   # (B, channels, L) for the conv
    conv8 = nn.Conv1d(8, 8, kernel_size=3, padding=1).double()
    say.check("check.kernel-sees-window-3",
              max_diff(conv8(seq_x)[..., -1], conv8(seq_poked)[..., -1]) == 0
              and max_diff(model(tokens, tokens, tokens, None)[0, -1], model(poked, poked, poked, None)[0, -1]) > 0)
    w_before = model.attention.attention_weights.clone()
    model(tokens, tokens, tokens, None)
    say.check("check.head-s-weights-are", max_diff(w_before, model.attention.attention_weights) > 1e-6)


TOPICS = (where_heads_live, heads_in_batch, heads_vs_conv)
