"""A learner's token-sparse attention, checked as a function: ``multihead check FILE.py:function``.

Two kinds, told apart by the function's argument names (``sparse_kind``):

* sparse attention ``fn(q, k, v, indices)`` (or ``topk_indices``, ``idx``, ``selected``...): q (B, H, Lq, D),
  k and v (B, H, Lk, D), indices (B, Lq, K) int, the keys each query may see, -1 = a free slot. It is judged
  against ``attention(q, k, v, Mask.sparse(indices))``, outputs and gradients, on lists that are
  causal (query i lists keys <= i, the first queries with -1 slots) and on lists over a longer context
  (Lq < Lk); then, once it passes, with one key/value head shared by every query head (DeepSeek V3.2's
  absorbed attention), which it may refuse (the report says so). A key is never listed twice: a mask keeps
  it once, a gather over the slots counts it twice, and both conventions are met in the wild. Outputs that equal the reference with every -1 read as a real
  key name ``sparse-none-unmasked``: key Lk - 1 (torch's indexing wraps -1 to the last key) or key 0 (the
  indices clamped for the gather, the free slots never masked), kept once or counted per slot;
* top-k selection ``fn(index_scores, k)`` (or ``scores``, ``logits``; the count ``k``, ``topk``, ``top_k``,
  or none: then K is the output's width): scores (B, Lq, Lk) -> each query's K best keys, (B, Lq, K), in any
  order. Indices that equal a top-k over the queries or the batch instead of the keys name
  ``topk-wrong-axis``. A selection that passes is tried on causal scores (-inf after each query): the
  report notes whether it marks the slots it cannot fill with -1 or lists keys scored -inf.

Both run in float64 (float32 when the function only runs there) and build a ``CheckReport``.
"""

from __future__ import annotations

import inspect

import torch

from multihead.attention import attention
from multihead.checker.loading.calling import first_tensor, learner_frame
from multihead.checker.compare import relative_error
from multihead.checker.targets.functions import fill_extras
from multihead.checker.bugs.report import CheckReport
from multihead.checker.bugs.sentences import say
from multihead.masks import Mask

INDEX_NAMES = ("indices", "topk_indices", "top_k_indices", "topk_idx", "idx", "index", "selected",
               "selected_indices", "kv_indices", "sparse_indices")
SCORE_NAMES = ("index_scores", "scores", "index_logits", "logits", "index_score", "score")
COUNT_NAMES = ("k", "topk", "top_k", "index_topk", "n_selected", "num_selected", "K")
TOLERANCE = {torch.float64: 1e-6, torch.float32: 1e-4}  # relative, see compare.relative_error
B, H, D, K = 2, 4, 8, 4  # the attention probes' sizes


def _required(fn) -> list[inspect.Parameter]:
    return [p for p in inspect.signature(fn).parameters.values()
            if p.default is p.empty and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]


def sparse_kind(fn) -> str | None:
    """"attention" for ``fn(q, k, v, indices)``, "topk" for ``fn(index_scores[, k])``, else None."""
    names = [p.name for p in _required(fn)]
    if len(names) == 4 and names[-1] in INDEX_NAMES:
        return "attention"
    if names and names[0] in SCORE_NAMES and (len(names) == 1 or len(names) == 2 and names[1] in COUNT_NAMES):
        return "topk"
    return None


def check_sparse(fn, kind: str, report: CheckReport) -> CheckReport:
    """Judge ``fn`` (a ``sparse_kind``) and fill ``report``: PASS, a named id, or how it failed."""
    names = [p.name for p in _required(fn)]
    extras = fill_extras(fn, list(inspect.signature(fn).parameters.values()), set(names))
    report.kind = "sparse" if kind == "attention" else "topk"
    report.conventions = [(f"function:{report.kind}", {"call": fn.__name__, "args": ", ".join(names),
                                                        "indices": names[-1]})]
    judge = _judge_attention if kind == "attention" else _judge_topk
    try:
        judge(lambda *args: fn(*args, **extras), report, len(names))
    except Exception as error:  # the learner's code raised: its message and line
        report.verdict, report.exception = "fail", f"{type(error).__name__}: {error}"
        report.where = learner_frame(error)
    if report.passed:
        report.notes.insert(0, say(f"meaning:{report.kind}", report.lang, indices=names[-1]))
    return report


