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
import math
from dataclasses import dataclass, fields, replace

import torch

from multihead.checker.loading.calling import CallSpec, LearnerError, invoke
from multihead.checker.bugs.catalogue import SCALE_FORMS, forms_to_try
from multihead.checker.compare import relative_error
from multihead.checker.behaviour.layout import bumped
from multihead.checker.bugs.diagnose import Match, closest
from multihead.checker.loading.constructor_args import WINDOW_NAMES
from multihead.checker.behaviour.options import OFFSET, Options, QKNorm
from multihead.checker.behaviour.rotary import ROPE_TOLERANCE, Rotary, rotary_dims
from multihead.convert.model_attributes import spellings

ROTARY_DIM_NAMES = ("rotary_dim", "rotary_ndims", "rope_dim", "rotary_emb_dim", "partial_rotary_dim", "rot_dim")
ROTARY_FRACTION_NAMES = ("partial_rotary_factor", "rotary_pct", "rotary_fraction", "rope_fraction", "rope_pct")
CAP_NAMES = ("softcap", "soft_cap", "attn_logit_softcapping", "logit_softcap", "attn_softcap", "softcapping",
             "logit_cap", "attn_logit_softcap")
EPS_NAMES = spellings("eps") + ("norm_eps", "rms_norm_eps", "qk_norm_eps", "layer_norm_eps")  # a norm's, a constructor's
COMMON_EPS = (1e-6, 1e-5, 1e-8, float(torch.finfo(torch.float32).eps), 0.0)
WINDOW_LENGTHS = (64, 24, 12)  # the longest first: a window is seen only in a sequence longer than it
STILL = 1e-3  # relative change below which outputs count as unmoved by a scaled projection (eps blurs it)
FACTOR = 4.0  # a power of two: scaling rows by it and back restores them exactly


def _number(value, low: float = 0.0) -> float | None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and value > low
    return float(value) if ok else None


def _named(names, *sources) -> tuple[str | None, float | None]:
    """(name, value) of the first positive number among ``names`` in the first source that has one."""
    for source in sources:
        found = next(((n, source[n]) for n in names if _number(source.get(n))), None)
        if found:
            return found
    return None, None


