"""capture_attention and trace: watch every attention call inside a model, call sites untouched.

capture_attention records each call's weights; `trace` records which backend ran and why (below).

    with mh.capture_attention(model) as record:
        model(x)
    record[0].weights        # (B, H, Lq, Lk), float32, rows sum to 1 (0 where fully masked)
    record[0].module         # qualified name of the innermost module that was running
    record["layers.0.attn"]  # every call made inside that module

Three kinds of call are seen while the model runs:
- `multihead.attention` (our module and anything built on it), which reports its own weights (and the
  SDPA calls it makes itself are not recorded again);
- `torch.nn.functional.scaled_dot_product_attention` (HF "sdpa" models, nanoGPT, ...), seen by a
  TorchFunctionMode active only inside the block (torch itself is never patched);
- `torch.nn.MultiheadAttention` modules, asked for per-head weights and handed back what their
  caller asked for.
Outside the block nothing watches and no weights are ever computed.

    with mh.trace() as t:          # every multihead.attention call, in any model (HF's plug-in included)
        model(x)
    for r in t: r.layer, r.backend, r.reason     # module name, backend that ran, how it ran (dispatch's words)
    print(t)                       # a table by layer and backend: calls, (B, H, Lq, Lk) met, how it ran

Both share one flag: `multihead.attention` checks the list ACTIVE (one lookup) and does nothing more
while it is empty. A trace names the layer from the innermost running module, through torch's global
module hooks, which exist only inside the block. Calls made inside a torch.compile'd region are traced
into its graph, not run through Python, so a trace sees them only while dynamo traces.
Attention written out by hand (`softmax(q @ k.T)`, as the tutorials and HF's "eager" models do) is
not a call anyone can see: convert such a module with `MultiHeadAttention.from_module` first.
"""
from __future__ import annotations

import contextlib
import math
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from multihead.backends.common import reference_weights
from multihead.backends.dispatch import Decision, decide
from multihead.services import service

ACTIVE: list = []  # Recorders and Traces; the attention core checks this (one list lookup) before reporting
_OURS = [0]  # > 0 while multihead.attention runs a recorded call: its own SDPA calls are not recorded


@dataclass(frozen=True)
class AttentionCall:
    module: str
    weights: torch.Tensor  # (B, H, Lq, Lk)


class Recorder:
    """The record a `capture_attention` block yields: a list of AttentionCall, also by module name."""

    def __init__(self, model: nn.Module | None):
        self.calls: list[AttentionCall] = []
        self._model = model
        self._stack: list[str] = []

    @property
    def recording(self) -> bool:
        return self._model is None or bool(self._stack)

    def add(self, weights: torch.Tensor) -> None:
        if self.recording:
            name = self._stack[-1] if self._stack else ""
            self.calls.append(AttentionCall(name, weights.detach()))

    def __len__(self) -> int:
        return len(self.calls)

    def __iter__(self):
        return iter(self.calls)

    def __getitem__(self, key):
        if isinstance(key, str):
            return [c for c in self.calls if c.module == key]
        return self.calls[key]

    @property
    def weights(self) -> list[torch.Tensor]:
        return [c.weights for c in self.calls]

    def _repr_html_(self) -> str:
        """Jupyter draws a record as multihead explain's interactive attention page (the explain tool)."""
        return service("record_html")(self)


def recorded(problem, run, chosen=None, plan=None, backend: str = "auto"):
    """Called by `multihead.attention` while a capture or a trace is active: record the call's weights and
    the backend chosen, then `run()` it with the SDPA calls it makes itself unrecorded (the same call)."""
    weights = None
    for observer in ACTIVE:
        if isinstance(observer, Trace):
            if chosen is not None and not torch.compiler.is_compiling():
                observer.add(decide(problem, chosen, plan, backend), problem.dims)
            continue
        if weights is None:
            with torch.no_grad():
                keep, bias = problem.dense_mask()
                keys = problem.k if problem.kv_form == "dense" else problem.k.numbers(problem.q.dtype)  # a cache form
                weights = reference_weights(problem.q, keys, keep, bias, problem.scale, problem.softcap,
                                            problem.sinks)
        observer.add(weights)
    _OURS[0] += 1
    try:
        return run()
    finally:
        _OURS[0] -= 1


class _WatchSdpa(TorchFunctionMode):
    """Records the weights of every scaled_dot_product_attention call made while it is active."""

    def __init__(self, recorder: Recorder):
        super().__init__()
        self.recorder = recorder

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is F.scaled_dot_product_attention and not _OURS[0]:
            self.recorder.add(_sdpa_weights(*args, **kwargs))
        return func(*args, **kwargs)


def _sdpa_weights(query, key, value=None, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                  enable_gqa=False):
    """The weights torch's SDPA computes for these arguments (SDPA's own signature), (B, H, Lq, Lk) float32."""
    Lq, Lk = query.shape[-2], key.shape[-2]
    keep = bias = None
    if is_causal:
        keep = torch.ones(Lq, Lk, dtype=torch.bool, device=query.device).tril()
    if attn_mask is not None:
        if attn_mask.dtype == torch.bool:
            keep = attn_mask if keep is None else keep & attn_mask
        else:
            bias = attn_mask.float()
    scale = 1.0 / math.sqrt(query.shape[-1]) if scale is None else scale
    q, k = query, key
    if q.dim() == 3:  # (B, L, D): one head
        q, k = q[:, None], k[:, None]
        keep = keep if keep is None or keep.dim() < 3 else keep[:, None]
        bias = bias if bias is None or bias.dim() < 3 else bias[:, None]
    with torch.no_grad():
        return reference_weights(q, k, keep, bias, scale)


