"""capture_attention: record every attention call's weights inside a model, call sites untouched.

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
Attention written out by hand (`softmax(q @ k.T)`, as the tutorials and HF's "eager" models do) is
not a call anyone can see: convert such a module with `MultiHeadAttention.from_module` first.
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.overrides import TorchFunctionMode

from multihead.backends.common import reference_weights
from multihead.services import service

ACTIVE: list[Recorder] = []  # the attention core checks this (one list lookup) before reporting
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


def recorded(problem, run):
    """Called by `multihead.attention` while a capture is active: record the call's weights, then `run()` it
    with the SDPA calls it makes itself unrecorded (they are the same call)."""
    with torch.no_grad():
        keep, bias = problem.dense_mask()
        keys = problem.k if problem.kv_form == "dense" else problem.k.numbers(problem.q.dtype)  # a cache's codes
        weights = reference_weights(problem.q, keys, keep, bias, problem.scale, problem.softcap, problem.sinks)
    for recorder in ACTIVE:
        recorder.add(weights)
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