def intended(module, kwargs: dict) -> dict:
    """What the constructor arguments (``kwargs``, defaults included) name, else the module's attributes:
    "window" and "window_name" (the argument's name), "rotary_dim" or "rotary_fraction", "softcap" (None when
    not named), "eps" (every eps found, its layers' included). The constructor's word comes first: an attribute
    computed from it (``self.rotary_ndims = ...``) may be where the mistake is."""
    attributes = vars(module)
    window_name, window = _named(WINDOW_NAMES, kwargs, attributes)
    rotary = {"rotary_dim": _named(ROTARY_DIM_NAMES, kwargs)[1], "rotary_fraction": _named(ROTARY_FRACTION_NAMES, kwargs)[1]}
    if not any(rotary.values()):
        rotary = {"rotary_dim": _named(ROTARY_DIM_NAMES, attributes)[1],
                  "rotary_fraction": _named(ROTARY_FRACTION_NAMES, attributes)[1]}
    eps = [getattr(layer, name, None) for layer in module.modules() for name in EPS_NAMES]
    eps += [kwargs.get(name) for name in EPS_NAMES]
    return {"window": window, "window_name": window_name, **rotary, "softcap": _named(CAP_NAMES, kwargs, attributes)[1],
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


def outside_projections(module, projections) -> list[tuple[str, torch.Tensor]]:
    """(name, parameter) for the module's materialised parameters that belong to none of its projections."""
    inside = {id(p) for proj in projections.values() for p in proj.layer.parameters()}
    return [(name, p) for name, p in module.named_parameters() if not isinstance(p, torch.nn.UninitializedParameter)
            and id(p) not in inside]


def one_dimensional(module, projections) -> list[tuple[str, torch.Tensor]]:
    """(name, parameter) for the module's 1-D parameters outside its projections (norm weights, sinks)."""
    return [(name, p) for name, p in outside_projections(module, projections) if p.dim() == 1 and p.numel() > 1]


def randomise_extras(module, projections) -> None:
    """Fresh values for the parameters outside the projections. 1-D ones: norm weights near 1, the rest near 0
    (a weight of ones, or sinks of zeros, would hide where and whether the module applies them). Raw matrices
    (``W_Q`` (H, E, D), ``qkvo_w`` (4, H*D, E), ``x @ W``): std 1/sqrt of their larger last size, so that a
    std-0.02 or ``torch.empty`` start does not leave the scores near zero, where most mistakes barely show."""
    gen = torch.Generator().manual_seed(8)
    with torch.no_grad():
        for name, param in one_dimensional(module, projections):
            noise = torch.randn(param.shape, generator=gen, dtype=torch.float64).to(param.dtype)
            param.copy_(1.0 + 0.3 * noise if name.endswith("weight") else 0.5 * noise)
        for param in [p for _, p in outside_projections(module, projections) if p.dim() >= 2]:
            noise = torch.randn(param.shape, generator=gen, dtype=torch.float64).to(param.dtype)
            param.copy_(noise * max(param.shape[-2:]) ** -0.5)


@contextlib.contextmanager
def _rows_scaled(roles, role: str, rows: slice | None):
    """The projection rows of ``role`` (all, or the stacked rows ``rows``) multiplied by FACTOR, then back.
    Yields False (and changes nothing) when some piece's rows cannot be scaled in place: a projection whose
    (weight, bias) is a copy of the learner's tensors (reshaped, block-diagonal) rather than a view."""
    touched, offset = [], 0
    for proj, local in roles.pieces[role]:
        index = torch.arange(proj.out_features)  # the piece's rows of the projection
        index = index if local is None else local if torch.is_tensor(local) else index[local]
        count = len(index)
        wanted = range(count) if rows is None else range(max(rows.start - offset, 0), min(rows.stop - offset, count))
        offset += count
        if len(wanted):
            touched.append((proj, index[list(wanted)]))
    done = bool(touched) and all(_scale_rows(proj, index, FACTOR) for proj, index in touched)
    try:
        yield done
    finally:
        for proj, index in touched:
            _scale_rows(proj, index, 1.0 / FACTOR)


def _scale_rows(proj, index: torch.Tensor, factor: float) -> bool:
    """Scale rows ``index`` of the projection's weight and bias in place; False when the projection gives a
    copy (the scaling did not reach the learner's parameters; it is then undone by itself). A projection traced
    from the call (a raw parameter, slices of one) is scaled through the elements it reads."""
    if proj.kind == "traced" and proj.heads == 1:
        traced = proj.traced
        done = traced.weight.scale_rows_(index, factor)
        return done and (traced.bias is None or traced.bias.scale_rows_(index, factor))
    with torch.no_grad():
        weight = proj.weight_bias()[0]
        before = weight[index[:1]].clone()
        for tensor in proj.weight_bias():
            if tensor is not None:
                tensor[index] *= factor
        return not torch.equal(proj.weight_bias()[0][index[:1]], before)


def _still(module, spec, roles, role, rows, case, base) -> bool:
    with _rows_scaled(roles, role, rows) as done:
        if not done:
            return False
        try:
            with torch.no_grad():
                return relative_error(invoke(module, spec, *case[:3]), base) <= STILL
        except LearnerError:
            return False


def _pieces_key(roles, role: str) -> tuple:
    return tuple((id(proj), repr(rows)) for proj, rows in roles.pieces[role])


def normalised(module, spec: CallSpec, assignments, case) -> tuple[str | None, list]:
    """("head", the assignments whose q and k are normalised per head: scaling one head's rows moves nothing),
    ("width", those normalised only over their whole width), or (None, every assignment)."""
    try:
        with torch.no_grad():
            base = invoke(module, spec, *case[:3])
    except LearnerError:
        return None, assignments
    still: dict[tuple, bool] = {}

    def normed(roles, role, rows=None) -> bool:
        key = (_pieces_key(roles, role), repr(rows))
        if key not in still:
            still[key] = _still(module, spec, roles, role, rows, case, base)
        return still[key]

    both = [roles for roles in assignments if normed(roles, "q") and normed(roles, "k")]
    if not both:
        return None, assignments
    per_head = [roles for roles in both if all(normed(roles, role, slice(0, roles.weights().head_dim))
                                               for role in ("q", "k"))]
    return ("head", per_head) if per_head else ("width", both)


def turned_by_position(module, spec: CallSpec, case) -> bool:
    """Do positions matter to the module? Without them, the output of token i >= 2 depends on the tokens up to
    it as a set (causal or not), so swapping tokens 0 and 1 leaves it alone; RoPE moves it. Self-attention."""
    x = case[0]
    if spec.inputs != "x" or x.shape[1] < 3:
        return False
    swapped = x.clone()
    swapped[:, [0, 1]] = x[:, [1, 0]]
    last = 3 if spec.options is None or spec.options.window is None else min(3, spec.options.window)
    try:
        with torch.no_grad():
            base, moved = invoke(module, spec, x), invoke(module, spec, swapped)
    except LearnerError:
        return False
    return relative_error(moved[:, 2:last], base[:, 2:last]) > STILL if last > 2 else False


@dataclass
class Found:
    """The best the search found: the match, the assignments turned by its RoPE, the options, and whether the
    match reproduces every case within the tolerance."""

    match: Match
    assignments: list
    options: Options
    verified: bool


def _choices(module, spec: CallSpec, assignments, case, bases, extras) -> tuple[dict, list, str | None]:
    """(every dimension's options, most likely first; the assignments to try; "head", "width" or None: the
    QK-norm the module's behaviour shows). A dimension with one option is not searched."""
    meant = spec.options.intended if spec.options else {}
    norm_kind, assignments = normalised(module, spec, assignments, case)
    weights = assignments[0].weights()
    H, D = weights.num_heads, weights.head_dim
    choices = {"rope": [False], "cap": [None] + ([meant["softcap"]] if meant.get("softcap") else [])}
    if turned_by_position(module, spec, case):
        fraction = meant.get("rotary_fraction")
        wanted_dim = meant.get("rotary_dim") or (int(D * fraction) if fraction else None) or \
            getattr(assignments[0], "rotary_dim", None)  # else the size the role finder saw the heads cut at
        partial = rotary_dims(D, wanted_dim)
        sizes = ([wanted_dim] if wanted_dim in partial else []) + [None] + [r for r in partial if r != wanted_dim]
        turns = [(interleaved, size, trailing, reverse) for size in sizes for trailing in (False, True)
                 for interleaved in (False, True) for reverse in (False, True) if size or not trailing]
        choices.update(rope=turns + [False], base=list(bases), float32=[True, False])  # False: no RoPE
    if norm_kind:
        width = {"q": H * D, "k": weights.num_kv_heads * D} if norm_kind == "width" else {"q": D, "k": D}
        offsets = [(OFFSET + name, t) for name, t in extras if name.endswith("weight")]  # Gemma: x * (1 + w)
        q_side = [None] + [n for n in extras + offsets if n[1].numel() == width["q"]]
        k_side = [None] + [n for n in extras + offsets if n[1].numel() == width["k"]]
        pairs = [(a, b) for a in q_side for b in k_side if a is None or b is None or a[0] != b[0]]
        pairs = sorted(pairs, key=lambda pair: pair.count(None))  # weighted first: a weight of ones ties
        choices.update(norm=[(pair, after) for pair in pairs for after in (False, True)],  # (weights, after RoPE)
                       eps=list(dict.fromkeys(meant.get("eps", []) + list(COMMON_EPS))))
    sinks = [named for named in extras if named[1].numel() == H]
    choices["sinks"] = [None] + sorted(sinks, key=lambda named: "sink" not in named[0])
    return choices, assignments, norm_kind


def _options_of(state: dict, base: Options, whole_width: bool) -> Options | None:
    """The Options of a search state (None: a state that uses one parameter twice)."""
    norm = None
    if "norm" in state:
        pair, after = state["norm"]
        norm = QKNorm(*pair, state["eps"], after and bool(state["rope"]), whole_width)
        if state["sinks"] is not None and any(w is not None and w[0] == state["sinks"][0] for w in pair):
            return None
    return replace(base, qk_norm=norm, sinks=state["sinks"], softcap=state["cap"])


def _rotary_of(state: dict) -> Rotary | None:
    """The Rotary of a search state: its "rope" is (interleaved, rotary_dim, trailing, reverse) or False."""
    if not state["rope"]:
        return None
    interleaved, size, trailing, reverse = state["rope"]
    return Rotary(state["base"], interleaved, interleaved, state["float32"], size, trailing, reverse)


def _turned(roles, rotary: Rotary | None):
    """``roles`` turned by ``rotary``, whose size the search chose: a rotary size the roles carry (the role
    finder's reading of heads cut in two) was one of its candidates, not a constraint."""
    carried = {"rotary_dim": None} if "rotary_dim" in {f.name for f in fields(roles)} else {}
    return replace(roles, rope=rotary, **carried)


def search(module, spec: CallSpec, assignments, cases, wanted, tol: float, bases, extras) -> Found | None:
    """The options (and RoPE) under which some assignment reproduces the learner's outputs (see the module
    docstring); None when the module shows no sign of any. When none reproduces them, the search runs again
    with a catalogue mistake as one more dimension, tried first, from the most likely options and from the
    best found: options found that way are kept, for the bug to be named under them. ``extras``:
    ``one_dimensional`` of the module."""
    if not assignments:
        return None
    choices, assignments, norm_kind = _choices(module, spec, assignments, cases[0], bases, extras)
    if all(len(options) == 1 for options in choices.values()):
        return None
    base_options = spec.options or Options()
    prior = {dim: options[0] for dim, options in choices.items()}
    prior["form"] = None

    def build(chosen):
        options = _options_of(chosen, base_options, norm_kind == "width")
        trial = CallSpec(**{**spec.__dict__, "options": options})
        return trial, [_turned(roles, _rotary_of(chosen)) for roles in assignments], options

    def score(chosen, every: bool = False) -> float:
        trial, turned, options = build(chosen)
        if options is None:
            return math.inf
        use = slice(None) if every else slice(0, 1)
        return closest(module, trial, turned, cases[use], wanted[use], [chosen["form"]]).error

    state, best = _descend(score, prior, choices, tol)
    if best > tol:  # a mistake too? the catalogue's forms (and scale mistakes) as one more dimension, first
        forms = [None] + forms_to_try(spec.encoding is not None, spec.causal) + list(SCALE_FORMS)
        state, best = min((_descend(score, start, {"form": forms, **choices}, tol) for start in (prior, state)),
                          key=lambda found: found[1])
    rotary = _rotary_of(state)
    limit = max(tol, ROPE_TOLERANCE) if rotary is not None else tol
    trial, turned, options = build(state)
    if score(state, every=True) > limit and not norm_kind:
        return None  # nothing fits, and no behaviour says the module uses an option: keep none
    match = closest(module, trial, turned, cases, wanted, [None])
    return Found(match, turned, options, state["form"] is None and match.error <= limit)


def _descend(score, state: dict, choices: dict, tol: float, sweeps: int = 3) -> tuple[dict, float]:
    """Coordinate descent: each dimension's options tried with the others held at their best, until a sweep
    improves nothing or the error is within ``tol``. Returns (the best state, its error)."""
    best = score(state)
    for _ in range(sweeps):
        improved = False
        for dim, options in choices.items():
            for option in options:
                if option is state[dim] or best <= tol:
                    continue
                error = score({**state, dim: option})
                if error < best * 0.999:
                    state, best, improved = {**state, dim: option}, error, True
        if not improved or best <= tol:
            break
    return state, best


def intended_bug(options: Options, rope, head_dim: int) -> tuple[str, dict] | None:
    """(bug id, its text's values) for a mistake inside the options found: QK-norm over the whole width, a window
    one key off what the constructor says, partial RoPE turning other features than the first rotary_dim;
    None otherwise."""
    meant = options.intended
    norm = options.qk_norm
    if norm is not None and norm.whole_width and norm.q_weight is None and norm.k_weight is None:
        return "qk-norm-wrong-axis", {}  # weighted over the whole width is OLMo 2's design, not a mistake
    window, name = meant.get("window"), meant.get("window_name", "window")
    if window and options.window and abs(options.window - int(window)) == 1:
        return "window-off-by-one", {"got": options.window, "want": int(window), "name": name}
    fraction = meant.get("rotary_fraction")
    wanted = meant.get("rotary_dim") or (int(head_dim * fraction) if fraction else None)
    turned = (rope.rotary_dim or head_dim) if rope is not None else None
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
    if rope is not None and rope.rotary_dim and rope.rotary_dim < head_dim and not rope.trailing:
        lines.append(("rope-partial", {"rotary_dim": rope.rotary_dim, "head_dim": head_dim}))
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

