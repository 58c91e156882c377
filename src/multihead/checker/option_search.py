"""Find the options of ``options.py`` (and partial RoPE, ``rotary.py``) in a learner's module, by behaviour.

* A sliding window (``find_window``, before the roles, like causality): change token 0 of a long
  sequence; a causal module with a window of W keys moves only the outputs of tokens 0 ... W-1.
* QK-norm (``normalised``): multiply one role's projection rows by 4; outputs that do not move mean its
  outputs are normalised. Each head's rows alone: a norm per head; only all rows together: a norm over the
  whole width (the ``qk-norm-wrong-axis`` mistake).
* Then ``search``, when the plain maths and plain RoPE did not reproduce the outputs: a coordinate search,
  each dimension tried with the others held at their best (RoPE's layout, partial size and base; QK-norm's
  weights, eps and place; sinks; a softcap), every candidate scored on the first probe case, the best
  verified on all of them. The candidates come from the module: its 1-D parameters that are not projections
  (norm weights of size D, sink logits of size H) and the values its constructor names.

``intended`` reads what the constructor says was meant (window=4, rotary_dim=8): a module that measures
otherwise has a bug (``intended_bug``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, replace

import torch

from multihead.checker.calling import CallSpec, LearnerError, invoke
from multihead.checker.compare import relative_error
from multihead.checker.conventions import bumped
from multihead.checker.diagnose import Match, closest
from multihead.checker.options import Options, QKNorm
from multihead.checker.rotary import ROPE_TOLERANCE, rotaries, rotary_dims

WINDOW_NAMES = ("window", "window_size", "sliding_window", "attention_window", "local_window", "window_len",
                "sliding_window_size", "attn_window")
ROTARY_DIM_NAMES = ("rotary_dim", "rotary_ndims", "rope_dim", "rotary_emb_dim", "partial_rotary_dim", "rot_dim")
ROTARY_FRACTION_NAMES = ("partial_rotary_factor", "rotary_pct", "rotary_fraction", "rope_fraction", "rope_pct")
CAP_NAMES = ("softcap", "soft_cap", "attn_logit_softcapping", "logit_softcap", "attn_softcap", "softcapping",
             "logit_cap", "attn_logit_softcap")
EPS_NAMES = ("eps", "variance_epsilon", "epsilon", "norm_eps", "rms_norm_eps", "qk_norm_eps", "layer_norm_eps")
COMMON_EPS = (1e-6, 1e-5, 1e-8, float(torch.finfo(torch.float32).eps), 0.0)
COMMON_CAPS = (50.0, 30.0, 20.0)
WINDOW_LENGTHS = (64, 24, 12)  # the longest first: a window is seen only in a sequence longer than it
STILL = 1e-3  # relative change below which outputs count as unmoved by a scaled projection (eps blurs it)
FACTOR = 4.0  # a power of two: scaling rows by it and back restores them exactly


def _number(value, low: float = 0.0) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > low
    return float(value) if ok else None


def intended(module, kwargs: dict) -> dict:
    """What the constructor arguments (or the module's attributes) name: "window" and "window_name" (the
    argument's name), "rotary_dim", "rotary_fraction", "softcap" (None when not named), "eps" (every eps
    found, its layers' included)."""
    def named(names):
        found = ((n, kwargs.get(n, getattr(module, n, None))) for n in names)
        return next(((n, v) for n, v in found if _number(v)), (None, None))

    eps = [getattr(layer, name, None) for layer in module.modules() for name in EPS_NAMES]
    eps += [kwargs.get(name) for name in EPS_NAMES]
    window_name, window = named(WINDOW_NAMES)
    return {"window": window, "window_name": window_name, "rotary_dim": named(ROTARY_DIM_NAMES)[1],
            "rotary_fraction": named(ROTARY_FRACTION_NAMES)[1], "softcap": named(CAP_NAMES)[1],
            "eps": [float(e) for e in eps if _number(e, -1.0) is not None]}


def find_window(module, spec: CallSpec, dims, dtype, tol: float) -> int | None:
    """W when a causal self-attention module lets each token see only the last W tokens (itself included):
    changing token 0 moves the outputs of tokens 0 ... W-1 only. None when every output moves."""
    if not spec.causal or spec.inputs != "x":
        return None
    for length in WINDOW_LENGTHS:
        x = torch.randn(2, length, dims[0], generator=torch.Generator().manual_seed(30)).to(dtype)
        try:
            with torch.no_grad():
                base, moved = invoke(module, spec, x), invoke(module, spec, bumped([x], (slice(None), 0))[0])
        except LearnerError:
            continue
        changed = [not torch.allclose(base[:, i], moved[:, i], atol=tol, rtol=tol) for i in range(length)]
        window = changed.index(False) if False in changed else None
        if window is not None and not any(changed[window:]):
            return window
        return None
    return None


def one_dimensional(module, projections) -> list[tuple[str, torch.Tensor]]:
    """(name, parameter) for the module's 1-D parameters outside its projections (norm weights, sinks)."""
    inside = {id(p) for proj in projections.values() for p in proj.layer.parameters()}
    return [(name, p) for name, p in module.named_parameters() if p.dim() == 1 and p.numel() > 1
            and id(p) not in inside and not isinstance(p, torch.nn.UninitializedParameter)]


def randomise_extras(module, projections) -> None:
    """Fresh values for the 1-D parameters outside the projections: norm weights near 1, the rest near 0 (a
    weight of ones, or sinks of zeros, would hide where and whether the module applies them)."""
    gen = torch.Generator().manual_seed(8)
    with torch.no_grad():
        for name, param in one_dimensional(module, projections):
            noise = torch.randn(param.shape, generator=gen, dtype=torch.float64).to(param.dtype)
            param.copy_(1.0 + 0.3 * noise if name.endswith("weight") else 0.5 * noise)


@contextlib.contextmanager
def _rows_scaled(roles, role: str, rows: slice | None):
    """The projection rows of ``role`` (all, or the stacked rows ``rows``) multiplied by FACTOR, then back."""
    touched, offset = [], 0
    for proj, local in roles.pieces[role]:
        index = torch.arange(proj.out_features)  # the piece's rows of the projection
        index = index if local is None else local if torch.is_tensor(local) else index[local]
        count = len(index)
        wanted = range(count) if rows is None else range(max(rows.start - offset, 0), min(rows.stop - offset, count))
        offset += count
        if len(wanted) and proj.heads == 1:
            touched.append((proj, index[list(wanted)]))
    with torch.no_grad():
        for proj, index in touched:
            for tensor in proj.weight_bias():
                if tensor is not None:
                    tensor[index] *= FACTOR
    try:
        yield bool(touched)
    finally:
        with torch.no_grad():
            for proj, index in touched:
                for tensor in proj.weight_bias():
                    if tensor is not None:
                        tensor[index] /= FACTOR


def _still(module, spec, roles, role, rows, case, base) -> bool:
    with _rows_scaled(roles, role, rows) as done:
        if not done:
            return False
        try:
            with torch.no_grad():
                return relative_error(invoke(module, spec, *case[:3]), base) <= STILL
        except LearnerError:
            return False


def normalised(module, spec: CallSpec, roles, case) -> str | None:
    """"head" when q's and k's projections are normalised per head (scaling one head's rows moves nothing),
    "width" when only over their whole width, None when not normalised."""
    try:
        with torch.no_grad():
            base = invoke(module, spec, *case[:3])
    except LearnerError:
        return None
    if not all(_still(module, spec, roles, role, None, case, base) for role in ("q", "k")):
        return None
    D = roles.weights().head_dim
    return "head" if all(_still(module, spec, roles, role, slice(0, D), case, base) for role in ("q", "k")) \
        else "width"


@dataclass
class Found:
    """The best the search found: the match, the assignments turned by its RoPE, the options, and whether the
    match reproduces every case within the tolerance."""

    match: Match
    assignments: list
    options: Options
    verified: bool


def search(module, spec: CallSpec, assignments, cases, wanted, tol: float, bases, extras) -> Found | None:
    """The options (and RoPE) under which some assignment reproduces the learner's outputs (see the module
    docstring); None when the module shows no sign of any. ``extras``: ``one_dimensional`` of the module."""
    base_options = spec.options or Options()
    norm_kind = normalised(module, spec, assignments[0], cases[0]) if assignments else None
    weights = assignments[0].weights() if assignments else None
    if weights is None:
        return None
    H, D = weights.num_heads, weights.head_dim
    sinks = [None] + [named for named in extras if named[1].numel() == H]
    caps = [None] + list(dict.fromkeys(c for c in [base_options.intended.get("softcap"), *COMMON_CAPS] if c))
    ropes = [None]
    if spec.inputs == "x":
        fraction = base_options.intended.get("rotary_fraction")
        wanted_dim = base_options.intended.get("rotary_dim") or (int(D * fraction) if fraction else None)
        ropes += rotaries(bases, True) + rotaries(bases, True, reverse=True)
        for R in rotary_dims(D, wanted_dim):
            ropes += rotaries(bases, True, R) + rotaries(bases, True, R, trailing=True)
    norms = [None]
    if norm_kind:
        width = {"q": H * D, "k": weights.num_kv_heads * D} if norm_kind == "width" else {"q": D, "k": D}
        q_side = [None] + [n for n in extras if n[1].numel() == width["q"]]
        k_side = [None] + [n for n in extras if n[1].numel() == width["k"]]
        pairs = [(a, b) for a in q_side for b in k_side if a is None or b is None or a[0] != b[0]]
        pairs = sorted(pairs, key=lambda pair: pair.count(None))  # weighted first: a weight of ones ties
        eps = list(dict.fromkeys(base_options.intended.get("eps", []) + list(COMMON_EPS)))
        norms = [QKNorm(q, k, e, after, norm_kind == "width") for q, k in pairs for e in eps for after in (False, True)]
    if len(ropes) == len(sinks) == len(caps) == len(norms) == 1:
        return None
    state = {"rope": ropes[0], "norm": norms[0 if len(norms) == 1 else 1], "sinks": sinks[0], "cap": caps[0]}
    choices = {"rope": ropes, "norm": norms, "sinks": sinks, "cap": caps}

    def build(chosen):
        options = replace(base_options, qk_norm=chosen["norm"], sinks=chosen["sinks"], softcap=chosen["cap"])
        trial = CallSpec(**{**spec.__dict__, "options": options})
        turned = [replace(roles, rope=chosen["rope"]) for roles in assignments]
        return trial, turned, options

    def score(chosen, every: bool = False) -> Match:
        trial, turned, _ = build(chosen)
        use = slice(None) if every else slice(0, 1)
        return closest(module, trial, turned, cases[use], wanted[use], [None])

    best = score(state).error
    for _ in range(3):  # sweeps until nothing improves
        improved = False
        for dim, options in choices.items():
            for option in options:
                if option is state[dim]:
                    continue
                error = score({**state, dim: option}).error
                if error < best * 0.999:
                    state, best, improved = {**state, dim: option}, error, True
        if not improved or best <= tol:
            break
    match = score(state, every=True)
    limit = max(tol, ROPE_TOLERANCE) if state["rope"] is not None else tol
    trial, turned, options = build(state)
    verified = match.error <= limit
    if not verified and not norm_kind:
        return None  # no behaviour says the module uses any option: nothing to keep
    return Found(match, turned, options, verified)


def intended_bug(options: Options, rope, head_dim: int) -> tuple[str, dict] | None:
    """(bug id, its text's values) for a mistake inside the options found: QK-norm over the whole width, a window
    one key off what the constructor says, partial RoPE turning other features than the first rotary_dim;
    None otherwise."""
    meant = options.intended
    if options.qk_norm is not None and options.qk_norm.whole_width:
        return "qk-norm-wrong-axis", {}
    window, name = meant.get("window"), meant.get("window_name", "window")
    if window and options.window and abs(options.window - int(window)) == 1:
        return "window-off-by-one", {"got": options.window, "want": int(window), "name": name}
    fraction = meant.get("rotary_fraction")
    wanted = meant.get("rotary_dim") or (int(head_dim * fraction) if fraction else None)
    turned = rope.turned(head_dim) if rope is not None else None
    if rope is not None and (rope.trailing or (wanted and wanted < head_dim and turned != wanted)):
        start = head_dim - turned if rope.trailing else 0
        return "rope-partial-wrong-features", {"want": wanted or turned, "dim": head_dim,
                                               "turned": f"{start}-{start + turned - 1}"}
    return None


def describe(options: Options, rope, head_dim: int) -> list[tuple[str, dict]]:
    """The report's convention lines for the options found (text keys in text.OPTION_TEXT)."""
    lines = []
    if rope is not None and rope.reverse:
        lines.append(("rope-reversed", {}))
    if options.window:
        lines.append(("window", {"window": options.window}))
    if rope is not None and rope.turned(head_dim) < head_dim and not rope.trailing:
        lines.append(("rope-partial", {"rotary_dim": rope.turned(head_dim), "head_dim": head_dim}))
    norm = options.qk_norm
    if norm is not None and norm.whole_width:
        lines.append(("qk-norm:width", {"eps": f"{norm.eps:g}"}))
    elif norm is not None:
        weighted = ":weighted" if norm.q_weight or norm.k_weight else ""  # without weights, the place is moot
        place = "plain" if rope is None or not weighted else "after" if norm.after_rope else "before"
        q, k = (named[0] if named else "-" for named in (norm.q_weight, norm.k_weight))
        lines.append((f"qk-norm:{place}{weighted}", {"q": q, "k": k, "eps": f"{norm.eps:g}"}))
    if options.sinks is not None:
        lines.append(("sinks", {"name": options.sinks[0]}))
    if options.softcap is not None:
        lines.append(("softcap", {"cap": f"{options.softcap:g}"}))
    return lines

