"""Judge the attention core on the learner's own tensors, stage by stage, and name the first stage that differs.

Stages, in the order the maths runs them (``STAGES``): scores (q·k times the scale), masked scores (which keys
each query may see), weights (a softmax over the keys: every row sums to one), per-head output (weights times
values), merged heads (the heads put back side by side, what the output projection reads), projected output.
Each stage is compared with what correct attention computes from the tensors the learner's previous stage
produced, so the first stage that differs is where the mistake is, whatever else the module does.

A ``StageFinding`` names the stage, the learner's numbers and the expected ones at that stage (one row), the
explain topic that teaches it, and a catalogue bug id when the difference is a known one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from multihead.checker.core.trace import Core, CoreTrace, find_core
from multihead.checker.loading.calling import CallSpec, LearnerError, invoke

STAGES = ("scores", "masked-scores", "weights", "per-head-output", "merged-heads", "projected-output")
TOPIC = {"scores": "scale-sqrt-dk", "masked-scores": "masked-fill", "weights": "softmax-axis",
         "per-head-output": "keys-vs-values", "merged-heads": "combine-heads", "projected-output": "linear-d-model"}
BLOCKED = -1e4  # a score at or below this counts as masked out
SHOWN = 4  # how many numbers of one row the report shows


@dataclass
class StageFinding:
    """The first stage that differs (``stage`` in STAGES), one row of the learner's numbers and the expected
    ones there, a catalogue bug id when the difference is a known one, and what the stage judge checked."""

    stage: str | None
    got: list = field(default_factory=list)
    want: list = field(default_factory=list)
    where: tuple = ()  # which row the numbers come from: (("batch", 0), ("head", 0), ("query", 2), ("column", 4))
    bug: str | None = None
    judged: list = field(default_factory=list)  # the stages found right, in order
    gate: torch.Tensor | None = None  # the merged heads were multiplied by this, each entry in (0, 1)

    @property
    def topic(self) -> str | None:
        return TOPIC.get(self.stage) if self.stage else None


def trace_core(module, spec: CallSpec, case) -> Core | None:
    """The core of one learner call on ``case`` (xq, xk, xv, ...), or None when none is found or it raises."""
    trace = CoreTrace()
    try:
        with torch.no_grad(), trace:
            invoke(module, spec, *case[:3])
    except LearnerError:
        return None
    try:
        core = find_core(trace.ops)
        if core is not None:
            core.weights_used = trace.weights_used
        return core
    except (RuntimeError, ValueError, IndexError, TypeError):  # ops the core finder cannot read: no core
        return None


def judge_stages(core: Core, spec: CallSpec) -> StageFinding | None:
    """The first stage of ``core`` that differs from correct attention on the same tensors (None: tensors of
    shapes the judge cannot read, nothing judged)."""
    try:
        return _judge_stages(core, spec)
    except (RuntimeError, ValueError, IndexError, TypeError):  # tensors of unexpected shapes: nothing judged
        return None


def _judge_stages(core: Core, spec: CallSpec) -> StageFinding:
    judged = []
    for stage, judge in (("scores", _kv_groups), ("scores", _scores), ("masked-scores", _masked),
                         ("weights", _weights), ("per-head-output", _values), ("merged-heads", _merged)):
        finding = judge(core, spec)
        if finding is not None:
            finding.judged = judged
            return finding
        judged += [stage] if stage not in judged else []
    return StageFinding(None, judged=judged)


def _kept(scores: torch.Tensor) -> torch.Tensor:
    return torch.isfinite(scores) & (scores > BLOCKED)


def _at(stage: str, got: torch.Tensor, want: torch.Tensor | None, index: tuple, bug: str | None = None,
        names: tuple | None = None) -> StageFinding:
    """A finding at row ``index`` of ``got`` (and ``want``: None when the expected numbers are unknown), its
    numbers shown from the first column that differs; ``where`` as (name, number) pairs for the report."""
    row = got[index]
    start = 0
    if want is not None:
        differs = (~torch.isclose(row, want[index], rtol=1e-4, atol=1e-6, equal_nan=True)).nonzero()
        start = int(differs[0]) if len(differs) else 0
        start = max(0, min(start, row.shape[-1] - SHOWN))
    names = names or {2: ("batch", "query"), 3: ("batch", "head", "query")}.get(len(index), ("",) * len(index))
    where = tuple(zip(names, index)) + ((("column", start),) if start else ())
    shown = slice(start, start + SHOWN)
    return StageFinding(stage, [float(x) for x in row[shown]],
                        [] if want is None else [float(x) for x in want[index][shown]], where, bug)


def _first_row(a: torch.Tensor, b: torch.Tensor) -> tuple:
    """The index of the first row (all but the last dimension) where ``a`` and ``b`` differ."""
    diff = ~torch.isclose(a, b, rtol=1e-4, atol=1e-6, equal_nan=True)
    rows = diff.reshape(-1, a.shape[-1]).any(-1).nonzero()
    flat = int(rows[0]) if len(rows) else 0
    return tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), a.shape[:-1]))


def _scores(core: Core, spec: CallSpec) -> StageFinding | None:
    """scores = q·k times one scale on every kept entry; 1/sqrt(D) unless q came pre-scaled (not told apart)."""
    if core.raw is None or core.scores is None or core.raw.shape != core.scores.shape:
        return None
    kept = _kept(core.scores)
    if not kept.any():
        return None
    scale = _scale(core.raw, core.scores, kept)
    D = core.q.shape[-1]
    meant = D ** -0.5 / (core.prescale or 1.0)  # q (and k) may come scaled already
    one_scale = torch.allclose(core.scores[kept], core.raw[kept] * scale, rtol=1e-4, atol=1e-6)
    if one_scale and math.isclose(scale, meant, rel_tol=1e-4):
        return None
    want = torch.where(kept, core.raw * meant, core.scores)
    index = _first_row(core.scores, want)
    bug = _scale_bug(scale * (core.prescale or 1.0), D, core.q.numel() // (core.q.shape[-2] * D * core.q.shape[0]))
    return _at("scores", core.scores, want, index, bug if one_scale else None)


def _scale_bug(factor: float, D: int, H: int) -> str:
    """The catalogue id of a measured scale ``factor`` (D head size, H heads per batch row of q)."""
    known = {"missing-scale": 1.0, "scale-by-head-dim": 1.0 / D, "scale-by-embed-dim": (H * D) ** -0.5,
             "scale-halved": 0.5 * D ** -0.5}
    return next((bug for bug, value in known.items() if math.isclose(factor, value, rel_tol=1e-4)), "wrong-scale")


def _scale(raw: torch.Tensor, scores: torch.Tensor, kept: torch.Tensor) -> float:
    """The one factor that best takes the q·k product to the scores on the kept entries (least squares)."""
    r, s = raw[kept], scores[kept]
    return float((s * r).sum() / (r * r).sum().clamp_min(1e-30)) if len(r) else 1.0


def _expected_kept(Lq: int, Lk: int, spec: CallSpec) -> torch.Tensor:
    """The keys each query may see in an unmasked call: all, or causal (aligned at the end), within a window."""
    i = torch.arange(Lq)[:, None] + (Lk - Lq)
    j = torch.arange(Lk)[None, :]
    keep = torch.ones(Lq, Lk, dtype=torch.bool)
    if spec.causal:
        keep &= j <= i
    window = getattr(spec.options, "window", None) if spec.options is not None else None
    if window:
        keep &= (i - j) < window
    return keep


def _band(seen: torch.Tensor) -> int | None:
    """The window w when ``seen`` (Lq, Lk), Lq == Lk, keeps exactly the keys i - w < j <= i; else None."""
    L = seen.shape[-1]
    if seen.shape[0] != L:
        return None
    i, j = torch.arange(L)[:, None], torch.arange(L)[None, :]
    return next((w for w in range(1, L) if torch.equal(seen, (j <= i) & (i - j < w))), None)


def _masked(core: Core, spec: CallSpec) -> StageFinding | None:
    """Which keys each query sees, against the module's causality (and window) on an unmasked call."""
    if core.scores is None:
        return None
    kept = _kept(core.scores)
    Lq, Lk = kept.shape[-2:]
    pattern = kept.reshape(-1, Lq, Lk)
    seen = pattern[0]
    if not (pattern == seen).all():
        return None  # differs by batch or head: not the causal pattern's business
    want = _expected_kept(Lq, Lk, spec)
    if torch.equal(seen, want) or _band(seen) is not None and spec.causal:
        return None  # the module's own pattern (a causal sliding window is one, found or not)
    bug = None
    if Lq == Lk and Lq > 1:
        i, j = torch.arange(Lq)[:, None], torch.arange(Lk)[None, :]
        if torch.equal(seen, j >= i):
            bug = "causal-mask-reversed"
    row = int((seen != want).any(-1).nonzero()[0])
    index = (0,) * (kept.dim() - 2) + (row,)
    minus_inf = torch.tensor(float("-inf"), dtype=core.scores.dtype)
    got = torch.where(kept, core.scores, minus_inf)
    unmasked = core.scores
    if core.raw is not None and core.raw.shape == core.scores.shape:  # the scaled product, before any mask
        unmasked = core.raw * _scale(core.raw, core.scores, kept)
    expected = torch.where(want.expand_as(kept), unmasked, minus_inf)
    return _at("masked-scores", got, expected.expand_as(got), index, bug)


