"""Masks: masked_fill and -1e9 (document 002), the fill value in half precision and fully masked rows
(documents 000, 002, 004), and document 003's mask asserts next to multihead's Mask."""
from __future__ import annotations

import torch

import multihead as mh
from multihead.explain.story import Story
from multihead.explain.topics.base import Say, diff_text, error_of, error_text, max_diff, topic
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


@topic("masked-fill", "002")
def masked_fill_topic(story: Story, say: Say) -> None:
    q, k, v = _qkv()
    scores = (q @ k.transpose(-2, -1))[0, 0] / 2.0          # (Lq, Lk) for head 0, scaled by sqrt(4)
    keep = CAUSAL_KEEP
    say.heading("heading.causal-keep-mask-1")
    story.tensor("mask (Lq, Lk)", keep)
    story.tensor(say("label.scores-lq-lk"), scores)
    w = masked_weights(scores, keep, -1e9)
    story.code("weights = scores.masked_fill(mask == 0, -1e9).softmax(dim=-1)")
    story.tensor(say("label.weights"), w)
    say.check("check.blocked-positions-get-exactly",
              bool((w[keep == 0] == 0).all()) and max_diff(w.sum(-1), torch.ones(3)) < 1e-12)
    zero = masked_weights(scores, keep, 0.0)
    say.check("check.filling-0-instead-does",
              bool((zero[keep == 0] > 0).all()),
              say("detail.future-weight", zero=zero[0, 1].item()))
    say.check("check.multiplying-scores-mask-same", torch.equal((scores * keep).softmax(-1), zero))
    say.check("check.inf-gives-same-weights", torch.equal(masked_weights(scores, keep, float("-inf")), w))
    after = scores.softmax(dim=-1).masked_fill(keep == 0, 0.0)     # the mask applied to the weights instead
    say.check("check.mask-after-softmax-loses", bool((after.sum(-1)[:2] < 1 - 1e-3).all()),
              say("detail.row-sums", sums=story.pick(", ", "、").join(f"{s:.3f}" for s in after.sum(-1).tolist())))
    hides_self = masked_weights(scores, torch.tril(torch.ones_like(keep), -1), -1e9)
    sees_next = masked_weights(scores, torch.tril(torch.ones_like(keep), 1), -1e9)
    say.check("check.causal-keeps-diagonal",
              bool((w.diagonal() > 0).all()) and hides_self[0, 2].item() > 0.1 and sees_next[0, 1].item() > 0.01,
              say("detail.off-by-one", leak=hides_self[0, 2].item(), peek=sees_next[0, 1].item()))
    flipped = (scores + (1 - keep) * 1e9).softmax(dim=-1)           # a 1 = blocked mask, added with the wrong sign
    say.check("check.sign-flipped", bool((flipped[:2][keep[:2] == 1] < 1e-12).all()),
              say("detail.blocked-weight", weight=flipped[0][keep[0] == 0].sum().item()))
    inplace, dropped = scores.clone(), scores.clone()
    returned = inplace.masked_fill_(keep == 0, -1e9)
    dropped.masked_fill(keep == 0, -1e9)                           # the result thrown away: nothing masked
    say.check("check.masked-fill-document-001",
              returned is inplace and torch.equal(inplace, scores.masked_fill(keep == 0, -1e9))
              and torch.equal(dropped, scores))
    model = ClassicTransformerHeads(d_model=8, num_heads=2).double()
    ours = mh.attention(q, k, v, mask=mh.Mask.keep(keep))
    say.code("code.mh-attention-q-k")
    say.check("check.document-002-s-scaled",
              max_diff(model.scaled_dot_product_attention(q, k, v, keep), ours) < 1e-12)
    story.figure(say("label.attention-weights-per-head"),
                 masked_weights((q @ k.transpose(-2, -1))[0] / 2.0, keep, -1e9))
    say.text("text.softmax-turns-scores-into")


