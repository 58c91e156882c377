"""Attention scores: K.transpose(-2, -1), document 003's einsum, and the 1/sqrt(d_k) scale."""
from __future__ import annotations

import math

import torch

from multihead.explain.story import Story
from multihead.explain.topics.base import Say, error_of, error_text, max_diff, stride_text, topic
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


def saturation(d_k: int, scaled: bool, rows: int = 128, keys: int = 16, seed: int = 0,
               factor: float | None = None) -> dict[str, float]:
    """Softmax over `keys` random scores q.k with unit-variance q, k of size d_k, with or without 1/sqrt(d_k)
    (or times `factor`, when given: a mistaken scale).

    Returns the scores' std, the mean largest weight, the mean entropy (nats) and the mean |gradient|
    that reaches the scores through the softmax (for a random upstream gradient).
    """
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(rows, d_k, generator=g)
    k = torch.randn(rows, keys, d_k, generator=g)
    upstream = torch.randn(rows, keys, generator=g)
    if factor is None:
        factor = 1 / math.sqrt(d_k) if scaled else 1.0
    scores = torch.einsum("rd,rkd->rk", q, k) * factor   # (rows, keys)
    scores.requires_grad_(True)
    weights = scores.softmax(dim=-1)
    (weights * upstream).sum().backward()
    entropy = -(weights * weights.clamp_min(1e-30).log()).sum(-1).mean()
    return {"std": scores.std().item(), "max_weight": weights.max(-1).values.mean().item(),
            "entropy": entropy.item(), "grad": scores.grad.abs().mean().item()}


# d_k = 64 in a model of 8 heads (d_model = 512): the factors of the usual wrong scales
WRONG_FACTORS = {"1/sqrt(d_model)": 1 / math.sqrt(512), "1/d_k": 1 / 64, "1/(2 sqrt(d_k))": 1 / 16}


def scaled_after_softmax(d_k: int, rows: int = 128, keys: int = 16, seed: int = 0) -> dict[str, float]:
    """The mistake softmax(q.k) / sqrt(d_k), on saturation()'s scores: the mean row sum, and the mean largest
    weight as a share of its row (the shape of the weights, which the division leaves unscaled)."""
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(rows, d_k, generator=g), torch.randn(rows, keys, d_k, generator=g)
    weights = torch.einsum("rd,rkd->rk", q, k).softmax(dim=-1) / math.sqrt(d_k)   # (rows, keys)
    sums = weights.sum(-1)
    return {"sum": sums.mean().item(), "max_weight": (weights.max(-1).values / sums).mean().item()}


@topic("k-transpose", "002")
def k_transpose(story: Story, say: Say) -> None:
    Q, K = _randn(1, 2, 3, 4, seed=1), _randn(1, 2, 5, 4, seed=2)   # (B, H, Lq=3, d_k), (B, H, Lk=5, d_k)
    say.heading("heading.both-q-k-are")
    story.code("Q: (1, 2, 3, 4)   K: (1, 2, 5, 4)\ntorch.matmul(Q, K)")
    err = error_of(lambda: torch.matmul(Q, K))
    say.check("check.without-transpose-matmul-refuses", isinstance(err, RuntimeError), error_text(err))
    Kt = K.transpose(-2, -1)                     # (B, H, d_k, Lk)
    scores = torch.matmul(Q, Kt)                 # (B, H, Lq, Lk)
    say.code("code.kt-k-transpose-2")
    story.tensor("scores (B, H, Lq, Lk)", scores)
    say.check("check.scores-b-h-i", max_diff(scores, scores_by_loops(Q, K)) < 1e-12)
    say.check("check.leading-b-h-axes",
              tuple(scores.shape) == (1, 2, 3, 5) and max_diff(scores[0, 1], Q[0, 1] @ K[0, 1].T) < 1e-12)
    say.check("check.transpose-free-view-no",
              Kt.data_ptr() == K.data_ptr() and Kt.stride()[-2:] == K.stride()[-2:][::-1],
              stride_text(story, K, Kt))
    say.check("check.transpose-1-2-document",
              torch.equal(K.transpose(-1, -2), Kt) and torch.equal(K.transpose(2, 3), Kt))
    flipped = torch.matmul(K, Q.transpose(-2, -1))   # (B, H, Lk, Lq)
    say.check("check.order-matters-k-q", torch.equal(flipped, scores.transpose(-2, -1)))
    say.text("text.maths-qk-t-pairs")


