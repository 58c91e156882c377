"""The table of mask conventions: keep (SDPA), block (nn.MultiheadAttention), additive, lengths (d2l's
valid_lens), key padding and transformers' 1 = token attention_mask, one meaning in six spellings, each
run through mh.attention; torch's own reading of each; and the classic mix-ups, run, changing the output."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

import multihead as mh
from multihead.explain.story import Story
from multihead.explain.topics.base import Say, diff_text, max_diff, topic

B, H, Lq, Lk, D = 2, 2, 3, 5, 4
VALID = torch.tensor([5, 3])   # d2l's valid_lens: sequence 1 has 3 real keys and 2 padding keys
EXACT = 1e-12                  # float64: the conventions agree to rounding
CHANGED = 0.05                 # a mix-up moves the output by far more than this


def _qkv() -> list[torch.Tensor]:
    """q (B, H, Lq, D), k and v (B, H, Lk, D), float64."""
    g = torch.Generator().manual_seed(0)
    return [torch.randn(B, H, L, D, generator=g, dtype=torch.float64) for L in (Lq, Lk, Lk)]


def scores_of(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """q k^T / sqrt(D): (B, H, Lq, Lk)."""
    return q @ k.transpose(-2, -1) / math.sqrt(D)


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """The meaning every convention spells, written out: blocked scores -> -inf, softmax, times v."""
    return scores_of(q, k).masked_fill(~keep, float("-inf")).softmax(-1) @ v


def torch_mha(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **masks: torch.Tensor) -> torch.Tensor:
    """nn.MultiheadAttention with identity projections on the heads merged to (B, L, H*D): its heads are
    q's, k's and v's own, so its masks can be compared with mh.attention's. Output (B, H, Lq, D)."""
    mha = nn.MultiheadAttention(H * D, H, bias=False, batch_first=True).double()
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.eye(H * D, dtype=torch.float64).repeat(3, 1))
        mha.out_proj.weight.copy_(torch.eye(H * D, dtype=torch.float64))
        merged = [t.transpose(1, 2).reshape(B, -1, H * D) for t in (q, k, v)]
        out, _ = mha(*merged, need_weights=False, **masks)
    return out.reshape(B, Lq, H, D).transpose(1, 2)


def row_text(mask: torch.Tensor) -> str:
    """Sequence 1's row of a mask, short: "T T T F F", "1 1 1 0 0", "0 0 0 -inf -inf" or "3"."""
    row = mask[1].flatten()
    if row.dtype == torch.bool:
        return " ".join("T" if x else "F" for x in row.tolist())
    return " ".join(f"{x:g}" for x in row.tolist())


@topic("mask-conventions")
def mask_conventions(story: Story, say: Say) -> None:
    q, k, v = _qkv()
    tokens = torch.arange(Lk) < VALID[:, None]                 # (B, Lk), True = a real token
    keep = tokens[:, None, None, :]                            # (B, 1, 1, Lk)
    additive = torch.zeros(keep.shape, dtype=torch.float64).masked_fill(~keep, float("-inf"))
    attention_mask = tokens.long()                             # transformers: 1 = token, 0 = padding
    want = reference(q, k, v, keep)
    say.text("text.one-meaning")
    spellings = {   # row: (the mask as its convention writes it, multihead's constructor, how it is written)
        "keep": (keep, mh.Mask.keep(keep), "Mask.keep(keep)"),
        "block": (~keep, mh.Mask.block(~keep), "Mask.block(~keep)"),
        "additive": (additive, mh.Mask.additive(additive), "Mask.additive(additive)"),
        "lengths": (VALID, mh.Mask.lengths(VALID), "Mask.lengths(valid_lens)"),
        "key-padding": (~tokens, mh.Mask.key_padding(~tokens), "Mask.key_padding(~tokens)"),
        "hf": (attention_mask, mh.Mask.key_padding(attention_mask == 0), "Mask.key_padding(attention_mask == 0)"),
    }
    rows, diffs = [], []
    for name, (mask, ours, written) in spellings.items():
        diffs.append(max_diff(mh.attention(q, k, v, mask=ours), want))
        rows.append([say(f"row.{name}"), say(f"who.{name}"), say(f"means.{name}"), row_text(mask), written,
                     f"{diffs[-1]:.1e}"])
    story.table([say("col.convention"), say("col.who"), say("col.means"), say("col.sequence-1"),
                 say("col.in-multihead"), say("col.diff")], rows, title=say("label.table-title"))
    say.check("check.every-convention-same", max(diffs) < EXACT)
    say.code("code.conversions")

    say.heading("heading.torch-says-so")
    say.check("check.sdpa-bool-keep", max_diff(F.scaled_dot_product_attention(q, k, v, attn_mask=keep), want) < EXACT)
    say.check("check.sdpa-float-additive",
              max_diff(F.scaled_dot_product_attention(q, k, v, attn_mask=additive), want) < EXACT)
    block_per_head = (~keep).expand(B, H, Lq, Lk).reshape(B * H, Lq, Lk)   # torch's (B*H, Lq, Lk) form
    say.check("check.mha-bool-block", max_diff(torch_mha(q, k, v, attn_mask=block_per_head), want) < EXACT)
    say.check("check.mha-key-padding", max_diff(torch_mha(q, k, v, key_padding_mask=~tokens), want) < EXACT)

    say.heading("heading.mix-ups")
    flipped = mh.attention(q, k, v, mask=mh.Mask.key_padding(attention_mask))
    say.check("check.hf-as-key-padding",
              max_diff(flipped, want) > CHANGED and bool((flipped[0] == 0).all())
              and max_diff(flipped[1], reference(q, k, v, ~keep)[1]) < EXACT, diff_text(flipped, want))
    inverted = mh.attention(q, k, v, mask=mh.Mask.block(keep))
    say.check("check.keep-as-block",
              max_diff(inverted, want) > CHANGED and max_diff(inverted[1], reference(q, k, v, ~keep)[1]) < EXACT,
              diff_text(inverted, want))
    lifted = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask[:, None, None, :].double())
    weights = (scores_of(q, k) + attention_mask[:, None, None, :]).softmax(-1)
    padding_weight = weights[1, 0, 0, ~tokens[1]].sum().item()
    say.check("check.01-added", max_diff(lifted, want) > CHANGED and padding_weight > CHANGED,
              say("detail.padding-weight", weight=padding_weight))
    say.text("text.say-it-by-name")