def causal_lists(Lq: int, Lk: int, gen: torch.Generator) -> torch.Tensor:
    """(B, Lq, K) lists with distinct keys: query i lists up to K of the keys j <= i + Lk - Lq (aligned
    bottom-right), in shuffled slots, -1 in the slots left over."""
    lists = torch.full((B, Lq, K), -1, dtype=torch.long)
    for b in range(B):
        for i in range(Lq):
            seen = i + Lk - Lq + 1
            keys = torch.randperm(seen, generator=gen)[:K]
            slots = torch.randperm(K, generator=gen)[:keys.numel()]
            lists[b, i, slots] = keys
    return lists


def _probes(dtype: torch.dtype, kv_heads: int = H) -> list[tuple[torch.Tensor, ...]]:
    """(q, k, v, indices) cases: self-attention over 8 tokens (the first queries have free slots), and 3
    queries over a context of 10 keys, two of whose lists leave slots free; k and v with ``kv_heads`` heads."""
    gen = torch.Generator().manual_seed(0)
    cases = []
    for Lq, Lk in ((8, 8), (3, 10)):
        q = torch.randn(B, H, Lq, D, generator=gen, dtype=dtype)
        k, v = (torch.randn(B, kv_heads, Lk, D, generator=gen, dtype=dtype) for _ in range(2))
        indices = causal_lists(Lq, Lk, gen)
        if Lq < Lk:  # free slots in lists that name neither key 0 nor key Lk - 1, where a -1 read as a key shows
            indices[0, -1], indices[1, 0] = torch.tensor([-1, 4, -1, 6]), torch.tensor([2, -1, 7, 5])
        cases.append((q, k, v, indices))
    return cases


def gathered(q, k, v, indices) -> torch.Tensor:
    """Attention over each query's K slots, one softmax term per slot (a gather of ``indices``, all real
    keys): (B, H, Lq, D)."""
    Bq, Hq, Lq, Dq = q.shape
    idx = indices[:, None, :, :, None].expand(Bq, Hq, Lq, indices.shape[-1], Dq)
    pick = lambda t: t.unsqueeze(2).expand(Bq, Hq, Lq, *t.shape[-2:]).gather(3, idx)  # noqa: E731 (B, H, Lq, K, D)
    weights = torch.softmax((q.unsqueeze(3) * pick(k)).sum(-1) * Dq ** -0.5, dim=-1)  # (B, H, Lq, K)
    return (weights.unsqueeze(-1) * pick(v)).sum(3)


def _judge_attention(fn, report: CheckReport, _: int) -> None:
    dtype = _runs_in(lambda case: fn(*case), _probes)
    tol = TOLERANCE[dtype]
    errors = [_judge_case(fn, case, report, tol) for case in _probes(dtype)]
    if report.exception:  # a wrong output shape
        report.verdict = "fail"
        return
    report.error = max(error for error, _ in errors)
    if report.error > tol:
        report.verdict = "fail"
        report.bug = "sparse-none-unmasked" if all(wrapped for _, wrapped in errors) else None
        return
    report.verdict = "fail" if report.grad_error > tol else "pass"
    try:  # one key/value head shared by every query head, as DeepSeek V3.2's absorbed attention has it
        shared = [_judge_case(fn, case, report, tol) for case in _probes(dtype, kv_heads=1)]
    except Exception:
        report.conventions.append(("sparse:kv-heads-equal", {}))
        return
    report.conventions.append(("sparse:kv-shared", {}))
    if max(error for error, _ in shared) > tol:
        report.verdict, report.error = "fail", max(error for error, _ in shared)


