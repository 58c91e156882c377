"""The core judge in the verdict: name the first stage that differs for a difference the catalogue does not
know, and PASS a module whose core is right on its own tensors when every part around it is recognised.

Recognised around the core (the periphery): q, k and v each an affine map of the input (one token at a time:
projections, biases, fused or split); an output gate sigmoid(g) * attention before the output projection, g an
affine map of the input (Qwen3-Next); the output projection as the last linear layer. Anything else (a norm,
a rotary turn the role search did not fit) is not judged here, and a module with such a part never passes here.
"""

from __future__ import annotations

import math

import torch

from multihead.checker.core.stages import StageFinding, judge_stages, trace_core
from multihead.checker.core.trace import Core
from multihead.checker.bugs.sentences import say
from multihead.checker.loading.calling import LearnerError, invoke
from multihead.checker.loading.probes import inputs

FIT = 1e-7  # relative least-squares residual under which a tensor is an affine map of the input (float64)


def stage_lines(finding: StageFinding, lang: str) -> list[str]:
    """The report's lines for a finding: the stage and the row it shows, the learner's numbers and the expected."""
    if finding.stage is None:
        stages = ("、" if lang == "zh" else ", ").join(say("stage:" + stage, lang) for stage in finding.judged)
        return [say("core-right", lang, stages=stages)]

    def numbers(values) -> str:
        return "[" + ", ".join(f"{v:.4g}" for v in values) + "]"

    where = ("、" if lang == "zh" else ", ").join(say("at:" + name, lang, n=n) for name, n in finding.where)
    lines = [say("first-stage", lang, stage=say("stage:" + finding.stage, lang), where=where)]
    if finding.got:
        lines.append("  " + say("stage-yours", lang, values=numbers(finding.got)))
    if finding.want:
        lines.append("  " + say("stage-expected", lang, values=numbers(finding.want)))
    return lines


def name_the_stage(module, spec, case, report) -> Core | None:
    """For a FAIL without a bug: trace the core on ``case``, name its first stage that differs (and the bug,
    when it is a known one) in the report. Returns the core (None when none was found)."""
    core = trace_core(module, spec, case)
    finding = None if core is None else judge_stages(core, spec)
    if finding is None:
        report.notes.append(say("core-not-found", report.lang))
        return None
    report.stage = finding
    if finding.bug:
        report.bug = finding.bug
    if finding.gate is not None:
        report.notes.append(say("gate-outside", report.lang))
    return core


def affine(x: torch.Tensor, t: torch.Tensor) -> bool:
    """Is every row of ``t`` (N, M) the same affine map of the matching row of ``x`` (N, E)?"""
    if x.shape[0] != t.shape[0] or x.shape[0] <= x.shape[1] + 1:
        return False
    design = torch.cat([x, torch.ones(x.shape[0], 1, dtype=x.dtype)], dim=1)
    solution = torch.linalg.lstsq(design, t).solution
    residual = (design @ solution - t).norm() / t.norm().clamp_min(1e-30)
    return float(residual) <= FIT


def _tokens(t: torch.Tensor, batch: int, length: int) -> torch.Tensor | None:
    """A per-head tensor (B, H, L, D) (or (B*H, L, D)) as one row per token (B*L, H*D); None if it does not fit."""
    if t.shape[-2] != length or t.numel() % (batch * length):
        return None
    heads = t.reshape(batch, -1, length, t.shape[-1])
    return heads.permute(0, 2, 1, 3).reshape(batch * length, -1)


def _scaled_right(core: Core) -> bool:
    """Are the kept scores q·k / sqrt(D), the scale applied to the scores or to q (or k) before the product?"""
    finite = torch.isfinite(core.scores)
    D = core.q.shape[-1]
    factor = 1.0 / math.sqrt(D)
    if core.prescale is not None and math.isclose(core.prescale, factor, rel_tol=1e-6):
        factor = 1.0  # q * D**-0.5 @ k^T (EVA, timm): the product already holds the scale
    return torch.allclose(core.scores[finite], (core.raw * factor)[finite], rtol=1e-6, atol=1e-9)


def _future_unseen(module, spec, case, wanted: torch.Tensor) -> bool:
    """The causal property on the module itself: a new last token leaves every earlier output as it was."""
    changed = [t.clone() for t in case[:3]]
    for t in changed:
        t[:, -1] = torch.randn(t[:, -1].shape, dtype=t.dtype, generator=torch.Generator().manual_seed(3))
    try:
        with torch.no_grad():
            moved = invoke(module, spec, *changed)
    except LearnerError:
        return False
    return torch.allclose(moved[:, :-1], wanted[:, :-1], rtol=1e-6, atol=1e-9)


