"""A module with a KV cache: a prompt, then one token at a time, must give the rows of its full forward.

How the checker drives a learner's cache (the smallest protocol that covers the common forms):

- ``forward(x, past_kv=None, use_cache=False)`` (or ``past_key_value``, ``layer_past``, ``kv_cache``,
  ``cache``...) returning ``(y, present)`` or ``(y, weights, present)``: the last item that is not None is
  passed back as the next call's past;
- ``new_cache(B, max_len)`` (or ``new_cache()``) giving an object that ``forward(x, cache=...)`` fills in
  place;
- ``reset_cache()`` with ``forward(x, use_cache=True)``: the module keeps its cache itself;
- ``forward(x, cache=None)`` returning only the output: the checker passes one empty dict, which the forward
  fills in place (``cache["k"] = k``) and reads on the next call.

After a PASS of the full causal forward, the checker runs a prompt of ``PROMPT`` tokens, then ``STEPS``
single tokens, and compares the rows with the full forward's. When they differ, the catalogue's cached
variants name the bug: positions restarting at 0 in every call (RoPE off by the prompt), or a causal mask
aligned top-left in a step (a lone new query sees only key 0).
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass

import torch

from multihead.checker.loading.calling import CallSpec, LearnerError, attention_inputs, first_tensor, invoke, learner_frame
from multihead.checker.bugs.catalogue import reference_variant
from multihead.checker.compare import relative_error
from multihead.checker.loading.probes import inputs
from multihead.checker.bugs.sentences import say

PAST_NAMES = ("past_kv", "past_key_value", "past_key_values", "layer_past", "past", "kv_cache", "cache")
FLAG_NAMES = ("use_cache",)
RESET_NAMES = ("reset_cache", "clear_cache")
PROMPT, STEPS = 4, 3
CACHED_BUGS = ("cache-positions-not-offset", "cache-causal-top-left")


@dataclass
class CacheDriver:
    """How to drive one module's cache: the forward parameter that takes it, the flag that turns it on,
    and the module's own ``new_cache`` / ``reset_cache`` methods (each None when absent)."""

    past: str | None
    flag: str | None
    new: object = None
    reset: object = None

    @property
    def name(self) -> str:
        """How the report names the protocol: ``past_kv``, ``new_cache + cache``, ``reset_cache + use_cache``."""
        parts = [f"{method.__name__}()" for method in (self.new, self.reset) if method is not None]
        return " + ".join(parts + [name for name in (self.past, self.flag) if name])


def find_driver(module) -> CacheDriver | None:
    """The module's cache protocol (module docstring), or None when it has none the checker knows."""
    try:
        params = inspect.signature(module.forward).parameters
    except (TypeError, ValueError):
        return None
    past = next((name for name in params if name.lower() in PAST_NAMES), None)
    flag = next((name for name in params if name.lower() in FLAG_NAMES), None)
    new = getattr(module, "new_cache", None)
    reset = next((getattr(module, n) for n in RESET_NAMES if callable(getattr(module, n, None))), None)
    if past is None and not (flag and reset):
        return None
    return CacheDriver(past, flag, new if callable(new) else None, reset)


def _new_state(driver: CacheDriver, batch: int, max_len: int):
    if driver.new is None:
        return None
    try:
        return driver.new(batch, max_len)
    except TypeError:
        return driver.new()


def run_cached(module, driver: CacheDriver, x: torch.Tensor, prompt: int, in_place: bool = False):
    """x (B, L, E): the prompt x[:, :prompt], then one token at a time through the cache; rows (B, L, O).
    None when the forward hands nothing back to continue from (no cache object, no present). ``in_place``:
    the forward is given one empty dict that it fills itself (``cache["k"] = k``), the same dict every call."""
    if driver.reset is not None:
        driver.reset()
    state = {} if in_place else _new_state(driver, x.shape[0], x.shape[1])
    rows = []
    for chunk in _chunks(x, prompt):
        kwargs = {driver.flag: True} if driver.flag else {}
        if driver.past:
            kwargs[driver.past] = state
        out = module(chunk, **kwargs)
        if driver.past and driver.new is None and not in_place:  # (y, present) or (y, weights, present)
            handed = [item for item in out[1:] if item is not None] if isinstance(out, (tuple, list)) else []
            if not handed:
                return None
            state = handed[-1]
        rows.append(first_tensor(out))
        if in_place and not state:  # the forward left the dict empty: it keeps no cache there
            return None
    if driver.reset is not None:
        driver.reset()
    return torch.cat(rows, dim=1)


