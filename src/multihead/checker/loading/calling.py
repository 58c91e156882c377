"""How to call the learner's forward: its inputs, layout and mask argument, read from its signature.

``CallSpec`` records what was found; ``invoke`` calls the module with batch-first tensors and a
canonical keep pattern, converting both to the module's own conventions (argument order, layout, mask
encoding), and returns its output batch first. Anything the learner's code raises is wrapped in
``LearnerError``, and so is an output that is not (B, Lq, features): every trial verifies its shapes.
"""

from __future__ import annotations

import inspect
import os
import traceback
from dataclasses import dataclass, field

import torch
from torch import nn

from multihead.checker.loading.forward_args import Filler, filler_for

_LENGTH_WORDS = ("valid_len", "lens", "length", "seq_len")


class LearnerError(Exception):
    """The learner's forward raised; ``error`` is the original exception, ``where`` its source line,
    ``mask_none`` the required mask parameter that was given None in that call (or None), ``with_mask``
    whether that call was given a mask."""

    def __init__(self, error: BaseException, where: str, mask_none: str | None = None, with_mask: bool = False):
        super().__init__(f"{type(error).__name__}: {error}")
        self.error = error
        self.where = where
        self.mask_none = mask_none
        self.with_mask = with_mask  # raised in a call given a mask


@dataclass
class CallSpec:
    """What the learner's forward takes and how (found from its signature, then by behaviour)."""

    args: list[str]  # the tensor parameters, in order
    inputs: str  # "x" (self-attention), "qkv", or "q_kv" (query, and keys = values)
    mask_param: str | None = None
    mask_kind: str | None = None  # "mask" or "lengths" (from the parameter's name)
    mask_required: bool = False  # the mask parameter has no default (it is still given None: no mask)
    required_none: list[str] = field(default_factory=list)  # required extras we pass as None
    keyword_only: list[str] = field(default_factory=list)  # tensor parameters passed by name
    layout: str = "batch"  # or "seq"
    causal: bool = False
    causal_buffer: str | None = None
    causal_built: bool = False  # not causal by behaviour, but forward builds a causal mask and applies it
    encoding: object = None  # masks.Encoding once detected
    none_mask: object = None  # a required mask: the masks.Encoding whose all-keep mask stands for "no mask"
    mask_ignored: bool = False  # the mask argument changes nothing
    mask_complete: bool = False  # given a mask, a causal module drops its own causal masking (behaviour/mask_meaning.py)
    mask_claim: str | None = None  # the caller's convention from --call mask=... (mask_meaning.CLAIMS)
    options: object = None  # options.Options found (QK-norm, a window, sinks, a softcap), or None
    cross_lengths: bool = True  # accepts Lq != Lk
    order: tuple[int, ...] | None = None  # role (0 query, 1 key, 2 value) of each tensor argument; None = in order
    order_found: bool = False  # the order was found by behaviour (order.find_order), not assumed
    pre: dict = field(default_factory=dict)  # input tag ("x", "q", "k", "v") -> (name, layer) applied before
    fillers: list[Filler] = field(default_factory=list)  # required extras filled in by name (loading/forward_args.py)
    fixed: dict = field(default_factory=dict)  # keyword arguments of every call (an MLA's absorb=True)

    def causal_with(self, keep) -> bool:
        """Is a call with this keep pattern (or None) causal? A complete mask replaces the causal part."""
        return self.causal and not (keep is not None and self.mask_complete)


def read_signature(forward) -> CallSpec:
    """Classify the forward's parameters: tensors, the mask or lengths argument, other extras."""
    try:
        params = list(inspect.signature(forward).parameters.values())
    except (TypeError, ValueError):
        params = []
    if params and params[0].name == "self":
        params = params[1:]
    tensors, mask_param, mask_kind, mask_required, extras, keyword_only = [], None, None, False, [], []
    fillers = []
    for p in params:
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue
        low = p.name.lower()
        if p.default is p.empty and filler_for(p.name) is not None:  # start_pos, freqs_cis... (loading/forward_args.py)
            fillers.append(filler_for(p.name))
            continue
        if mask_param is None and ("mask" in low or "attn_bias" in low or "attention_bias" in low
                                   or any(w in low for w in _LENGTH_WORDS)):
            mask_param, mask_required = p.name, p.default is p.empty
            mask_kind = "lengths" if any(w in low for w in _LENGTH_WORDS) else "mask"
        elif p.default is p.empty and len(tensors) < 3:
            tensors.append(p.name)
            if p.kind == p.KEYWORD_ONLY:
                keyword_only.append(p.name)  # labml: forward(self, *, query, key, value, mask=None)
        elif p.default is p.empty:
            extras.append(p.name)
        elif len(tensors) < 3 and p.kind != p.KEYWORD_ONLY and low in ("key", "value", "k", "v", "keys",
                                                                        "values", "context", "kv", "encoder_hidden_states",
                                                                        "encoder_states", "memory", "cond"):
            tensors.append(p.name)  # forward(query, key=None, value=None): we pass them all
    if not tensors and any(p.kind == p.VAR_POSITIONAL for p in params):
        tensors = ["*args"]
    inputs = {1: "x", 2: "q_kv"}.get(len(tensors), "qkv")
    return CallSpec(args=tensors, inputs=inputs, mask_param=mask_param, mask_kind=mask_kind,
                    mask_required=mask_required, required_none=extras, keyword_only=keyword_only, fillers=fillers)