def _judge_case(fn, case, report: CheckReport, tol: float) -> tuple[float, bool]:
    """(relative error against Mask.sparse, whether the outputs are those of -1 read as a key) on one case;
    the gradient error (where the outputs match) goes into ``report``, a wrong output shape too."""
    q, k, v, indices = case
    q, k, v = (t.requires_grad_() for t in (q, k, v))
    got = first_tensor(fn(q, k, v, indices.clone()))
    if got.shape != q.shape:
        report.exception = (f"WrongOutputShape: returned shape {tuple(got.shape)} for q of shape "
                            f"{tuple(q.shape)}; expected the same shape")
        return float("inf"), False
    want = attention(q, k, v, Mask.sparse(indices))
    error = relative_error(got, want)
    wrapped = any(relative_error(got, other) <= tol for other in _free_slots_read(q, k, v, indices))
    if error <= tol:
        grad = torch.randn(got.shape, generator=torch.Generator().manual_seed(3), dtype=q.dtype)
        mine, theirs = (torch.autograd.grad(out, (q, k, v), grad, allow_unused=True) for out in (got, want))
        report.grad_error = max([report.grad_error or 0.0] + [
            relative_error(a if a is not None else torch.zeros_like(b), b) for a, b in zip(mine, theirs)])
    return error, wrapped


def _free_slots_read(q, k, v, indices):
    """The outputs of attention whose -1 slots read a real key: the last (torch's wrap) or the first (a
    clamp), kept once (a mask) or counted per slot (a gather)."""
    for real in (indices.remainder(k.shape[-2]), indices.clamp(min=0)):
        yield attention(q, k, v, Mask.sparse(real))
        yield gathered(q, k, v, real)


def _runs_in(call, cases) -> torch.dtype:
    """float64 when ``call`` runs on the float64 cases, else float32 (whose exception then propagates)."""
    try:
        call(cases(torch.float64)[0])
        return torch.float64
    except Exception:
        call(cases(torch.float32)[0])
        return torch.float32


def _judge_topk(fn, report: CheckReport, arguments: int) -> None:
    takes_count = arguments == 2
    scores = torch.randn(4, 5, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float64)  # (B, Lq, Lk)
    got = first_tensor(fn(scores, 3) if takes_count else fn(scores))
    count = 3 if takes_count else got.shape[-1]
    right = scores.topk(count, dim=-1).indices
    if _same_lists(got, right):
        report.verdict, report.error = "pass", 0.0
        _blocked_keys(fn, takes_count, report)
        return
    report.verdict = "fail"
    for dim in (1, 0):  # over the queries, over the batch: the lists run along dim, as topk leaves them
        counts = [3] if takes_count else sorted(set(got.shape))
        if any(c <= scores.shape[dim] and _same_lists(got, scores.topk(c, dim=dim).indices, dim)
               for c in counts):
            report.bug = "topk-wrong-axis"
            return
    if got.shape != right.shape:
        report.exception = (f"WrongOutputShape: returned shape {tuple(got.shape)} for scores of shape "
                            f"{tuple(scores.shape)}; expected {tuple(right.shape)}")
    else:
        report.reason = say("topk-differs", report.lang, count=count)


def _blocked_keys(fn, takes_count: bool, report: CheckReport) -> None:
    """On causal scores (-inf after each query), early queries have fewer than 3 keys: say whether the
    function marks the slots left with -1 (a convention line) or lists keys scored -inf (a note)."""
    scores = torch.randn(2, 6, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    scores = scores.masked_fill(torch.ones(6, 6, dtype=torch.bool).triu(1), float("-inf"))  # (B, L, L)
    try:
        picked = first_tensor(fn(scores, 3) if takes_count else fn(scores)).long()  # (B, L, K)
        blocked = scores.gather(-1, picked.clamp(min=0)) == float("-inf")
    except Exception:  # a selection that refuses -inf scores: nothing to say about them
        return
    if bool((blocked & (picked >= 0)).any()):
        report.notes.append(say("topk-lists-blocked", report.lang))
    elif bool((picked < 0).any()):
        report.conventions.append(("topk:marks-blocked", {}))


def _same_lists(got: torch.Tensor, want: torch.Tensor, dim: int = -1) -> bool:
    """Do ``got`` and ``want`` hold the same index lists, each in any order? ``want``'s lists run along
    ``dim``; ``got``'s along ``dim`` or along the last axis."""
    want = want.movedim(dim, -1).sort(-1).values
    for lists in (got.movedim(dim, -1), got) if got.dim() == want.dim() else ():
        if lists.shape == want.shape and torch.equal(lists.long().sort(-1).values, want):
            return True
    return False
