"""Attention backends: each computes the same function with its own kernels, reading the mask's normal form.

A backend is an object with
    name: str
    capabilities: Capabilities (capabilities.py)
        What it takes, as data: devices, dtypes, kv forms (tensors, a quantized cache's codes), empty
        sequences, dropout, backward, recorded graphs, torch.compile, the log-sum-exp. Dispatch checks it
        once, before `plan`, and words each refusal ("<name>.device", "<name>.grad", ...). Without it: plain
        tensors on every device and dtype, no log-sum-exp.
    plan(problem, auto) -> plan | Reason
        One look at the call (problem.form is the mask's normal form). Either what the backend will run
        (its own plan object: SDPA arguments, blocks, slices, row intervals; anything, None included) or
        a `Reason` constant saying why not. With auto=False the backend was asked for by name: it returns
        a Reason only when it cannot compute the call exactly (`Reason.cannot`). With auto=True it may also
        decline (cannot=False) a call another backend runs better. A plan reads every host value it needs
        once; nothing is formatted.
    run(problem, plan) -> Tensor          (B, H, Lq, Dv), from the plan it made for this problem; with
                                          problem.lse (return_lse=True), (out, lse (B, H, Lq) float32)
    describe(problem, plan) -> str        how it will run (kernel, mask form), for mh.dispatch only
and may have
    reads_values = False
        Its plan, and its answer to `plan`, read the call's shapes and the mask's structure only, never the
        values of the mask's tensors (run reads those): a mask with new values (a ragged cache's lengths, a
        decoder's fresh top-k lists) keeps the plan. By default a plan is assumed to read them.
    keys_from(problem, plan, auto) -> int
        The fewest keys from which `plan` serves the same call at every key length (run reads Lk itself),
        and plan(problem, auto) accepts it: a KV cache's steps then plan once (see multihead.dispatch).
Backends are siblings: each imports only the shared modules (problem, reasons, common, sdpa_args and the
kernel wrappers), never another backend. `BUILTIN` lists them in the order "auto" tries them: fastest
first, the reference math last; `mh.register_backend(backend, before=...)` adds one.

    class Mine:
        name = "mine"
        capabilities = Capabilities(devices=("cpu",), dtypes=(torch.float32,), backward=False)
        def plan(self, p, auto=True): return None if p.form.intervals_only else NOT_MINE  # a Reason
        def run(self, p, plan): ...                 # p.q, p.k, p.v, p.form, p.scale, p.softcap, p.sinks
        def describe(self, p, plan): return "what it runs"
    mh.register_backend(Mine(), before="decode")
"""
from __future__ import annotations

from multihead.backends.banded import BandedBackend
from multihead.backends.decode.backend import DecodeBackend
from multihead.backends.flex import FlexBackend
from multihead.backends.decode.paged import PagedBackend
from multihead.backends.problem import Problem
from multihead.backends.decode.quantized import QuantizedBackend
from multihead.backends.reasons import Reason
from multihead.backends.reference import MathBackend
from multihead.backends.sdpa import SdpaBackend
from multihead.backends.sparse import SparseBackend
from multihead.backends.varlen import VarlenBackend

BUILTIN = (DecodeBackend(), QuantizedBackend(), PagedBackend(), SparseBackend(), VarlenBackend(), BandedBackend(),
           SdpaBackend(), FlexBackend(), MathBackend())

__all__ = ["BUILTIN", "Problem", "Reason"]