@topic("mask-fill-value", "002")
def mask_fill_value(story: Story, say: Say) -> None:
    dtypes = (torch.float16, torch.bfloat16, torch.float32)
    story.table(["dtype", "-1e9", "-1e6 (d2l)", "finfo(dtype).min"],
                [[str(d), *(fill_text(v) for v in (fill_in(d, -1e9), fill_in(d, -1e6), torch.finfo(d).min))]
                 for d in dtypes],
                title=say("label.fill-value-once-stored"))
    say.check("check.float16-tops-out-at",
              fill_in(torch.float16) == float("-inf") and fill_in(torch.float16, -1e6) == float("-inf"))
    q, k, _ = _qkv(dtype=torch.float32)
    scores_h = (q @ k.transpose(-2, -1))[0, 0].half()       # (Lq, Lk) in float16
    err = error_of(lambda: scores_h.masked_fill(CAUSAL_KEEP == 0, -1e9))
    say.check("check.masked-fill-1e9-float16", isinstance(err, RuntimeError), error_text(err))
    block = torch.tensor([[0, 1, 1], [0, 0, 1], [1, 1, 1]]).half()   # document 000: 1 = blocked; row 2 all blocked
    say.code("code.scores-scores-attention-mask")
    added = scores_h + block * -1e9
    say.check("check.document-000-s-additive",
              bool(torch.isinf(added[block == 1]).all()) and bool(added.float().softmax(-1)[2].isnan().all()))
    premade = block * torch.tensor(-1e9, dtype=torch.float16)   # the constant made in float16 first
    say.check("check.worse-if-1e9-turned",
              int(premade.isnan().sum()) == int((block == 0).sum()),
              say("detail.nan-count", nans=int(premade.isnan().sum())))
    say.heading("heading.fully-masked-row-float32")
    row = scores_h.float()[0]
    everything = torch.ones(3, dtype=torch.bool)  # block every key of the row
    story.table([say("label.fill"), say("label.weights-fully-masked-row")],
                [[fill_text(f), ", ".join(f"{w:.4f}" for w in row.masked_fill(everything, f).softmax(-1))]
                 for f in (float("-inf"), -1e9, -1e6)])
    say.check("check.inf-row-0-0", bool(row.masked_fill(everything, float("-inf")).softmax(-1).isnan().all()))
    say.check("check.1e9-or-1e6-row",
              max_diff(row.masked_fill(everything, -1e9).softmax(-1), torch.full((3,), 1 / 3)) < 1e-6)
    say.heading("heading.what-multihead-does")
    say.text("text.compute-softmax-float32-whatever")
    safe = row.masked_fill(everything, torch.finfo(torch.float32).min).softmax(-1)
    say.check("check.finfo-float32-min-never", bool(torch.isfinite(safe).all()))
    keep = (block == 0)                          # (Lq, Lk), True = keep; row 2 keeps nothing
    qh, kh, vh = (t.half().requires_grad_(True) for t in _qkv(dtype=torch.float32))
    out = mh.attention(qh, kh, vh, mask=mh.Mask.keep(keep))
    out.float().sum().backward()
    say.code("code.out-mh-attention-q")
    story.tensor("out[0, 0] (Lq, D), float16", out[0, 0])
    say.check("check.float16-mh-attention-gives",
              bool(torch.isfinite(out).all()) and bool((out[..., 2, :] == 0).all())
              and bool((qh.grad[..., 2, :] == 0).all()))
    ref = mh.attention(*(t.detach().double() for t in (qh, kh, vh)), mask=mh.Mask.keep(keep))
    say.check("check.kept-rows-match-float64", max_diff(out[..., :2, :], ref[..., :2, :]) < 5e-3,
              diff_text(out[..., :2, :], ref[..., :2, :]))