@topic("einsum-scores", "003")
def einsum_scores(story: Story, say: Say) -> None:
    model = SeqFirstEinsumHeads(heads=2, d_model=8, dropout_prob=0.0).double()
    query, key = _randn(2, 1, 2, 4, seed=3), _randn(3, 1, 2, 4, seed=4)   # the document's i=2, j=3, b=1, h=2, d=4
    scores = model.get_score(query, key)         # (i, j, b, h)
    say.heading("heading.document-s-example-i")
    story.code("# query (2, 1, 2, 4), key (3, 1, 2, 4)\nscores = torch.einsum('ibhd,jbhd->ijbh', query, key)")
    say.check("check.result-has-shape-i", tuple(scores.shape) == (2, 3, 1, 2), f"{say('shape')} {tuple(scores.shape)}")
    by_hand = sum(query[1, 0, 1, d] * key[2, 0, 1, d] for d in range(4))
    say.check("check.scores-i-j-b",
              abs(scores[1, 2, 0, 1].item() - by_hand.item()) < 1e-12,
              say("detail.entry", einsum=scores[1, 2, 0, 1].item(), hand=by_hand.item()))
    say.heading("heading.rule-letters-missing-from")
    say.text("text.b-h-appear-both")
    kept_d = torch.einsum("ibhd,jbhd->ijbhd", query, key)
    say.check("check.keeping-d-output-ijbhd", max_diff(kept_d.sum(-1), scores) < 1e-12)
    say.check("check.einsum-equals-batched-matmul", max_diff(einsum_as_matmul(query, key), scores) < 1e-12)
    attn = model.softmax(scores)                 # nn.Softmax(dim=1): over j, the keys
    say.check("check.this-i-j-b",
              max_diff(attn.sum(dim=1), torch.ones(2, 1, 2)) < 1e-12
              and max_diff(attn, scores.permute(2, 3, 0, 1).softmax(-1).permute(2, 3, 0, 1)) < 1e-12)
    value = _randn(3, 1, 2, 4, seed=5)
    out = torch.einsum("ijbh,jbhd->ibhd", attn, value)
    ref = (attn.permute(2, 3, 0, 1) @ value.permute(1, 2, 0, 3)).permute(2, 0, 1, 3)   # (i, b, h, d)
    say.check("check.second-einsum-ijbh-jbhd", max_diff(out, ref) < 1e-12)
    say.check("check.small-correction-after-self", tuple(model.query(_randn(3, 1, 8)).shape) == (3, 1, 2, 4))


@topic("scale-sqrt-dk", "003")
def scale_sqrt_dk(story: Story, say: Say) -> None:
    sizes = (4, 16, 64, 256, 1024)
    raw = {d: saturation(d, scaled=False) for d in sizes}
    scaled = {d: saturation(d, scaled=True) for d in sizes}
    say.text("text.take-q-k-unit")
    say.code("code.scores-q-k-t")
    columns = ["d_k", say("label.std-scores"),
               say("label.largest-weight"), say("label.entropy")]
    for measured, title in ((raw, say("label.unscaled-q-k-t")),
                            (scaled, say("label.scaled-q-k-t"))):
        story.table(columns, [[d, f"{measured[d]['std']:.2f}", f"{measured[d]['max_weight']:.3f}",
                               f"{measured[d]['entropy']:.3f}"] for d in sizes], title=title)
    say.check("check.unscaled-scores-std-grows",
              all(abs(raw[d]["std"] / math.sqrt(d) - 1) < 0.15 for d in sizes))
    say.check("check.scaled-1-sqrt-d", all(abs(scaled[d]["std"] - 1) < 0.15 for d in sizes))
    say.check("check.unscaled-softmax-saturates-at",
              raw[1024]["max_weight"] > 0.9 and raw[1024]["max_weight"] > raw[4]["max_weight"],
              f"{say('label.largest-weight')} {raw[1024]['max_weight']:.3f}")
    say.check("check.scaled-weights-look-same", all(0.15 < scaled[d]["max_weight"] < 0.35 for d in sizes))
    ratio = raw[1024]["grad"] / scaled[1024]["grad"]
    say.check("check.saturated-softmax-passes-back", ratio < 0.25, say("detail.ratio", ratio=ratio))
    wrong = [saturation(64, True, factor=f) for f in WRONG_FACTORS.values()]
    say.check("check.wrong-factors-flatten", all(w["std"] < 0.6 and w["max_weight"] < scaled[64]["max_weight"]
                                                 for w in wrong),
              say("detail.wrong-factors", std=" / ".join(f"{w['std']:.2f}" for w in wrong),
                  top=" / ".join(f"{w['max_weight']:.3f}" for w in wrong)))
    after = scaled_after_softmax(64)
    say.check("check.scaling-after-softmax", abs(after["sum"] - 1 / 8) < 1e-6
              and abs(after["max_weight"] - raw[64]["max_weight"]) < 1e-5,
              say("detail.after-softmax", sum=after["sum"], top=after["max_weight"]))
    say.text("text.this-what-document-003")


TOPICS = (k_transpose, einsum_scores, scale_sqrt_dk)
