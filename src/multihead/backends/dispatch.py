"""Which backend runs, its plan, and why the others were not chosen.

    >>> d = mh.dispatch(q, k, v, mh.Mask.causal())
    >>> print(d)
    sdpa: F.scaled_dot_product_attention, is_causal=True (the causal structure is kept, no dense mask)
      math: not chosen: reference math materialises the (B, H, Lq, Lk) = ... scores; slower

`plan_call` is the hot path: a call is checked, folded into its normal form and planned once per value,
then remembered. The plan cache is keyed by
- the mask's value (`Mask.value_key`): each part's kind and static fields (a user's function by
  identity), each tensor by identity, version and shape. The entry holds the mask's parts, so a tensor
  it names by id stays alive while the entry lives: no other tensor can take that id;
- the call: q, k and v's type, shapes, dtypes and devices, causal, scale, softcap, dropout (plain floats and
  bools; other kinds are checked on every call), the sinks' shape, dtype and device, the backend asked for,
  and whether autograd needs a gradient.
Under torch.compile and tracing nothing is remembered or read (no guards on it). A plan whose form
carries autograd history (mask tensors that need grad), calls a user's function (which may read
tensors the mask cannot see) or holds more than HELD_BYTES is rebuilt on every call by its backend;
only the choice and the checks are remembered. A call met before at another key length Lk (a KV cache's
next step) is not checked or folded again: where the backend's plan serves every key length from some on
(`keys_from`: the decode step's) and no backend tried before it could answer otherwise, that plan runs;
else only the choice is made again. `mh.dispatch` plans through the same cache and evicts nothing.
Reasons are constant codes (backends/reasons.py), worded here and nowhere else.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, NamedTuple

import torch

from multihead.backends import BUILTIN, Problem, Reason
from multihead.backends.problem import make_problem
from multihead.errors import AttentionError, CannotRunError
from multihead.masks.part import part_tensors

if TYPE_CHECKING:
    from multihead.masks import Mask

PLAN_LIMIT = 64  # plans remembered at once; the oldest goes first
HELD_BYTES = 4 << 20  # a plan holding more tensor bytes than this keeps only its choice (see the docstring)

_BACKENDS = list(BUILTIN)  # in the order "auto" tries them
_PLANS: dict = {}
_KEY_LENGTHS: dict = {}  # the key without Lk -> the last entry made for it (a KV cache grows Lk by one a step)
_INFO = [0, 0, 0]  # hits, misses, choices made again for a new key length


class CacheInfo(NamedTuple):
    hits: int
    misses: int
    size: int
    new_key_lengths: int  # calls whose backend was chosen again (no checks, no fold) because only Lk changed


class _Entry(NamedTuple):
    backend: object
    plan: object  # None when `volatile`: the backend plans again on every call
    form: object  # the first call's normal form, scale, dropout and softcap (never its q, k, v)
    scale: float
    dropout: float
    softcap: float | None
    volatile: bool
    keys_from: int | None  # the plan serves this call at every key length from this one on; None: at one only


@dataclass(frozen=True)
class Decision:
    """The chosen backend, how it will run, and a reason for every backend not chosen."""

    backend: str
    detail: str
    reasons: dict[str, str] = field(default_factory=dict)
    codes: dict[str, str] = field(default_factory=dict)  # the same reasons as stable codes

    def __str__(self) -> str:
        lines = [f"{self.backend}: {self.detail}"]
        lines += [f"  {name}: not chosen: {why}" for name, why in self.reasons.items()]
        return "\n".join(lines)


def backend_names() -> list[str]:
    return [b.name for b in _BACKENDS]


def register_backend(backend, *, before: str | None = None) -> None:
    """Add a backend (see multihead.backends for what one is) to those "auto" tries, before the one named
    `before` (default: before the reference math, which stays last); it is also asked for by its name."""
    for hook in ("plan", "run", "describe"):
        if not callable(getattr(backend, hook, None)):
            raise AttentionError(f"a backend needs a name and plan, run and describe methods; {backend!r} has no "
                                 f"{hook}.")
    name = getattr(backend, "name", None)
    if not isinstance(name, str) or not name or name == "auto" or name in backend_names():
        raise AttentionError(f"a backend needs a new name (not 'auto', not one of {backend_names()}); got {name!r}.")
    before = _BACKENDS[-1].name if before is None else before
    if before not in backend_names():
        raise AttentionError(f"before must name a backend, one of {backend_names()}; got {before!r}.")
    _BACKENDS.insert(backend_names().index(before), backend)
    _PLANS.clear()
    _KEY_LENGTHS.clear()


def remove_backend(name: str) -> None:
    """Take back a backend `register_backend` added."""
    if name not in backend_names() or any(b.name == name for b in BUILTIN):
        raise AttentionError(f"only a registered backend can be removed; got {name!r}.")
    del _BACKENDS[backend_names().index(name)]
    _PLANS.clear()
    _KEY_LENGTHS.clear()


def cache_info() -> CacheInfo:
    """Hits, misses and size of the plan cache (a miss is a call checked, folded and planned), and the calls that
    only chose again, for a key length met for the first time (a KV cache's step)."""
    return CacheInfo(_INFO[0], _INFO[1], len(_PLANS), _INFO[2])


def plan_call(q, k, v, mask, causal, scale, softcap, sinks, dropout, backend: str):
    """(problem, backend, plan) for one call: remembered by value (see the module docstring), else checked,
    folded and planned. Raises AttentionError for bad input or a backend that cannot run it."""
    key = None
    if (not (torch.compiler.is_compiling() or torch._C._is_tracing()) and (causal is True or causal is False)
            and (scale is None or type(scale) is float) and (softcap is None or type(softcap) is float)
            and type(dropout) is float):  # other kinds of numbers are checked on every call
        try:  # the key; not tensors or not a Mask: make_problem says what came
            mask_key = None if mask is None else mask.value_key()  # None: an inference tensor, nothing kept
            if (mask is None or mask_key is not None) and type(q) is type(k) is type(v):
                grad = torch.is_grad_enabled() and (
                    q.requires_grad or k.requires_grad or v.requires_grad or sinks is not None and sinks.requires_grad
                    or mask is not None and any(t.requires_grad for t in mask.tensors))
                key = (type(q), q.shape, q.dtype, q.device, k.shape, k.dtype, k.device, v.shape, v.dtype, v.device,
                       mask_key, causal, scale, softcap, dropout,
                       None if sinks is None else (type(sinks), sinks.shape, sinks.dtype, sinks.device), backend, grad)
                entry = _PLANS.get(key)
            else:
                entry = None
        except (AttributeError, TypeError):  # TypeError: an unhashable argument
            key = entry = None
        if entry is not None:
            _INFO[0] += 1
            return _planned(entry, Problem(q, k, v, entry.form, entry.scale, entry.dropout, entry.softcap, sinks),
                            backend)
        if key is not None:
            return _plan_new_call(key, q, k, v, mask, causal, scale, softcap, sinks, dropout, backend)
    problem = make_problem(q, k, v, mask, causal, scale, dropout, softcap, sinks)
    return (problem, *choose(problem, backend))


def _planned(entry: _Entry, problem: Problem, backend: str):
    """(problem, backend, plan) from a remembered entry: its plan, or a volatile entry's plan made again."""
    if not entry.volatile:
        return problem, entry.backend, entry.plan
    plan = entry.backend.plan(problem, False)
    if not isinstance(plan, Reason):
        return problem, entry.backend, plan
    return (problem, *choose(problem, backend))  # the values it read changed its answer


def _plan_new_call(key, q, k, v, mask, causal, scale, softcap, sinks, dropout, backend: str):
    """A call not met before, planned and remembered. When the same call was met at another key length Lk (a
    KV cache's next step), only what depends on Lk is done again: the mask's own checks and, unless that
    entry's plan serves this length too (`_Entry.keys_from`), the choice of backend (its thresholds, its
    plan); the inputs' checks and the fold it shares are not."""
    same_but_length = key[:4] + (_without_length(k.shape),) + key[5:7] + (_without_length(v.shape),) + key[8:]
    other = _KEY_LENGTHS.get(same_but_length)
    if other is not None and k.shape[2] == v.shape[2]:
        if mask is not None:
            mask.check(q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.device)
        problem = Problem(q, k, v, other.form, other.scale, other.dropout, other.softcap, sinks)
        if other.keys_from is not None and k.shape[2] >= other.keys_from:
            _INFO[0] += 1
            return _planned(other, problem, backend)
        _INFO[2] += 1
    else:
        problem = make_problem(q, k, v, mask, causal, scale, dropout, softcap, sinks)
        _INFO[1] += 1
    chosen, plan = choose(problem, backend)
    entry = _Entry(chosen, plan, problem.form, problem.scale, problem.dropout, problem.softcap,
                   _volatile(problem, plan, key[-1]), _keys_from(problem, chosen, plan, backend))
    _remember(_PLANS, key, entry)
    _remember(_KEY_LENGTHS, same_but_length, entry)
    return problem, chosen, plan


def _without_length(shape) -> tuple:
    """(B, H, L, D) -> (B, H, D)."""
    return (shape[0], shape[1], shape[3])


def _keys_from(problem: Problem, chosen, plan, backend: str) -> int | None:
    """The backend's `keys_from` where it may be trusted: asked for by name, or the first backend "auto" tries
    (a backend tried before it might accept the call at another key length)."""
    keys_from = getattr(chosen, "keys_from", None)
    if keys_from is None or backend == "auto" and chosen is not _BACKENDS[0]:
        return None
    return keys_from(problem, plan, backend == "auto")


def _volatile(problem: Problem, plan, grad: bool) -> bool:
    """Whether the plan must be made again on every call (see the module docstring)."""
    form = problem.form
    if form.calls_user or grad and any(t.requires_grad for p in form.parts for t in part_tensors(p)):
        return True
    return _held_bytes(plan) > HELD_BYTES


def _held_bytes(obj, depth: int = 0) -> int:
    """The bytes of the tensors a plan holds (tuples, lists and objects' attributes, a few levels down)."""
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if depth > 3:
        return 0
    if isinstance(obj, (tuple, list)):
        return sum(_held_bytes(x, depth + 1) for x in obj)
    if hasattr(obj, "__dict__"):
        return sum(_held_bytes(x, depth + 1) for x in vars(obj).values())
    return 0


def _remember(table: dict, key, entry: _Entry) -> None:
    if entry.volatile:
        entry = entry._replace(plan=None)
    while len(table) >= PLAN_LIMIT:
        try:
            del table[next(iter(table))]
        except (KeyError, RuntimeError, StopIteration):  # another thread changed it first
            break
    table[key] = entry


def choose(problem: Problem, backend: str = "auto"):
    """(backend object, its plan) for a validated problem, nothing remembered; formats nothing.

    backend="auto": the first backend whose plan accepts the call, else the last one that can run it
    (reference math). A backend name: that backend's plan, or CannotRunError if it cannot run the call.
    """
    if backend == "auto":
        for candidate in _BACKENDS:
            plan = candidate.plan(problem, True)
            if not isinstance(plan, Reason):
                return candidate, plan
        backend = _BACKENDS[-1].name  # every backend declined: the reference math runs it
    for candidate in _BACKENDS:
        if candidate.name == backend:
            plan = candidate.plan(problem, False)
            if isinstance(plan, Reason):
                raise CannotRunError(f"backend {backend!r} cannot run this call: {plan.text(problem)}.",
                                     backend=backend, code=plan.code)
            return candidate, plan
    raise AttentionError(f"backend must be 'auto' or one of {backend_names()}; got {backend!r}.")


def decide(problem: Problem, chosen, plan, backend: str = "auto") -> Decision:
    """The choice, how it will run, and why each other backend was not chosen (in words)."""
    reasons, codes = {}, {}
    for other in _BACKENDS:
        if other is chosen:
            continue
        if backend != "auto":
            reasons[other.name], codes[other.name] = f"not requested (backend={backend!r})", "not-requested"
            continue
        why = other.plan(problem, True)
        if isinstance(why, Reason):
            reasons[other.name], codes[other.name] = why.text(problem), why.code
        else:
            reasons[other.name] = f"{chosen.name} ranks first and accepted the call"
            codes[other.name] = "ranked-after"
    return Decision(chosen.name, chosen.describe(problem, plan), reasons, codes)


def dispatch(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Mask | None = None, *, causal: bool = False,
             scale: float | None = None, softcap: float | None = None, sinks: torch.Tensor | None = None,
             dropout: float = 0.0, backend: str = "auto") -> Decision:
    """Which backend `attention(q, k, v, mask, ...)` would run, with the reasons; computes nothing."""
    problem, chosen, plan = plan_call(q, k, v, mask, causal, scale, softcap, sinks, dropout, backend)
    return decide(problem, chosen, plan, backend)