@topic("mask-asserts", "003")
def mask_asserts(story: Story, say: Say) -> None:
    Lq, Lk, B, H = 4, 5, 2, 2
    query_shape, key_shape = (Lq, B, 8), (Lk, B, 8)          # sequence-first (L, B, d_model)
    say.text("text.document-003-sequence-first")
    say.code("code.assert-mask-shape-0")
    cases = [((Lq, Lk, B), "case.full"), ((1, Lk, B), "case.padding"), ((Lq, Lk, 1), "case.causal"),
             ((1, Lk, 1), "case.one-row"), ((Lq, 1, B), "case.keys-broadcast"), ((B, Lk, Lq), "case.as-document-says")]
    model = SeqFirstEinsumHeads(heads=H, d_model=8)
    rows, agree = [], True
    for shape, note in cases:
        verdict = assert_verdicts(shape, query_shape, key_shape)
        mask = torch.ones(shape)
        accepted = error_of(lambda: model.prepare_mask(mask, query_shape, key_shape)) is None
        bare = error_of(lambda: labml_mask_asserts(mask, query_shape, key_shape))
        agree &= accepted == all(verdict) == (bare is None)
        rows.append([str(shape), say(note), *("✓" if v else "✗" for v in verdict)])
    story.table([say("label.mask-shape"), say("label.meaning"),
                 "assert 1", "assert 2", "assert 3"], rows)
    say.check("check.three-asserts-textbook-s", agree)
    scores_shape = (Lq, Lk, B, H)
    say.check("check.every-accepted-mask-after",
              all(torch.broadcast_shapes(s + (1,), scores_shape) == scores_shape
                  for s, _ in cases if all(assert_verdicts(s, query_shape, key_shape))))
    say.check("check.assert-2-allows-no",
              torch.broadcast_shapes((Lq, 1, B, 1), scores_shape) == scores_shape
              and not assert_verdicts((Lq, 1, B), query_shape, key_shape)[1])
    say.check("check.batch-key-query-layout", not all(assert_verdicts((B, Lk, Lq), query_shape, key_shape)))
    bare = error_of(lambda: labml_mask_asserts(torch.ones(B, Lk, Lq), query_shape, key_shape))
    say.check("check.failing-bare-assert-says",
              isinstance(bare, AssertionError) and str(bare) == "", error_text(bare))
    silent = error_of(lambda: exec(compile("assert False", "<mask>", "exec", optimize=1)))
    say.check("check.under-python-o-asserts", silent is None)
    say.heading("heading.multihead-s-mask-instead")
    g = torch.Generator().manual_seed(0)
    labml = (torch.rand(Lq, Lk, B, generator=g) > 0.3).long()
    labml[:, 0] = 1                               # every query keeps key 0
    ours = mh.Mask.keep(labml.permute(2, 0, 1).unsqueeze(1))   # (Lq, Lk, B) -> (B, 1, Lq, Lk)
    say.code("code.mask-mh-mask-keep")
    keep, _ = ours.materialize(B, H, Lq, Lk)
    say.check("check.materialised-b-h-lq",
              torch.equal(keep.expand(B, H, Lq, Lk), labml.permute(2, 0, 1).unsqueeze(1).expand(B, H, Lq, Lk).bool()))
    q, k, v = _qkv(B=B, H=H, Lq=Lq, Lk=Lk)
    scores = torch.einsum("bhid,bhjd->ijbh", q, k) / 2.0      # (Lq, Lk, B, H), document 003's layout
    w = scores.masked_fill(labml.unsqueeze(-1) == 0, float("-inf")).softmax(dim=1)
    ref = torch.einsum("ijbh,bhjd->bhid", w, v)
    say.check("check.mh-attention-that-mask", max_diff(mh.attention(q, k, v, mask=ours), ref) < 1e-12)
    err = error_of(lambda: mh.attention(q, k, v, mask=mh.Mask.keep(labml)))
    say.code("code.mh-attention-q-k")
    say.check("check.mask-that-cannot-broadcast",
              isinstance(err, mh.AttentionError) and isinstance(err, ValueError) and "expected" in str(err),
              error_text(err))


TOPICS = (masked_fill_topic, mask_fill_value, mask_asserts)
