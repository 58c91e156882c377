"""The bug catalogue: multi-head attention written out plainly, and the known ways learners get it wrong.

``reference_variant(xq, xk, xv, weights, keep, causal=..., mistake=...)`` is multi-head
attention in plain torch, step by step. With ``mistake=None`` it is correct; every other value of
``mistake`` is one *form* of one known bug, and changes exactly one step. The checker runs every form
on the learner's inputs and weights and names the bug whose outputs the learner's module reproduces.

Shapes: xq (B, Lq, Eq), xk (B, Lk, Ek), xv (B, Lk, Ev), batch first; keep: bool broadcastable to
(B, 1, Lq, Lk), True = may attend, or None; output (B, Lq, O).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from multihead.checker.behaviour.options import Options
from multihead.checker.roles.assign import Weights


@dataclass(frozen=True)
class Bug:
    """One catalogue entry: its id, the ``multihead explain`` topic that teaches it, and its forms."""

    id: str
    topic: str
    forms: tuple[str, ...]  # values of ``mistake`` that reproduce it; () = found by inspection only


BUGS: tuple[Bug, ...] = (
    Bug("reshape-without-transpose", "reshape-then-transpose", ("split-by-reshape",)),
    Bug("merge-without-transpose", "combine-heads", ("merge-by-reshape",)),
    Bug("softmax-wrong-axis", "softmax-axis", ("softmax-over-queries", "softmax-over-heads",
                                               "softmax-over-batch")),
    Bug("missing-scale", "scale-sqrt-dk", ("no-scale",)),
    Bug("scale-by-embed-dim", "scale-sqrt-dk", ("scale-by-embed",)),
    Bug("scale-halved", "scale-sqrt-dk", ("scale-halved",)),
    Bug("scale-by-head-dim", "scale-sqrt-dk", ("scale-by-head-dim",)),
    Bug("wrong-scale", "scale-sqrt-dk", ()),
    Bug("scale-after-softmax", "scale-sqrt-dk", ("scale-after-softmax",)),
    Bug("mask-after-softmax", "masked-fill", ("mask-weights-with-zero", "mask-weights-with-fill")),
    Bug("mask-filled-with-zero", "masked-fill", ("fill-blocked-with-zero",)),
    Bug("mask-wrong-rows", "heads-in-batch", ("mask-rows-tiled",)),
    Bug("no-output-projection", "linear-d-model", ("skip-output-projection",)),
    Bug("causal-off-by-one", "masked-fill", ("causal-blocks-diagonal", "causal-sees-next-token")),
    Bug("causal-mask-unused", "masked-fill", ()),  # a causal pattern built in forward never reaches the output
    Bug("causal-mask-reversed", "masked-fill", ()),  # triu kept, not tril: found on the learner's own scores (core/)
    Bug("keys-used-as-values", "keys-vs-values", ("weights-times-keys",)),
    Bug("scores-without-key-transpose", "k-transpose", ("scores-q-times-k",)),
    Bug("view-on-non-contiguous", "view-vs-contiguous", ("merge-by-view",)),
    Bug("forward-misspelled", "farward-typo", ()),
    Bug("mask-ignored", "masked-fill", ("ignore-mask",)),
    Bug("mask-sign-flipped", "masked-fill", ()),
    Bug("kv-heads-tiled", "gqa-memory", ("kv-heads-tiled",)),
    # judged by behaviour outside reference_variant's forms: RoPE pairings (rotary.py), cached steps
    # (targets/kv_cache.py), an MLA module's absorbed path against its naive forward (targets/latent.py)
    Bug("rope-half-split-on-interleaved", "rope", ()),
    Bug("rope-interleaved-on-half-split", "rope", ()),
    Bug("cache-positions-not-offset", "kv-cache", ()),
    Bug("cache-causal-top-left", "kv-cache", ()),
    Bug("mla-absorbed-wuk-transposed", "mla", ()),
    # judged against what the caller or the constructor says (behaviour/mask_meaning.py, options.py)
    Bug("mask-inverted", "masked-fill", ()),
    Bug("window-off-by-one", "window-and-sinks", ()),
    Bug("qk-norm-wrong-axis", "where-heads-live", ()),
    Bug("rope-partial-wrong-features", "rope", ()),
    # a sparse-attention or top-k selection function, judged against mh.Mask.sparse and topk (sparse.py)
    Bug("sparse-none-unmasked", "sparse-attention", ()),
    Bug("topk-wrong-axis", "sparse-attention", ()),
)
BUG_BY_ID = {bug.id: bug for bug in BUGS}
MASK_BUGS = {"mask-after-softmax", "mask-filled-with-zero", "mask-wrong-rows", "mask-ignored", "mask-sign-flipped",
             "mask-inverted"}  # bugs in how the caller's mask is used: the report then discusses the mask
BUG_OF_FORM = {form: bug for bug in BUGS for form in bug.forms}
# Forms that only differ from the correct maths when some key is masked (by a mask or causally),
# or only when the caller passes a mask.
NEEDS_MASK = {"mask-weights-with-zero", "mask-weights-with-fill"}
NEEDS_USER_MASK = {"ignore-mask", "mask-rows-tiled"}
FILLS_BLOCKED = {"fill-blocked-with-zero": 0.0}  # forms that fill blocked scores with a number that blocks nothing
# Scale forms are not tried one by one: the checker measures the effective scale instead (scale.py),
# which tells 1/(2 sqrt(D)) from 1/sqrt(E) even where the two are the same number for one head count.
SCALE_FORMS = {"no-scale": lambda H, D: 1.0, "scale-by-embed": lambda H, D: (H * D) ** -0.5,
               "scale-halved": lambda H, D: 0.5 * D ** -0.5, "scale-by-head-dim": lambda H, D: 1.0 / D}
NEEDS_CAUSAL = {"causal-blocks-diagonal", "causal-sees-next-token"}

BLOCKED_FILL = -1e9  # the finite fill learners use; the correct maths uses -inf
NO_OPTIONS = Options()


def _project(x: torch.Tensor, proj) -> torch.Tensor:
    """x (B, L, E_in) -> (B, L, E_out) with ``proj = (weight, bias or None)``."""
    weight, bias = proj
    return torch.nn.functional.linear(x, weight, bias)


def _split(t: torch.Tensor, num_heads: int, mistake: str | None) -> torch.Tensor:
    """(B, L, H*D) -> (B, H, L, D)."""
    B, L, HD = t.shape
    if mistake == "split-by-reshape":
        return t.reshape(B, num_heads, L, HD // num_heads)  # (B, H, L, D) in the wrong memory order
    return t.reshape(B, L, num_heads, HD // num_heads).transpose(1, 2)  # (B, H, L, D)


def _merge(out: torch.Tensor, mistake: str | None) -> torch.Tensor:
    """(B, H, Lq, D) -> (B, Lq, H*D)."""
    B, H, Lq, D = out.shape
    if mistake == "merge-by-reshape":
        return out.reshape(B, Lq, H * D)  # heads and positions mixed up
    if mistake == "merge-by-view":
        return out.transpose(1, 2).view(B, Lq, H * D)  # raises: view on a non-contiguous tensor
    return out.transpose(1, 2).reshape(B, Lq, H * D)  # (B, Lq, H*D)


def _causal_keep(Lq: int, Lk: int, mistake: str | None, device) -> torch.Tensor:
    """(Lq, Lk) bool, True = may attend; query i sees keys j <= i (top-left aligned)."""
    offset = {"causal-blocks-diagonal": -1, "causal-sees-next-token": 1}.get(mistake, 0)
    return torch.ones(Lq, Lk, dtype=torch.bool, device=device).tril(offset)


def _tiled_rows(keep: torch.Tensor, num_heads: int) -> torch.Tensor:
    """keep (B, 1, Lq, Lk) -> (B, H, Lq, Lk) as ``mask.repeat(H, 1, 1)`` gives it to heads folded as (B*H):
    folded row r = b*H + h belongs to batch b but gets the mask of batch r % B."""
    B = keep.shape[0]
    rows = torch.arange(B * num_heads) % B  # (B*H,)
    return keep[rows, 0].view(B, num_heads, *keep.shape[-2:])


def reference_variant(xq, xk, xv, weights: Weights, keep, *, causal: bool = False,
                      mistake: str | None = None, fill: float = -math.inf,
                      scale: float | None = None, positions: tuple | None = None,
                      options: Options | None = None) -> torch.Tensor:
    """Multi-head attention with at most one known mistake; ``fill`` is what blocked scores become;
    ``scale`` (default 1/sqrt(D)) multiplies the scores; ``weights.rope`` (if set) turns q and k to
    ``positions`` = (q positions (Lq,), k positions (Lk,)), default 0 ... L-1; ``options`` (QK-norm, a
    window, sinks, a softcap: ``options.py``) as the module was found to use them."""
    opts = options or NO_OPTIONS
    if mistake == "ignore-mask":
        keep = None  # e.g. `scores.masked_fill(...)` whose result is thrown away
    num_heads, kv_heads = weights.num_heads, weights.num_kv_heads
    q = _split(opts.norm_width(_project(xq, weights.q), "q"), num_heads, mistake)  # (B, H, Lq, D)
    k = _split(opts.norm_width(_project(xk, weights.k), "k"), kv_heads, mistake)  # (B, Hkv, Lk, D)
    v = _split(_project(xv, weights.v), kv_heads, mistake)  # (B, Hkv, Lk, D)
    q, k = opts.norm_q_k(q, k, after_rope=False)
    q_at, k_at = positions or (torch.arange(q.shape[-2]), torch.arange(k.shape[-2]))
    if weights.rope is not None:
        q, k = weights.rope.turn(q, q_at), weights.rope.turn(k, k_at)
    q, k = opts.norm_q_k(q, k, after_rope=True)
    if kv_heads != num_heads and mistake == "kv-heads-tiled":  # query head h reads kv head h % Hkv
        k, v = (t.repeat(1, num_heads // kv_heads, 1, 1) for t in (k, v))  # (B, H, Lk, D)
    elif kv_heads != num_heads:  # query head h reads kv head h // (H / Hkv)
        k, v = (t.repeat_interleave(num_heads // kv_heads, dim=1) for t in (k, v))  # (B, H, Lk, D)
    D, Lq, Lk = q.shape[-1], q.shape[-2], k.shape[-2]

    scores = q @ k if mistake == "scores-q-times-k" else q @ k.transpose(-2, -1)  # (B, H, Lq, Lk)
    if mistake in SCALE_FORMS:
        scale = SCALE_FORMS[mistake](num_heads, D)
    if mistake != "scale-after-softmax":
        scores = scores * (D ** -0.5 if scale is None else scale)
    scores = opts.cap(scores)
    if keep is not None and mistake == "mask-rows-tiled":
        keep = _tiled_rows(keep.expand(keep.shape[0], 1, Lq, Lk), num_heads)

    if causal:
        causal_keep = _causal_keep(Lq, Lk, mistake, scores.device)
        keep = causal_keep if keep is None else keep & causal_keep
    window = opts.window_keep(q_at, k_at)  # (Lq, Lk) or None
    if window is not None:
        keep = window if keep is None else keep & window
    if keep is not None and mistake not in NEEDS_MASK:
        scores = scores.masked_fill(~keep, FILLS_BLOCKED.get(mistake, fill))

    axis = {"softmax-over-queries": -2, "softmax-over-heads": 1, "softmax-over-batch": 0}.get(mistake, -1)
    attn = opts.softmax(scores, axis)  # (B, H, Lq, Lk)
    if mistake == "scale-after-softmax":
        attn = attn / math.sqrt(D)
    if keep is not None and mistake in NEEDS_MASK:
        attn = attn.masked_fill(~keep, 0.0 if mistake == "mask-weights-with-zero" else fill)

    out = attn @ (k if mistake == "weights-times-keys" else v)  # (B, H, Lq, D)
    out = _merge(out, mistake)  # (B, Lq, H*D)
    if weights.o is None or mistake == "skip-output-projection":
        return out
    return _project(out, weights.o)  # (B, Lq, O)


def forms_to_try(has_mask: bool, causal: bool) -> list[str]:
    """Every form whose outputs can differ from the correct maths in this setting."""
    forms = []
    for bug in BUGS:
        for form in bug.forms:
            if form in NEEDS_MASK | set(FILLS_BLOCKED) and not (has_mask or causal):
                continue
            if form in NEEDS_USER_MASK and not has_mask:
                continue
            if form in NEEDS_CAUSAL and not causal or form in SCALE_FORMS:
                continue
            forms.append(form)
    return forms