_NOT_LEARNER = (os.path.dirname(torch.__file__), os.path.dirname(os.path.dirname(__file__)))  # torch, checker/


def learner_frame(error: BaseException) -> str:
    """``file.py:23: scores = q @ k``: the deepest frame outside torch and this checker."""
    return learner_line(traceback.extract_tb(error.__traceback__))


def learner_line(frames) -> str:
    """``file.py:23: scores = q @ k``: the deepest of ``frames`` (a traceback's or ``traceback.extract_stack()``)
    outside torch and this checker; "" when there is none."""
    own = [f for f in frames if not f.filename.startswith(_NOT_LEARNER)]
    if not own:
        return ""
    frame = own[-1]
    return f"{frame.filename.rsplit('/', 1)[-1]}:{frame.lineno}: {(frame.line or '').strip()}"


INPUT_COUNT = {"x": 1, "q_kv": 2, "qkv": 3}  # CallSpec.inputs -> how many tensors forward takes


def attention_inputs(spec: CallSpec, xq, xk, xv) -> tuple:
    """(queries, keys, values) the module attends with: all xq for "x", values = keys for "q_kv"; each
    through the module's own layer that comes before its projections (``spec.pre``), if any."""
    inputs = {"x": (xq, xq, xq), "q_kv": (xq, xk, xk), "qkv": (xq, xk, xv)}[spec.inputs]
    if not spec.pre:
        return inputs
    tags = {"x": "xxx", "q_kv": "qkk", "qkv": "qkv"}[spec.inputs]
    return tuple(spec.pre[tag][1](t) if tag in spec.pre else t for tag, t in zip(tags, inputs))


def to_layout(t: torch.Tensor, layout: str) -> torch.Tensor:
    """Batch-first (B, L, E) -> the module's layout; also the way back (a transpose is its own inverse)."""
    return t.transpose(0, 1) if layout == "seq" else t


class WrongOutputShape(Exception):
    """The forward returned a tensor that is not (B, Lq, features) for its inputs."""


def first_tensor(output):
    """The output tensor (many modules return ``(output, attention_weights)``)."""
    while isinstance(output, (tuple, list)) and output:
        output = output[0]
    if not isinstance(output, torch.Tensor):
        raise TypeError(f"forward returned {type(output).__name__}, expected a tensor")
    return output


def all_keep(xq: torch.Tensor, xk: torch.Tensor) -> torch.Tensor:
    """The keep pattern (B, Lq, Lk) that blocks nothing, for batch-first xq (B, Lq, .) and xk (B, Lk, .)."""
    return torch.ones(xq.shape[0], xq.shape[1], xk.shape[1], dtype=torch.bool)


def invoke(module: nn.Module, spec: CallSpec, xq, xk=None, xv=None, keep=None):
    """Call the module on batch-first inputs (and keep pattern (B, Lq, Lk)); output (B, Lq, O) batch first.

    An output of any other shape raises LearnerError (WrongOutputShape): a trial that does not fit is
    evidence, never an index error further on."""
    xk = xq if xk is None else xk
    xv = xk if xv is None else xv
    count = INPUT_COUNT[spec.inputs]
    roles = spec.order or tuple(range(count))
    tensors = [(xq, xk, xv)[role] for role in roles]
    args, kwargs = [], {name: None for name in spec.required_none}
    kwargs.update({filler.name: filler.value(xq) for filler in spec.fillers})
    kwargs.update(spec.fixed)
    for name, t in zip(spec.args + [""] * 3, tensors):  # a hinted layout may pass more than named
        if name in spec.keyword_only:
            kwargs[name] = to_layout(t, spec.layout)
        else:
            args.append(to_layout(t, spec.layout))
    if spec.mask_param is not None:
        if keep is None and spec.none_mask is not None:  # a required mask: all-keep in its own convention
            kwargs[spec.mask_param] = spec.none_mask.encode(all_keep(xq, xk), xq.dtype)
        else:
            kwargs[spec.mask_param] = None if keep is None else spec.encoding.encode(keep, xq.dtype)
    for buffer in module.buffers():  # a cache the last call wrote under autograd: this call starts afresh
        if buffer.grad_fn is not None:
            buffer.detach_()
    try:
        out = first_tensor(module(*args, **kwargs))
    except Exception as error:
        mask_none = spec.mask_param if spec.mask_required and keep is None and spec.none_mask is None else None
        raise LearnerError(error, learner_frame(error), mask_none, keep is not None) from error
    B, Lq = xq.shape[:2]
    wanted = (B, Lq) if spec.layout == "batch" else (Lq, B)
    if out.dim() != 3 or tuple(out.shape[:2]) != wanted:
        query_shape = tuple(to_layout(xq, spec.layout).shape)
        raise LearnerError(WrongOutputShape(f"forward returned shape {tuple(out.shape)} for a query of shape "
                                            f"{query_shape}; expected ({wanted[0]}, {wanted[1]}, features)"), "")
    return to_layout(out, spec.layout)
