"""What a backend can run, declared as data and checked once, by dispatch, before the backend's own plan.

    class MyBackend:
        name = "mine"
        capabilities = Capabilities(devices=("cpu",), dtypes=(torch.float32,), dropout=False, backward=False)

A backend's `plan` then keeps only its real decisions (the mask forms it takes, its thresholds): a call
the declaration rules out never reaches it. A backend that declares nothing takes plain tensors on every
device and dtype, with dropout, backward and recorded graphs, and refuses return_lse=True.

    devices     device types it runs on (None: every one)
    dtypes      dtypes of q it takes (None: every float dtype)
    kv_forms    the key/value forms it reads: "dense" (tensors), "quantized" (codes and scales), "paged"
                (pages and a block table); see kv_forms.py. A backend added with mh.register_backend that
                declares "quantized" or "paged" is offered a cache's views as they are
    empty       whether it takes Lq = 0 or Lk = 0
    dropout     whether it applies dropout
    backward    whether autograd may differentiate it
    no_backward_on  device types where it has no backward (when `backward` is True)
    recorded    whether it runs inside a recorded graph (torch.export, ONNX, torch.jit.trace; graphs.py)
    compiled    whether it runs under torch.compile
    lse         whether it returns the log-sum-exp (attention(..., return_lse=True))

Each refusal is a Reason with the code "<backend>.<what>" (e.g. "decode.grad"), made once per backend.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from multihead.backends.graphs import recorded_graph
from multihead.backends.reasons import Reason, cannot
from multihead.masks.part import part_tensors

__all__ = ["Capabilities", "DEFAULT", "unsupported"]


@dataclass(frozen=True)
class Capabilities:
    """What a backend takes (see the module docstring)."""

    devices: tuple[str, ...] | None = None
    dtypes: tuple[torch.dtype, ...] | None = None
    kv_forms: tuple[str, ...] = ("dense",)
    empty: bool = True
    dropout: bool = True
    backward: bool = True
    no_backward_on: tuple[str, ...] = ()
    recorded: bool = True
    compiled: bool = True
    lse: bool = False


DEFAULT = Capabilities()
_REASONS: dict = {}  # backend name -> (the backend, {what: Reason})


def needs_grad(p) -> bool:
    """Whether autograd will ask for a gradient through this call (a user's mask function may hold learnable
    tensors, so it counts as one that does)."""
    if p.grad is None:  # asked once per call, whichever backends ask
        p.grad = torch.is_grad_enabled() and (
            p.form.calls_user or p.q.requires_grad or p.k.requires_grad or p.v.requires_grad
            or p.sinks is not None and p.sinks.requires_grad
            or any(t.requires_grad for part in p.form.parts for t in part_tensors(part)))
    return p.grad


def unsupported(backend, p, lse: bool = False) -> Reason | None:
    """Why `backend`'s declared capabilities rule out problem `p` (with return_lse=`lse`), or None."""
    caps = getattr(backend, "capabilities", DEFAULT)
    device = p.q.device.type
    if p.kv_form not in caps.kv_forms:
        what = "kv-form"
    elif caps.devices is not None and device not in caps.devices:
        what = "device"
    elif caps.dtypes is not None and p.q.dtype not in caps.dtypes:
        what = "dtype"
    elif not caps.empty and (p.q.shape[2] == 0 or p.k.shape[2] == 0):
        what = "empty"
    elif not caps.dropout and p.dropout:
        what = "dropout"
    elif (not caps.backward or device in caps.no_backward_on) and needs_grad(p):
        what = "grad"
    elif not caps.recorded and recorded_graph():
        what = "recorded"
    elif not caps.compiled and torch.compiler.is_compiling():
        what = "compiled"
    elif lse and not caps.lse:
        what = "lse"
    else:
        return None
    return refusals(backend)[what]


def refusals(backend) -> dict[str, Reason]:
    """The Reason of each capability `backend` may lack, made once per backend (code "<name>.<what>")."""
    found = _REASONS.get(backend.name)
    if found is not None and found[0] is backend:
        return found[1]
    caps, name = getattr(backend, "capabilities", DEFAULT), backend.name
    where = (lambda q: f" on {q.q.device.type}") if caps.backward else (lambda q: "")
    words = {
        "kv-form": lambda q: f"it reads {_words(caps.kv_forms)} keys and values; this call's are {q.kv_form}",
        "device": lambda q: f"it runs on {_words(caps.devices or ())}; got {q.q.device.type}",
        "dtype": lambda q: f"it takes {_words(caps.dtypes or ())}; got {q.q.dtype}",
        "empty": lambda q: f"it needs non-empty sequences; got Lq={q.dims[2]}, Lk={q.dims[3]}",
        "dropout": "it has no dropout",
        "grad": lambda q: f"it has no backward{where(q)}, and this call needs a gradient",
        "recorded": "a recorded graph (torch.export, ONNX, torch.jit.trace) keeps to torch's own ops, and it calls a "
                    "compiled extension",
        "compiled": "it does not run under torch.compile",
        "lse": "it does not return the log-sum-exp (return_lse=True)",
    }
    made = {what: cannot(f"{name}.{what}", text) for what, text in words.items()}
    _REASONS[name] = (backend, made)
    return made


def _words(items) -> str:
    return ", ".join(str(x).replace("torch.", "") for x in items)