def core_passes(module, spec, case, core: Core, finding: StageFinding, wanted: torch.Tensor) -> bool:
    """Does the module pass on its core: every stage right, scale 1/sqrt(D), q, k, v affine in the input, a gate
    (if any) sigmoid of an affine map of the input, and the module's output the last linear layer's?"""
    if spec.mask_param or spec.layout != "batch" or finding.stage is not None or core.merged is None:
        return False
    linears = [layer.weight for layer in module.modules() if isinstance(layer, torch.nn.Linear)]
    if any(id(weight) not in core.weights_used for weight in linears):
        return False  # a projection the forward never uses (queries from the key layer?): not judged here
    a, b, c = case[:3]
    x, context, values = {"x": (a, a, a), "q_kv": (a, b, b), "qkv": (a, b, c)}[spec.inputs]  # what q, k, v read
    B, L = x.shape[:2]
    if core.sdpa is not None:
        scale = core.sdpa.kwargs.get("scale")
        if (scale is not None and not math.isclose(scale, core.q.shape[-1] ** -0.5, rel_tol=1e-6)) or \
                core.sdpa.kwargs.get("attn_mask") is not None:
            return False
    elif core.raw is None or not _scaled_right(core):
        return False
    rows = x.reshape(B * L, -1)
    for t, read in ((core.q, x), (core.k, context), (core.v, values)):  # each an affine map of what it reads
        tokens = _tokens(t, B, read.shape[1])
        if tokens is None or not affine(read.reshape(B * read.shape[1], -1), tokens):
            return False
    if spec.causal and not _future_unseen(module, spec, case, wanted):
        return False
    if finding.gate is not None:
        gate = finding.gate.reshape(B * L, -1)
        known = ~gate.isnan().any(-1)  # tokens whose every gate entry was measured
        if not affine(rows[known], torch.logit(gate[known])):
            return False
    return core.projected is not None and core.projected.shape == wanted.shape and \
        torch.allclose(core.projected, wanted, rtol=1e-6, atol=1e-9)


def judge_unknown(module, spec, dims: tuple, dtype, report, assignments=(), heads: int | None = None):
    """A FAIL the catalogue could not name: name its first stage on the learner's own tensors (8 sequences of 6
    tokens: enough tokens for the affine fits), and PASS it when its core is right and its periphery recognised.
    ``heads``: the head count the constructor or --call gives (the core must have as many). Returns the role
    assignment whose q and k are the core's (None when none is, or no bug was named here)."""
    case = inputs(dims, 8, 6, 6, dtype, 40)
    core = name_the_stage(module, spec, case, report)
    if core is None or report.stage is None:
        return None
    if report.bug:
        if report.bug == "causal-mask-reversed" and spec.options is not None:
            spec.options.window = None  # the last query sees one key because the mask is reversed, not a window
        return roles_of_core(assignments, core, case[0])
    try:
        with torch.no_grad():
            wanted = invoke(module, spec, *case[:3])
    except LearnerError:
        return None
    finding = report.stage
    count = core.q.numel() // (core.q.shape[-1] * core.q.shape[-2] * case[0].shape[0])
    if (heads is None or heads == count) and core_passes(module, spec, case, core, finding, wanted):
        report.verdict, report.kind, report.error, report.stage = "pass", "core", 0.0, None
        report.bug_values = {"heads": count, "head_dim": core.q.shape[-1]}
        report.notes[:] = [note for note in report.notes if note != say("gate-outside", report.lang)]
        if finding.gate is not None:
            report.notes.append(say("gate-judged", report.lang))
    return None


def _per_head(x: torch.Tensor, weight_bias: tuple, heads: int) -> torch.Tensor:
    """x (B, L, E) through one role's rows: (B, heads, L, D)."""
    weight, bias = weight_bias
    t = x @ weight.T + (bias if bias is not None else 0)
    return t.reshape(*x.shape[:2], heads, -1).transpose(1, 2)


def roles_of_core(assignments, core: Core, x: torch.Tensor):
    """The assignment whose q and k projections of ``x`` are the tensors the core read (up to one scale), or None
    (RoPE, a norm, or no assignment that fits)."""
    for roles in assignments:
        weights = roles.weights()
        with torch.no_grad():
            q = _per_head(x, weights.q, weights.num_heads)
            k = _per_head(x, weights.k, weights.num_kv_heads)
        if q.shape != core.q.shape or k.shape[-1] != core.k.shape[-1]:
            continue
        scale = float((core.q * q).sum() / (q * q).sum().clamp_min(1e-30))
        if torch.allclose(core.q, q * scale, rtol=1e-5, atol=1e-7):
            return roles
    return None