def _chunks(x: torch.Tensor, prompt: int) -> list[torch.Tensor]:
    """The prompt x[:, :prompt], then one token at a time, each contiguous as a decode loop passes it."""
    return [x[:, :prompt].contiguous()] + [x[:, t:t + 1].contiguous() for t in range(prompt, x.shape[1])]


def cached_variant(weights, x: torch.Tensor, prompt: int, mistake: str | None, options=None) -> torch.Tensor:
    """The reference's rows for a prompt then single steps, with one cached mistake (or None): the step's
    positions restarting at 0 (``cache-positions-not-offset``), or a top-left causal mask in a step
    (``cache-causal-top-left``); ``options``: what the module was found to use (options.py).
    x (B, L, E) -> (B, L, O)."""
    rows = [reference_variant(x[:, :prompt], x[:, :prompt], x[:, :prompt], weights, None, causal=True,
                              options=options)]
    for t in range(prompt, x.shape[1]):
        seen = x[:, : t + 1]  # (B, t+1, E): the cached keys and the new one
        keys_at = torch.arange(t + 1)
        query_at = torch.tensor([t])
        if mistake == "cache-positions-not-offset":  # every step's token was turned at position 0
            keys_at, query_at = torch.cat((torch.arange(prompt), torch.zeros(t + 1 - prompt, dtype=torch.long))), \
                torch.zeros(1, dtype=torch.long)
        rows.append(reference_variant(x[:, t:t + 1], seen, seen, weights, None, causal=mistake == "cache-causal-top-left",
                                      positions=(query_at, keys_at), options=options))
    return torch.cat(rows, dim=1)


def check_cached(module, spec: CallSpec, roles, tol: float, report) -> None:
    """After a PASS: a module with a cache must give its full forward's rows step by step; otherwise FAIL,
    naming the cached mistake whose variant gives the learner's rows (report changed in place)."""
    driver = find_driver(module)
    if driver is None or not spec.causal or spec.inputs != "x" or spec.layout != "batch" or spec.mask_required:
        return
    dtype = next((p.dtype for p in module.parameters()), torch.float64)
    x = inputs((spec_width(roles, module),) * 3, 2, PROMPT + STEPS, PROMPT + STEPS, dtype, 30)[0]
    with torch.no_grad():
        try:
            full = invoke(module, spec, x)
        except LearnerError:  # e.g. longer than its context length: nothing to compare with
            return
        try:
            got = run_cached(module, driver, x, PROMPT)
            if got is None and driver.past and driver.new is None:  # a dict the forward fills in place?
                got = run_cached(module, driver, x, PROMPT, in_place=True)
        except Exception as error:  # the learner's cached call raised
            report.verdict, report.error = "fail", None
            report.reason = say("cache-raises", report.lang, protocol=driver.name,
                                error=f"{type(error).__name__}: {error}", where=learner_frame(error))
            return
    if got is None or got.shape != full.shape:
        return
    report.conventions.append(("cache", {"protocol": driver.name, "prompt": PROMPT, "steps": STEPS}))
    error = relative_error(got, full)
    if error <= tol:
        return
    alone = torch.cat([invoke(module, spec, chunk) for chunk in _chunks(x, PROMPT)], dim=1)
    if relative_error(got, alone) <= tol:  # each call as if nothing were cached: the cache is not read
        report.conventions[-1] = ("cache:unused", {"protocol": driver.name})
        return
    report.verdict, report.error = "fail", error
    weights = roles.weights(module)
    with torch.no_grad():
        seen = attention_inputs(spec, x, x, x)[0]  # through the module's own layer before its projections
        for mistake in CACHED_BUGS:
            if mistake == "cache-positions-not-offset" and weights.rope is None:
                continue  # without RoPE positions change nothing
            if relative_error(got, cached_variant(weights, seen, PROMPT, mistake, spec.options)) <= tol:
                report.bug = mistake
                return
    rows = [i for i in range(got.shape[1]) if relative_error(got[:, i], full[:, i]) > tol]
    report.reason = say("cache-differs", report.lang, protocol=driver.name, prompt=PROMPT, row=rows[0] + 1,
                        error=error)


def spec_width(roles, module) -> int:
    """The input width E the query projection reads."""
    return roles.weights(module).q[0].shape[1]
