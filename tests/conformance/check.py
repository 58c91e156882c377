"""Run one Case on the project's backends and compare with the float64 reference (values and gradients).

Tolerance (the 2x drift rule): 2 x the error of the same-dtype reference math against float64, plus one
rounding step of the dtype at the result's size and a small floor. Rows that keep no key must be
exactly 0, with exactly 0 gradient, whatever the tolerance.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

import multihead as mh
from multihead.errors import CannotRunError
from multihead.backends import BUILTIN
from multihead.backends.capabilities import DEFAULT
from tests.conformance.cases import Case
from tests.conformance.reference import build_mask, dense_terms, reference_attention

# every backend the package has that reads key and value tensors (the cases are tensors; the quantized and paged
# backends read a cache's codes or pages, tested against float64 in tests/test_core_lse.py, test_decode_paged.py and
# test_cache_pages.py), by name, and "auto", its own choice
BACKENDS = ("auto", *(b.name for b in BUILTIN if "dense" in getattr(b, "capabilities", DEFAULT).kv_forms))
MODES = ("grad", "no_grad", "inference_mode")
FLOOR = 1e-6
GRAD_STEPS = 4  # rounding steps of slack for gradients (see tolerance)
GRAD_FLOOR = 1e-5


@dataclass
class Outcome:
    """What one backend did with one case: 'ok', 'skip' (the backend refused it: message is the refusal's
    code) or 'fail'."""

    backend: str
    status: str
    message: str = ""


def tolerance(low: torch.Tensor, exact: torch.Tensor, dtype: torch.dtype, steps: int = 1,
              floor: float = FLOOR) -> float:
    """2 x |same-dtype reference - float64 reference| + `steps` rounding steps at the result's size + floor.

    The rounding steps keep a tiny case, whose reference drift is 0 by luck, from failing on one rounding.
    Gradients get 4: torch's fused CPU backward in bf16/fp16 rounds its intermediate products (dS, dP) to
    the dtype, where the reference math keeps them in float32 (measured: 3 steps on a plain 2 x 2 bf16 call,
    the same with raw F.scaled_dot_product_attention), and a floor of 1e-5: in float32 a kernel that sums
    in another order can land 1.5e-6 off where the reference's own drift is 5e-7 (measured).
    """
    if exact.numel() == 0:
        return floor
    drift = (low.double() - exact).abs().max().item()
    return 2 * drift + steps * torch.finfo(dtype).eps * exact.abs().max().item() + floor


def mode_context(mode: str):
    if mode == "no_grad":
        return torch.no_grad()
    if mode == "inference_mode":
        return torch.inference_mode()
    return contextlib.nullcontext()


class Expected:
    """The reference's values (and gradients, in grad mode) for one case, computed once for every backend."""

    def __init__(self, case: Case, mode: str):
        self.case, self.mode = case, mode
        q, k, v = case.inputs()
        c = case
        self.terms = dense_terms(c.specs, c.B, c.H, c.Lq, c.Lk)
        self.dead = ~self.terms[0].any(dim=-1)  # (B, H, Lq): rows that keep no key
        g = torch.Generator().manual_seed(c.seed + 2)
        self.upstream = torch.randn(c.B, c.H, c.Lq, c.D, generator=g, dtype=torch.float64)
        self.exact, self.exact_grads = self._run(q, k, v, torch.float64)
        low, low_grads = self._run(q, k, v, c.dtype)
        self.tol = tolerance(low, self.exact, c.dtype)
        # one rounding of the largest gradient too: dq and dk come from dP = dO v^T (rounded to the dtype
        # by torch's fused backward), which can be far larger than dq itself (measured: a 2 x 2 fp16 call
        # where raw F.scaled_dot_product_attention's dq is 3.5e-4 off with |dq| <= 0.012 and |dv| ~ 2)
        largest = max((g.abs().max().item() for g in self.exact_grads if g.numel()), default=0.0)
        floor = GRAD_FLOOR + torch.finfo(c.dtype).eps * largest
        self.grad_tols = [tolerance(a, b, c.dtype, steps=GRAD_STEPS, floor=floor)
                          for a, b in zip(low_grads, self.exact_grads)]

    def _run(self, q, k, v, dtype):
        c = self.case
        leaves = [t.detach().to(dtype).requires_grad_(self.mode == "grad") for t in (q, k, v)]
        out = reference_attention(*leaves, c.specs, softcap=c.softcap, sinks=c.sinks, dtype=dtype, terms=self.terms)
        grads = []
        if self.mode == "grad":
            grads = torch.autograd.grad((out.double() * self.upstream).sum(), leaves)
        return out.detach().double(), [g.double() for g in grads]


def run_backend(case: Case, backend: str, mode: str, expected: Expected, call=mh.attention) -> Outcome:
    """Call mh.attention (or `call`, e.g. a compiled wrapper of it) on the case with `backend` in `mode`;
    the mask is built in that mode too."""
    q, k, v = (t.requires_grad_(mode == "grad") for t in case.inputs())
    try:
        with mode_context(mode):
            mask = build_mask(case.specs)
            out = call(q, k, v, mask, softcap=case.softcap, sinks=case.sinks, backend=backend)
    except CannotRunError as e:  # the backend says it cannot compute this call exactly (a refusal's code)
        return Outcome(backend, "skip", e.code)
    except mh.AttentionError as e:
        return Outcome(backend, "fail", f"AttentionError: {e}")
    except Exception as e:  # noqa: BLE001 (any crash is a finding)
        return Outcome(backend, "fail", f"{type(e).__name__}: {e}")
    return compare(backend, out, (q, k, v), expected)


def compare(backend: str, out: torch.Tensor, leaves, expected: Expected) -> Outcome:
    """Values within tolerance, dead rows exactly 0; in grad mode the same for the gradients."""
    problems = []
    if out.dtype != expected.case.dtype or out.shape != expected.exact.shape:
        return Outcome(backend, "fail", f"got {out.dtype} {tuple(out.shape)}, expected {expected.case.dtype} "
                                        f"{tuple(expected.exact.shape)}")
    err = (out.detach().double() - expected.exact).abs()
    if err.numel() and not bool(err.max() <= expected.tol):  # NaN fails too
        problems.append(f"values off by {err.max().item():.3g} > tol {expected.tol:.3g}")
    if bool((out.detach()[expected.dead] != 0).any()):
        problems.append("a row that keeps no key is not exactly 0")
    if expected.mode == "grad" and out.requires_grad:
        try:
            grads = torch.autograd.grad((out.double() * expected.upstream).sum(), leaves)
        except RuntimeError as e:  # an input the output does not depend on: every backend stays connected
            return Outcome(backend, "fail", "; ".join(problems + [f"gradient: {e}"]))
        for name, g, g64, tol in zip("qkv", grads, expected.exact_grads, expected.grad_tols):
            gerr = (g.double() - g64).abs()
            if gerr.numel() and not bool(gerr.max() <= tol):
                problems.append(f"d{name} off by {gerr.max().item():.3g} > tol {tol:.3g}")
        if bool((grads[0][expected.dead] != 0).any()):
            problems.append("dq of a row that keeps no key is not exactly 0")
    elif expected.mode == "grad":
        problems.append("the output does not require grad")
    return Outcome(backend, "fail" if problems else "ok", "; ".join(problems))


def check_case(case: Case, mode: str = "grad", backends=BACKENDS) -> list[Outcome]:
    """Every backend's outcome on one case."""
    expected = Expected(case, mode)
    return [run_backend(case, b, mode, expected) for b in backends]
