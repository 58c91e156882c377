"""What the learner's mask means to a caller, once its convention is found (``behaviour/mask_convention.py``).

* A complete mask: a causal module whose own causal masking is off whenever it is given a mask (Hugging
  Face layers take a 4-D mask that already holds the causal part, and drop their own when given one).
* Kept scores shifted: an all-keep mask that moves the float32 outputs, unlike no mask at all (the mask
  is added with the wrong sign: ``scores += mask * 1e9``, ``scores + (1 - mask) * 1e4``).
* The caller's claim (``--call mask=keep|block|additive|lengths|key_padding``): a module whose convention
  contradicts it fails (``mask-inverted`` when keep and block are swapped).
"""

from __future__ import annotations

import contextlib

import torch
from torch.overrides import TorchFunctionMode

from multihead.checker.loading.calling import CallSpec, LearnerError, invoke
from multihead.checker.compare import agree
from multihead.checker.behaviour.layout import bumped
from multihead.checker.bugs.sentences import say

# claim -> the Encoding kinds (and families) that keep it; kinds: see masks.Encoding
CLAIMS = {
    "keep": ({"keep", "multihead-mask"}, None),
    "block": ({"block", "block01"}, None),
    "additive": ({"additive"}, None),
    "lengths": ({"lengths"}, None),
    "key_padding": ({"block", "block01"}, {"key"}),  # torch's key_padding_mask: (B, Lk), True = padding
}
_KEEP, _BLOCK = {"keep", "multihead-mask"}, {"block", "block01"}
SHIFT_TOLERANCE = 1e-5  # float32: an all-keep mask that blocks nothing changes no output by more


def mask_replaces_causal(module, spec: CallSpec, xq: torch.Tensor, tol: float) -> bool:
    """A causal self-attention module that drops its own causal masking when given a mask: with an all-keep
    mask, earlier outputs move when the last token changes. ``xq`` (B, L, E), L >= 3."""
    if not spec.causal or spec.inputs != "x" or spec.encoding is None or spec.encoding.family == "causal" \
            or spec.none_mask is not None:
        return False
    keep = torch.ones(xq.shape[0], xq.shape[1], xq.shape[1], dtype=torch.bool)
    try:
        with torch.no_grad():
            base = invoke(module, spec, xq, keep=keep)
            moved = invoke(module, spec, bumped([xq], (slice(None), -1))[0], keep=keep)
    except LearnerError:
        return False
    return not any(agree(base[:, i], moved[:, i], tol) for i in range(xq.shape[1] - 1))


def keep_shifts_scores(module, spec: CallSpec, inputs) -> bool:
    """A mask that adds a large number to every kept score (added with the wrong sign): an all-keep mask
    (the causal pattern for a complete mask) changes the float32 outputs, unlike no mask at all. float32
    cannot add 1e4 or more to a score without losing the score's own digits."""
    if spec.encoding is None or spec.none_mask is not None or spec.encoding.kind in (
            "additive", "causal-switch", "multihead-mask"):
        return False
    xq, xk, xv = (t.float() for t in inputs)
    keep = torch.ones(xq.shape[0], xq.shape[1], xk.shape[1], dtype=torch.bool)
    if spec.mask_complete:
        keep = keep.tril()
    with in_float32(module):
        try:
            with torch.no_grad():
                masked, plain = invoke(module, spec, xq, xk, xv, keep), invoke(module, spec, xq, xk, xv)
        except LearnerError:
            return False
    return not agree(masked, plain, SHIFT_TOLERANCE)


@contextlib.contextmanager
def in_float32(module):
    """The module in float32 for a while, then its own parameters and buffers back, exactly."""
    params = [(p, p.data) for p in module.parameters()]
    buffers = [(m, dict(m._buffers)) for m in module.modules()]
    module.float()
    try:
        yield module
    finally:
        for param, data in params:
            param.data = data
        for layer, saved in buffers:
            layer._buffers.update(saved)


def claim_kept(claim: str, encoding) -> bool:
    """Does the convention found (a masks.Encoding) keep the caller's claim?"""
    kinds, families = CLAIMS[claim]
    return encoding.kind in kinds and (families is None or encoding.family in families)


def claim_broken(claim: str | None, encoding, param: str) -> tuple[str | None, dict] | None:
    """None when there is no claim, no convention found, or the convention keeps the claim; else (bug id or
    None, values for its text): ``mask-inverted`` when keep and block are swapped."""
    if claim is None or encoding is None or encoding.family == "causal" or claim_kept(claim, encoding):
        return None
    claimed_block = claim in ("block", "key_padding")
    if (claim == "keep" and encoding.kind in _BLOCK) or (claimed_block and encoding.kind in _KEEP):
        blocked, wanted = ("1", "0") if claim == "keep" else ("0", "1")
        return "mask-inverted", {"param": param, "claim": claim, "blocked": blocked, "wanted": wanted}
    return None, {"param": param, "claim": claim}


class FillValues(TorchFunctionMode):
    """The numbers the learner's code passes to ``masked_fill`` during a call (``values``)."""

    def __init__(self):
        super().__init__()
        self.values: list[float] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.Tensor.masked_fill, torch.Tensor.masked_fill_, torch.masked_fill) and len(args) > 2 \
                and isinstance(args[2], (int, float)):
            self.values.append(float(args[2]))
        return func(*args, **kwargs)


def judge_mask(module, spec: CallSpec, inputs, report) -> None:
    """After the verdict (``inputs`` = (xq, xk, xv), batch first): kept scores shifted fail as
    ``mask-sign-flipped`` and a convention that breaks the caller's claim fails (unless another bug was
    named already); a mask that keeps the claim says so in its convention line."""
    lang = report.lang
    if not spec.mask_param:
        if spec.mask_claim:
            report.notes.append(say("claim-no-mask", lang, claim=spec.mask_claim))
        return
    open_verdict = report.passed or not report.bug
    with FillValues() as fills:
        shifted_scores = open_verdict and keep_shifts_scores(module, spec, inputs)
    if shifted_scores:
        report.verdict, report.bug, report.bug_values = "fail", "mask-sign-flipped", {"param": spec.mask_param}
        positive = [value for value in fills.values if value > 0]
        if positive:  # masked_fill(mask == 0, 1e9): the advice speaks of the fill value, not of adding
            report.bug_values.update(text="mask-fill-positive", fill=f"{positive[0]:g}")
        shifted = {"keep": "keep-shifted", "block": "block-shifted", "block01": "block-shifted"}
        report.conventions = [(shifted.get(key, key), values) for key, values in report.conventions]
        return
    broken = claim_broken(spec.mask_claim, spec.encoding, spec.mask_param)
    if broken is None:
        if spec.mask_claim and spec.encoding is not None:
            report.conventions = [(key, {**values, "claim": spec.mask_claim} if key == spec.encoding.kind else values)
                                  for key, values in report.conventions]
        return
    if open_verdict:
        bug, values = broken
        found = next((say(key, lang, **v) for key, v in report.conventions if key == spec.encoding.kind), "")
        report.verdict, report.bug, report.bug_values = "fail", bug, values
        if bug is None:
            report.reason = say("claim-differs", lang, claim=spec.mask_claim, param=spec.mask_param, found=found)