def _weights(core: Core, spec: CallSpec) -> StageFinding | None:
    """A softmax over the keys (the last axis): every row sums to one."""
    if core.weights is None:
        return None
    want = torch.softmax(core.scores, dim=-1)
    if core.dim == core.scores.dim() - 1 and torch.allclose(core.weights, want, rtol=1e-5, atol=1e-7,
                                                             equal_nan=True):
        return None
    if core.weights.shape != want.shape:
        return None
    index = _first_row(core.weights, want)
    bug = "softmax-wrong-axis" if core.dim != core.scores.dim() - 1 else None
    return _at("weights", core.weights, want, index, bug)


def _kv_groups(core: Core, spec: CallSpec) -> StageFinding | None:
    """Query heads that share key heads share them in groups of neighbours (repeat_interleave), not tiled."""
    if core.k.dim() != 4 or core.k.shape[1] < 2:
        return None
    k = core.k
    H = k.shape[1]
    same = [[bool(torch.equal(k[:, a], k[:, b])) for b in range(H)] for a in range(H)]
    distinct = len({min(b for b in range(H) if same[a][b]) for a in range(H)})
    if distinct in (1, H) or H % distinct:
        return None
    group = H // distinct
    tiled = all(same[a][b] == (a % distinct == b % distinct) for a in range(H) for b in range(H))
    grouped = all(same[a][b] == (a // group == b // group) for a in range(H) for b in range(H))
    if grouped or not tiled:
        return None
    return _at("scores", k[:, 1], k[:, 0], (0, 0), "kv-heads-tiled", ("batch", "key"))


def _values(core: Core, spec: CallSpec) -> StageFinding | None:
    """The weights multiply the values, not the keys."""
    if core.v.shape != core.k.shape or not torch.allclose(core.v, core.k):
        return None
    index = (0,) * (core.out.dim() - 1)
    return _at("per-head-output", core.out, None, index, "keys-used-as-values")


def merges(out: torch.Tensor, merged: torch.Tensor, layout: str) -> tuple[torch.Tensor | None, torch.Tensor]:
    """(the correct merge of the per-head output ``out`` (B, H, Lq, Dv) or (B*H, Lq, Dv) in the module's
    layout, shaped like ``merged``; None when the shapes do not fit), and the bare reshape of ``out``."""
    bare = out.reshape(merged.shape)
    B = merged.shape[0] if layout == "batch" else merged.shape[1]
    Lq = out.shape[-2]
    if out.numel() != merged.numel() or out.shape[-2] not in merged.shape[:2]:
        return None, bare
    heads = out.reshape(B, -1, Lq, out.shape[-1])  # (B, H, Lq, Dv)
    order = (0, 2, 1, 3) if layout == "batch" else (2, 0, 1, 3)
    return heads.permute(order).reshape(merged.shape), bare


def _merged(core: Core, spec: CallSpec) -> StageFinding | None:
    """The heads put back side by side: what the output projection reads, against the correct merge."""
    if core.merged is None or core.out.dim() < 3:
        return None
    want, bare = merges(core.out, core.merged, spec.layout or "batch")
    if want is None or torch.allclose(core.merged, want, rtol=1e-5, atol=1e-6):
        return None
    bug = "merge-without-transpose" if torch.allclose(core.merged, bare, rtol=1e-5, atol=1e-6) else None
    large = want.abs() > 1e-3
    ratio = core.merged[large] / want[large]
    if bug is None and large.any() and bool(((ratio > 0) & (ratio < 1)).all()):  # an output gate, in (0, 1)
        gate = torch.full_like(want, float("nan"))
        gate[large] = ratio
        return StageFinding(None, gate=gate)
    index = _first_row(core.merged, want)
    return _at("merged-heads", core.merged, want, index, bug)