@contextlib.contextmanager
def capture_attention(model: nn.Module | None = None) -> Iterator[Recorder]:
    """Record the attention weights of every call inside `model` (or anywhere, with None)."""
    recorder = Recorder(model)
    handles = []
    for name, sub in model.named_modules() if model is not None else ():
        if isinstance(sub, nn.MultiheadAttention):  # first, so its post-hook runs before the name is popped
            handles += _watch_torch_mha(sub, recorder)
        handles.append(sub.register_forward_pre_hook(_push(recorder, name)))
        handles.append(sub.register_forward_hook(_pop(recorder), always_call=True))
    ACTIVE.append(recorder)
    try:
        with _WatchSdpa(recorder):
            yield recorder
    finally:
        ACTIVE.remove(recorder)
        for h in handles:
            h.remove()


def _push(recorder: Recorder, name: str):
    def hook(module, args):
        recorder._stack.append(name)

    return hook


def _pop(recorder: Recorder):
    def hook(module, args, output):
        if recorder._stack:
            recorder._stack.pop()

    return hook


def _watch_torch_mha(mha: nn.MultiheadAttention, recorder: Recorder):
    """Ask an nn.MultiheadAttention for per-head weights, record them, return what was asked for."""
    asked = []

    def pre(module, args, kwargs):
        asked.append((kwargs.get("need_weights", True), kwargs.get("average_attn_weights", True)))
        return args, {**kwargs, "need_weights": True, "average_attn_weights": False}

    def post(module, args, kwargs, output):
        need, average = asked.pop()
        out, weights = output
        if weights.dim() == 3:  # unbatched input: (H, Lq, Lk)
            recorder.add(weights[None].float())
        else:
            recorder.add(weights.float())
        if not need:
            return out, None
        return out, weights.mean(dim=-3) if average else weights

    return [
        mha.register_forward_pre_hook(pre, with_kwargs=True),
        mha.register_forward_hook(post, with_kwargs=True),
    ]


@dataclass(frozen=True)
class TraceRecord:
    """One attention call: the module it ran in, the backend that ran, how and why (dispatch's Decision)."""

    layer: str  # qualified module name inside the outermost running module (its class name at the top)
    backend: str
    reason: str  # how the backend runs this call (Decision.detail)
    dims: tuple[int, int, int, int]  # (B, H, Lq, Lk)
    decision: Decision  # also why each other backend was not chosen


class Trace:
    """What `trace()` yields: the calls in order (iterate, index, len); str() is a table by layer and backend."""

    def __init__(self):
        self.records: list[TraceRecord] = []
        self._stack: list[str] = []
        self._names: dict[int, str] = {}  # id(module) -> qualified name, for the outermost running module

    def add(self, decision: Decision, dims: tuple[int, int, int, int]) -> None:
        layer = self._stack[-1] if self._stack else ""
        self.records.append(TraceRecord(layer, decision.backend, decision.detail, tuple(dims), decision))

    def note(self, backend: str, reason: str, dims: tuple[int, int, int, int]) -> None:
        """A call that ran outside mh.attention's dispatch (a quantized cache's read, a paged read)."""
        self.add(Decision(backend, reason), dims)

    def __len__(self) -> int:
        return len(self.records)

    def __iter__(self):
        return iter(self.records)

    def __getitem__(self, i):
        return self.records[i]

    def backends(self) -> Counter:
        """Calls per backend."""
        return Counter(r.backend for r in self.records)

    def __str__(self) -> str:
        groups: dict[tuple[str, str], list[TraceRecord]] = {}
        for r in self.records:
            groups.setdefault((r.layer, r.backend), []).append(r)
        rows = [("layer", "backend", "calls", "Lq x Lk", "how it ran")]
        for (layer, backend), calls in groups.items():
            shapes = sorted({(r.dims[2], r.dims[3]) for r in calls})
            met = f"{shapes[0][0]}x{shapes[0][1]}" + ("" if len(shapes) == 1 else f" .. {shapes[-1][0]}x"
                                                       f"{shapes[-1][1]} ({len(shapes)} shapes)")
            rows.append((layer or "(top)", backend, str(len(calls)), met, calls[-1].reason))
        widths = [max(len(row[i]) for row in rows) for i in range(4)]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row[:4], widths)) + "  " + row[4] for row in rows]
        return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:], f"{len(self.records)} attention calls"])

    def _push(self, module, args) -> None:
        if not self._stack:
            self._names = {id(m): n for n, m in module.named_modules()}
            self._names[id(module)] = type(module).__name__
        self._stack.append(self._names.get(id(module), self._stack[-1] if self._stack else type(module).__name__))

    def _pop(self, module, args, output) -> None:
        if self._stack:
            self._stack.pop()


@contextlib.contextmanager
def trace() -> Iterator[Trace]:
    """Record, for every multihead attention call inside the block, the layer, the backend that ran and why."""
    record = Trace()
    hooks = (nn.modules.module.register_module_forward_pre_hook(record._push),
             nn.modules.module.register_module_forward_hook(record._pop, always_call=True))
    ACTIVE.append(record)
    try:
        yield record
    finally:
        ACTIVE.remove(record)
        for h in hooks:
            h.remove()


def traced(backend: str, reason: str, dims) -> None:
    """Tell the active traces about a call that ran outside mh.attention's dispatch (callers check ACTIVE)."""
    for observer in ACTIVE:
        if isinstance(observer, Trace) and not torch.compiler.is_compiling():
            observer.note(backend, reason, tuple(dims))
