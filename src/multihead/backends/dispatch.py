"""Which backend runs, its plan, and why the others were not chosen.

    >>> d = mh.dispatch(q, k, v, mh.Mask.causal())
    >>> print(d)
    sdpa: F.scaled_dot_product_attention, is_causal=True (the causal structure is kept, no dense mask)
      math: not chosen: reference math materialises the (B, H, Lq, Lk) = ... scores; slower

`plan_call` is the hot path: a call is checked, folded into its normal form and planned once per value,
then remembered. The plan cache is keyed by
- the mask's structure: each part's kind and static fields (a user's function by identity), and each tensor's
  shape, dtype and device. Its values are the entry's business: an entry keeps its fold made from copies of
  the mask's tensors (COPIED_NUMEL elements at most, on the CPU) and a call compares its mask's values with
  them (whatever wrote them: in place, through .data, through .numpy()). Equal, the kept fold and plan run;
  different, the mask is checked and folded again, and the plan is kept only where the chosen backend, and
  each tried before it, reads no values in planning (`reads_values = False`: decode, quantized, paged, sparse), else
  the backend is chosen again. Masks too large to copy, on a device, or needing grad are folded on every call;
- the call: q, k and v's type (tensors or a kv form, as kv_forms.resolved reads it), shapes, dtypes and devices,
  causal, scale, softcap, dropout (plain floats and bools; other kinds are checked on every call), the sinks'
  shape, dtype and device, the backend asked for, return_lse, and whether autograd needs a gradient.
Before a backend's plan, dispatch checks what it declares it takes (capabilities.py), once.
Under torch.compile and tracing nothing is remembered or read (no guards on it). A plan whose form
carries autograd history (mask tensors that need grad), calls a user's function (which may read
tensors the mask cannot see) or holds more than HELD_BYTES is rebuilt on every call by its backend;
only the choice and the checks are remembered. A call met before at another key length Lk (a KV cache's
next step) is not checked or folded again: where the backend's plan serves every key length from some on
(`keys_from`: decode, quantized, paged, sparse) and every backend tried before it refuses at every length, that
plan runs; else only the choice is made again. `mh.dispatch` plans through the same cache and evicts nothing.
Reasons are constant codes (backends/reasons.py), worded here and nowhere else.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import torch
import torch.utils._pytree as pytree

from multihead.backends import BUILTIN, Problem, Reason
from multihead.backends.capabilities import refusals, unsupported
from multihead.backends.graphs import building_graph
from multihead.backends.kv_forms import Paged, Quantized, resolved
from multihead.backends.problem import fold, heads_first, make_problem
from multihead.errors import AttentionError, CannotRunError
from multihead.masks import Mask
from multihead.masks.normal_form import normal_form
from multihead.masks.part import part_tensors

PLAN_LIMIT = 64  # plans remembered at once; the oldest goes first
COPIED_NUMEL = 1 << 16  # mask elements an entry copies to compare at each call; larger masks fold on every call
UNCOPIED = ()  # an entry's `values` when they were not copied
HELD_BYTES = 4 << 20  # a plan holding more tensor bytes than this keeps only its choice (see the docstring)

_BACKENDS = list(BUILTIN)  # in the order "auto" tries them
for _backend in BUILTIN:
    refusals(_backend)  # each backend's capability reasons, made once here rather than on some first call
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
    kv_form: str
    volatile: bool
    keys_from: int | None  # the plan serves this call at every key length from this one on; None: at one only
    values: tuple | None  # a copy of the mask tensors' values the fold read (None: no tensors; UNCOPIED: not kept)
    steady: bool  # the choice and the plan read no mask values: a fold with new values keeps them


@dataclass(frozen=True)
class Decision:
    """The chosen backend, how it will run, and a reason for every backend not chosen."""

    backend: str
    detail: str
    reasons: dict[str, str] = field(default_factory=dict)
    codes: dict[str, str] = field(default_factory=dict)  # the same reasons as stable codes
    kv_form: str = "dense"  # the call's keys and values (kv_forms.py)

    def __str__(self) -> str:
        """The choice and each other backend's reason; the backends that read another kind of keys and values
        are named on one line (none for plain tensors: those read a cache's forms only)."""
        lines = [f"{self.backend}: {self.detail}"]
        lines += [f"  {name}: not chosen: {why}" for name, why in self.reasons.items()
                  if not self.codes.get(name, "").endswith(".kv-form")]
        other = [name for name, code in self.codes.items() if code.endswith(".kv-form")]
        if other and self.kv_form != "dense":
            lines.append(f"  {', '.join(other)}: not chosen: they read other keys and values than {self.kv_form} ones")
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
    refusals(backend)
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


def plan_call(q, k, v, mask, causal, scale, softcap, sinks, dropout, backend: str, lse: bool = False):
    """(problem, backend, plan) for one call: remembered by value (see the module docstring), else checked,
    folded and planned. Raises AttentionError for bad input or a backend that cannot run it."""
    key = None
    if (not building_graph() and (causal is True or causal is False) and (lse is True or lse is False)
            and (scale is None or type(scale) is float) and (softcap is None or type(softcap) is float)
            and type(dropout) is float):  # other kinds of numbers are checked on every call
        try:  # the key; not tensors or not a Mask: make_problem says what came
            mask_key = None if mask is None else _mask_key(mask)  # None: an inference tensor, nothing kept
            kv_type = type(k)
            if kv_type is not type(q):  # a cache's view, as dispatch reads it (kv_forms.resolved)
                k, v = resolved(q, k, v)
                kv_type = type(k)
            if (mask is None or mask_key is not None) and kv_type is type(v):
                grad = torch.is_grad_enabled() and (
                    q.requires_grad or k.requires_grad or v.requires_grad or sinks is not None and sinks.requires_grad
                    or mask is not None and any(t.requires_grad for t in mask.tensors))
                key = (type(q), q.shape, q.dtype, q.device, k.shape, k.dtype, k.device, v.shape, v.dtype, v.device,
                       mask_key, causal, scale, softcap, dropout,
                       None if sinks is None else (type(sinks), sinks.shape, sinks.dtype, sinks.device), backend,
                       kv_type, lse, grad)
                entry = _PLANS.get(key)
            else:
                entry = None
        except (AttributeError, TypeError):  # TypeError: an unhashable argument
            key = entry = None
        if entry is not None:
            _INFO[0] += 1
            if entry.values is None and not entry.volatile:  # the common hit: no mask tensors, a plan kept whole
                return (Problem(q, k, v, entry.form, entry.scale, entry.dropout, entry.softcap, sinks, entry.kv_form,
                                lse), entry.backend, entry.plan)
            return _reused(entry, key, q, k, v, mask, causal, sinks, lse, backend)
        if key is not None:
            return _plan_new_call(key, q, k, v, mask, causal, scale, softcap, sinks, dropout, backend, lse)
    problem = make_problem(q, k, v, mask, causal, scale, dropout, softcap, sinks, lse)
    return (problem, *choose(problem, backend))


def _mask_key(mask) -> tuple | None:
    """The mask's value for the key: each part's kind and static fields, and its tensors' shapes, dtypes and
    devices (not their identity: a mask made anew each step with tensors of the same shapes meets its plan;
    the values are compared with the entry's copy, `_same_values`). None for inference tensors."""
    value = mask.value_key()  # (its static part, then each tensor's identity and meta); None for inference tensors
    tensors = mask.tensors
    if not tensors:
        return value
    return mask._static, tuple((t.shape, t.dtype, t.device) for t in tensors)


def _reused(entry: _Entry, key, q, k, v, mask, causal, sinks, lse: bool, backend: str, counted: bool = True):
    """(problem, backend, plan) from a remembered entry. Where the mask's tensors no longer hold the values the
    entry's fold read (another tensor, a write in place, through .data or .numpy()), the mask is checked and
    folded again; the plan is kept where its backend reads no values in it (`reads_values = False`), else the
    backend is chosen again and the entry replaced."""
    form = entry.form
    if entry.values is not None and not _same_values(mask, entry.values):
        mask.check(q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.device)
        form = fold(mask, causal)
        if not entry.steady:
            _INFO[2] += counted
            problem = Problem(q, k, v, form, entry.scale, entry.dropout, entry.softcap, sinks, entry.kv_form, lse)
            return _remembered(key, problem, backend)
    problem = Problem(q, k, v, form, entry.scale, entry.dropout, entry.softcap, sinks, entry.kv_form, lse)
    if not entry.volatile:
        return problem, entry.backend, entry.plan
    plan = entry.backend.plan(problem, False)
    if not isinstance(plan, Reason):
        return problem, entry.backend, plan
    return (problem, *choose(problem, backend))  # the values it read changed its answer


def _plan_new_call(key, q, k, v, mask, causal, scale, softcap, sinks, dropout, backend: str, lse: bool):
    """A call not met before, planned and remembered. When the same call was met at another key length Lk (a
    KV cache's next step), only what depends on Lk is done again: the mask's own checks and, unless that
    entry's plan serves this length too (`_Entry.keys_from`), the choice of backend (its thresholds, its
    plan); the inputs' checks and the fold it shares are not."""
    same_but_length = key[:4] + (_without_length(k.shape),) + key[5:7] + (_without_length(v.shape),) + key[8:]
    other = _KEY_LENGTHS.get(same_but_length)
    if other is not None and k.shape[2] == v.shape[2]:
        if mask is not None:
            mask.check(q.shape[0], q.shape[1], q.shape[2], k.shape[2], q.device)
        if other.keys_from is not None and k.shape[2] >= other.keys_from:
            _INFO[0] += 1
            return _reused(other, key, q, k, v, mask, causal, sinks, lse, backend, counted=False)
        form = other.form if other.values is None or _same_values(mask, other.values) else fold(mask, causal)
        problem = Problem(q, k, v, form, other.scale, other.dropout, other.softcap, sinks, other.kv_form, lse)
        _INFO[2] += 1
    else:
        problem = make_problem(q, k, v, mask, causal, scale, dropout, softcap, sinks, lse)
        _INFO[1] += 1
    return _remembered(key, problem, backend, same_but_length, mask)


def _remembered(key, problem: Problem, backend: str, same_but_length=None, mask=None):
    """Choose and plan `problem`, and remember the entry under `key` (and `same_but_length`)."""
    chosen, plan = choose(problem, backend)
    steady = not getattr(chosen, "reads_values", True) and (backend != "auto" or all(
        _refused_at_every_length(b, problem) or not getattr(b, "reads_values", True)
        for b in _BACKENDS[:_BACKENDS.index(chosen)]))
    form, values = _kept_form(problem.form, key[-1])
    entry = _Entry(chosen, plan, form, problem.scale, problem.dropout, problem.softcap, problem.kv_form,
                   _volatile(problem, plan, key[-1]), _keys_from(problem, chosen, plan, backend), values, steady)
    _remember(_PLANS, key, entry)
    if same_but_length is not None:
        _remember(_KEY_LENGTHS, same_but_length, entry)
    return problem, chosen, plan


def _kept_form(form, grad: bool):
    """(the form an entry keeps, the values it holds). A form with mask tensors is folded again from copies of
    them, which nobody else can write: a later call whose mask holds the same values (`_same_values`) reads it.
    (form, None) without tensors; (form, UNCOPIED) where they are not copied (on a device, too large, needing
    grad): such an entry folds the caller's mask on every call."""
    tensors = [t for part in form.parts for t in part_tensors(part)]
    if not tensors:
        return form, None
    if grad or sum(t.numel() for t in tensors) > COPIED_NUMEL or any(t.device.type != "cpu" for t in tensors):
        return form, UNCOPIED
    copied = pytree.tree_map_only(torch.Tensor, lambda t: t.detach().clone(), Mask(form.parts))
    kept = normal_form(copied.parts)
    return kept, tuple(t for part in kept.parts for t in part_tensors(part))


def _same_values(mask, values) -> bool:
    """Whether the mask's tensors hold exactly `values` (a `_snapshot`): read on the host, whatever wrote them."""
    if values is UNCOPIED:
        return False
    tensors = mask.tensors
    return len(tensors) == len(values) and all(torch.equal(t, c) for t, c in zip(tensors, values))


def _without_length(shape) -> tuple:
    """(B, H, L, D) -> (B, H, D)."""
    return (shape[0], shape[1], shape[3])


def _keys_from(problem: Problem, chosen, plan, backend: str) -> int | None:
    """The backend's `keys_from` where it may be trusted: asked for by name, or the first backend "auto" tries
    that takes the call by what it declares (a backend tried before it might accept the call at another key
    length)."""
    keys_from = getattr(chosen, "keys_from", None)
    if keys_from is None or backend == "auto" and not all(_refused_at_every_length(b, problem)
                                                          for b in _BACKENDS[:_BACKENDS.index(chosen)]):
        return None
    return keys_from(problem, plan, backend == "auto")


def _refused_at_every_length(backend, problem: Problem) -> bool:
    """Whether `backend` refuses the call whatever its key length: by what it declares (not for being empty), or
    by a reason of its plan that says so (Reason.any_length)."""
    why = unsupported(backend, problem, problem.lse)
    if why is not None:
        return not why.code.endswith(".empty")
    why = backend.plan(problem, True)
    return isinstance(why, Reason) and why.any_length


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
    refusals = []
    if backend == "auto":
        for candidate in _BACKENDS:
            plan = _plan(candidate, problem, True)
            if not isinstance(plan, Reason):
                return candidate, plan
            refusals.append((candidate.name, plan))
        backend = _BACKENDS[-1].name  # every backend declined: the reference math runs it
    for candidate in _BACKENDS:
        if candidate.name == backend:
            plan = _plan(candidate, problem, False)
            if isinstance(plan, Reason):
                # in "auto", the refusal of a backend that reads this call's kv form says most
                name, plan = next(((n, r) for n, r in refusals if not r.code.endswith(".kv-form")), (backend, plan))
                raise CannotRunError(f"backend {name!r} cannot run this call: {plan.text(problem)}.",
                                     backend=name, code=plan.code)
            return candidate, plan
    raise AttentionError(f"backend must be 'auto' or one of {backend_names()}; got {backend!r}.")


def _plan(backend, problem: Problem, auto: bool):
    """The backend's plan, or a Reason: first what it declares it takes (capabilities.py), then its own plan."""
    why = unsupported(backend, problem, problem.lse)
    return why if why is not None else backend.plan(problem, auto)


def decide(problem: Problem, chosen, plan, backend: str = "auto") -> Decision:
    """The choice, how it will run, and why each other backend was not chosen (in words)."""
    reasons, codes = {}, {}
    for other in _BACKENDS:
        if other is chosen:
            continue
        if backend != "auto":
            reasons[other.name], codes[other.name] = f"not requested (backend={backend!r})", "not-requested"
            continue
        why = _plan(other, problem, True)
        if isinstance(why, Reason):
            reasons[other.name], codes[other.name] = why.text(problem), why.code
        else:
            reasons[other.name] = f"{chosen.name} ranks first and accepted the call"
            codes[other.name] = "ranked-after"
    return Decision(chosen.name, chosen.describe(problem, plan), reasons, codes, problem.kv_form)


def dispatch(q: torch.Tensor, k: torch.Tensor | Quantized | Paged, v: torch.Tensor | Quantized | Paged,
             mask: Mask | None = None, *, causal: bool = False,
             scale: float | None = None, softcap: float | None = None, sinks: torch.Tensor | None = None,
             dropout: float = 0.0, backend: str = "auto", return_lse: bool = False, layout: str = "bhsd") -> Decision:
    """Which backend `attention(q, k, v, mask, ...)` would run, with the reasons; computes nothing."""
    q, k, v = heads_first(q, k, v, layout)
    problem, chosen, plan = plan_call(q, k, v, mask, causal, scale, softcap, sinks, dropout, backend, return_lse)
    return decide(problem, chosen, plan, backend)
