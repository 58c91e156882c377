"""The sparse backend: Mask.sparse run over the listed keys only, never over the (Lq, Lk) grid.

Shapes: B batch, H heads, Hkv kv heads, Lq queries, Lk keys, K listed keys per query, D / Dv head dims;
N = Hkv when the lists are shared by every head, else H (then G = H // N query heads per list).

For a block of queries at a time, each query's K listed rows of k and v are gathered, (B, N, Lb, K, D),
and the softmax runs over those K: the other mask terms (causal, lengths, key padding, ALiBi, ...) are
evaluated at the gathered key positions (an Index whose keys are the lists), free slots and repeated
keys weigh 0. A decode step (at most KERNEL_ROWS queries) on the CPU without gradients, with no additive
term and one list for all heads, runs the C++ decode kernel, the queries folded into the batch: the step
reads K rows per query, not the context. Eager, the kernel reads the listed rows in place
(decode_listed.h), skipping -1 and repeated slots itself: the lists go as they are when the other terms
keep every listed key (decided from the normal form and the shapes, e.g. a bottom-right causal step at
the last position), else with -1 where a term blocks a slot. Under torch.compile torch gathers the kept
rows, compacted to the front (one index_select each for k and v), and the decode kernel's custom op runs
over the copies.

A prefill (more than KERNEL_ROWS queries) gathers K rows per query while the dense keep mask of the same
keys runs one fused SDPA call over the (Lq, Lk) grid; the gathers cost more per key, so "auto" runs the
sparse path for a prefill only up to PREFILL_UP_TO listed keys per query, measured per torch CPU
capability and dtype by benchmarks/sparse_prefill_boundary.py (results and the machine in
benchmarks/sparse-prefill-boundary.json: the largest K at which the sparse path was faster at every length
measured). A capability not measured uses the AVX512 entries.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from multihead.backends.capabilities import Capabilities, needs_grad
from multihead.backends.common import masked_softmax, scored, zero_where
from multihead.backends.graphs import recorded_graph
from multihead.backends.cpu.build import kernel
from multihead.backends.decode.step import decode_step, describe_step, kernel_build
from multihead.backends.problem import Problem
from multihead.backends.reasons import cannot, declines
from multihead.masks import Index
from multihead.masks.intervals import bounds

# (torch CPU capability, dtype) -> the most listed keys per query at which a sparse prefill beat the dense keep
# mask at every length measured (benchmarks/sparse-prefill-boundary.json)
PREFILL_UP_TO: dict[tuple[str, torch.dtype], int] = {
    ("AVX512", torch.float32): 16,
    ("AVX512", torch.bfloat16): 64,
}
CAPABILITY = torch.backends.cpu.get_cpu_capability()
GATHER_BUDGET = 1 << 24  # elements of one block's gathered rows, B · N · Lb · K · (D + Dv)
KERNEL_DTYPES = (torch.float32, torch.bfloat16)
KERNEL_ROWS = 4  # query rows per sequence up to which a call is a decode step (the C++ kernel's case)

NOT_SPARSE = cannot("sparse.no-lists", "the sparse backend runs masks with a Mask.sparse part", any_length=True)
SCORED = cannot("sparse.scored", "a score function (Mask.score_mod) needs the whole grid's positions")
LISTS_NOT_SMALLER = declines("sparse.lists-not-smaller", lambda p: f"each query lists K={_listed(p)} slots for "
                                                                   f"Lk={p.dims[3]} keys: the dense grid is no larger")


DENSER = declines("sparse.prefill-dense-faster", lambda p: f"a prefill listing K={_listed(p)} keys per query: above "
                   f"{prefill_up_to(p.q.dtype)} the dense keep mask of the same keys measured faster on {CAPABILITY}")


def prefill_up_to(dtype: torch.dtype) -> int:
    """The most listed keys per query at which "auto" runs a prefill (more than KERNEL_ROWS queries) sparse."""
    return PREFILL_UP_TO.get((CAPABILITY, dtype), PREFILL_UP_TO.get(("AVX512", dtype), 16))


def _listed(p: Problem) -> int:
    return p.form.sparse.indices.shape[-1]


@dataclass(frozen=True)
class SparsePlan:
    """Queries per gathered block, and whether the C++ decode kernel runs the step."""

    block: int
    kernel: bool


class SparseBackend:
    """Plan: SparsePlan."""

    name = "sparse"
    reads_values = False  # its plan reads shapes and the form's structure; run reads the mask's values
    capabilities = Capabilities(empty=False)

    def plan(self, p: Problem, auto: bool = True):
        if p.form.sparse is None:
            return NOT_SPARSE
        B, H, Lq, Lk = p.dims
        if p.form.scored:
            return SCORED
        K = _listed(p)
        if auto and K >= Lk:
            return LISTS_NOT_SMALLER
        if auto and Lq > KERNEL_ROWS and p.q.device.type == "cpu" and K > prefill_up_to(p.q.dtype):
            return DENSER
        lists = p.form.sparse.lists()
        N = p.k.shape[1] if lists.shape[1] == 1 else H
        per_query = max(1, B * N * K * (p.q.shape[-1] + p.v.shape[-1]))
        block = Lq if torch.compiler.is_compiling() else max(1, min(Lq, GATHER_BUDGET // per_query))
        kernel = (Lq <= KERNEL_ROWS and p.q.device.type == "cpu" and p.q.dtype in KERNEL_DTYPES and not p.dropout
                  and lists.shape[1] == 1 and p.form.slopes is None and not needs_grad(p)
                  and not recorded_graph() and p.k.stride(-1) == 1 and p.v.stride(-1) == 1)
        return SparsePlan(block, kernel)

    def keys_from(self, p: Problem, plan: SparsePlan, auto: bool) -> int:
        """The fewest keys from which `plan` serves this call: its block and kernel read no key length; "auto"
        leaves lists as long as the keys to the dense backends."""
        return _listed(p) + 1 if auto else 0

    def describe(self, p: Problem, plan: SparsePlan) -> str:
        K = _listed(p)
        isa = kernel_build(p.q.dtype)
        if plan.kernel and isa is not None:
            return (f"C++ decode kernel ({isa} build) over each query's K={K} listed rows, read in place (under "
                    "torch.compile gathered first), online softmax in fp32")
        if plan.kernel:
            return f"gathers each query's K={K} listed rows, then " + describe_step(p.q.dtype, "one query per row")
        return (f"gathers each query's K={K} listed keys and values, {plan.block} queries at a time; softmax in "
                "float32 over the K slots")

    def run(self, p: Problem, plan: SparsePlan) -> torch.Tensor:
        B, H, Lq, Lk = p.dims
        outs = []
        for start in range(0, Lq, plan.block):
            stop = min(Lq, start + plan.block)
            slots = _kernel_slots(p, start, stop) if plan.kernel and _reads_in_place(p, stop - start) else None
            if slots is not None:
                outs.append(_listed_in_place(p, start, stop, slots))
                continue
            pos, keep, bias = gathered_terms(p, start, stop)
            if plan.kernel and bias is None and keep.shape[1] == 1:
                outs.append(_kernel_step(p, start, stop, pos, keep))
            else:
                outs.append(_torch_block(p, start, stop, pos, keep, bias))
        return outs[0] if len(outs) == 1 else torch.cat(outs, dim=2)  # (B, H, Lq, Dv)


def gathered_terms(p: Problem, start: int, stop: int):
    """For queries [start, stop): pos (B, S, Lb, K) int64, the listed key of each slot (0 for free ones);
    keep (B, S or H, Lb, K) bool, the slots that count (listed, first of equal ones, kept by every other term);
    bias (B or 1, 1 or H, Lb, K) float32 or None. S is 1 (lists shared by heads) or H."""
    B, H, Lq, Lk = p.dims
    part = p.form.sparse
    lists = part.lists()[:, :, start:stop]
    lists = lists.expand(B, *lists.shape[1:]).sort(-1).values  # sorted: equal keys side by side
    first = F.pad(lists[..., 1:] != lists[..., :-1], (1, 0), value=True)  # the first slot of each key
    keep = (lists >= 0) & first
    pos = lists.clamp_min(0).long()
    others, bias = _other_terms(p, start, stop, pos)
    if others is not None:
        keep = keep & others
    return pos, keep, bias


def _other_terms(p: Problem, start: int, stop: int, pos: torch.Tensor):
    """(keep, bias) of every term but the lists, evaluated for queries [start, stop) at the listed keys pos
    (B, S, Lb, K) int64, as `NormalForm.dense` gives them (each None when no term has one)."""
    B, H, Lq, Lk = p.dims
    device = p.q.device
    ix = Index(None, None, torch.arange(start, stop, device=device).view(1, 1, -1, 1), pos, Lq, Lk, Lq, Lk,
               whole=False, plain=False, key_run=False, satisfied=(p.form.sparse,), device=device, B=B,
               H=H)  # b, h: made on use; the keys are the listed slots, not a run
    if p.form.extents is not None:
        q_lens, k_lens = p.form.extents
        ix = ix.with_extents(Lq if q_lens is None else ix.per_batch(q_lens), ix.per_batch(k_lens))
    return p.form.dense(ix, torch.float32)


def keeps_every_listed_key(p: Problem, start: int, stop: int) -> bool:
    """Whether the other terms keep every key for queries [start, stop), decided from the normal form and the
    shapes alone (no values read): each other part is a folded position term (causal, window, chunk) whose
    interval covers [0, Lk) for each of these rows, e.g. a bottom-right causal step's one query at the end."""
    form = p.form
    if form.extents is not None or any(part is not form.sparse and part not in form.positional for part in form.parts):
        return False
    if not len(form.positional):
        return True
    Lq, Lk = p.dims[2:]
    offset = 0 if form.align == "top_left" else Lk - Lq
    for i in range(start, stop):
        lo, hi = bounds(i + offset, left=form.left, right=form.right, chunk=form.chunk)
        if (lo is not None and lo > 0) or (hi is not None and hi < Lk):
            return False
    return True


def _reads_in_place(p: Problem, Lb: int) -> bool:
    """Whether the C++ kernel, which the plan chose (its dtypes), reads the listed rows in place for a block of
    Lb queries: eager, built, one sequence or one query per sequence."""
    return not torch.compiler.is_compiling() and not (p.dims[0] > 1 and Lb > 1) and kernel() is not None


def _kernel_slots(p: Problem, start: int, stop: int) -> torch.Tensor | None:
    """(B · Lb, K) int64: the lists of queries [start, stop) as the kernel reads them, -1 where another term
    blocks the slot (repeats and -1 the kernel skips itself); None when some term adds to the scores or keeps
    per head."""
    B, _, Lq, _ = p.dims
    Lb, indices = stop - start, p.form.sparse.indices
    if keeps_every_listed_key(p, start, stop):
        if (Lb == Lq and indices.shape[0] == B and indices.dtype is torch.long and indices.is_contiguous()
                and indices.numel() == B * Lq * indices.shape[-1]):  # the lists as they came: no op at all
            return indices.view(B * Lq, indices.shape[-1])
    lists = p.form.sparse.lists()[:, :, start:stop]  # (B or 1, 1, Lb, K)
    if not keeps_every_listed_key(p, start, stop):
        others, bias = _other_terms(p, start, stop, lists.clamp_min(0).long())
        if bias is not None or others is not None and others.shape[1] != 1:
            return None
        if others is not None:
            lists = torch.where(others, lists, -1)
    lists = lists.expand(B, 1, Lb, lists.shape[-1])
    return lists.reshape(B * Lb, lists.shape[-1]).to(torch.long).contiguous()


def _listed_in_place(p: Problem, start: int, stop: int, slots: torch.Tensor) -> torch.Tensor:
    """Queries [start, stop) by the C++ kernel reading each query's listed rows in place: (B, H, Lb, Dv)."""
    B, H, Lq, D = p.q.shape
    Lb = stop - start
    sinks = None if p.sinks is None else p.sinks.float().contiguous()
    if Lq == 1 and p.q.is_contiguous():  # a step of one query: q is the kernel's (B, H, 1, D) already
        return kernel().decode_listed(p.q, p.k, p.v, slots, None, sinks, p.scale, p.softcap or 0.0)
    q = p.q[:, :, start:stop].transpose(1, 2).reshape(B * Lb, H, 1, D)
    k, v = (t.expand(Lb, *t.shape[1:]) if Lb > 1 else t for t in (p.k, p.v))  # B = 1: one cache, Lb rows
    out = kernel().decode_listed(q.contiguous(), k, v, slots, None, sinks, p.scale, p.softcap or 0.0)
    return out.view(B, Lb, H, p.v.shape[-1]).transpose(1, 2)  # (B, H, Lb, Dv)


def _rows(t: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """t (B, Hkv, Lk, X) at the slots pos (B, S, Lb, K): (B, N, Lb, K, X), N = Hkv if S is 1, else S.

    One index_select over t's rows seen as a flat (rows, X) table (a view: t contiguous, or, eager and with
    no gradient recorded, rows a whole number of X apart), else advanced indexing (several times slower)."""
    B, Hkv, Lk, X = t.shape
    S, Lb, K = pos.shape[1:]
    N = Hkv if S == 1 else S
    sb, sh, sl, sx = t.stride()
    if t.is_contiguous():
        table = t.reshape(B * Hkv * Lk, X)
    elif (sx == 1 and sl == X and sb % X == 0 and sh % X == 0 and not torch.compiler.is_compiling()
          and not (torch.is_grad_enabled() and t.requires_grad)):
        span = ((B - 1) * sb + (Hkv - 1) * sh + Lk * sl) // X  # rows from t's first row to past its last one
        table = t.as_strided((span, X), (X, 1))
    else:
        return t[torch.arange(B, device=t.device).view(B, 1, 1, 1), _heads(Hkv, S, t.device).view(1, -1, 1, 1), pos]
    if t.is_contiguous():
        sb, sh = Hkv * Lk, Lk
    else:
        sb, sh = sb // X, sh // X
    if B * N == 1:  # one sequence, one kv head: the slots are the rows
        return table.index_select(0, pos.reshape(-1)).view(B, N, Lb, K, X)
    first = torch.arange(B, device=t.device).view(B, 1, 1, 1) * sb + _heads(Hkv, S, t.device).view(1, N, 1, 1) * sh
    return table.index_select(0, (first + pos).reshape(-1)).view(B, N, Lb, K, X)


def _heads(Hkv: int, S: int, device) -> torch.Tensor:
    """(N,) the kv head each list reads: all Hkv (lists shared by heads, S = 1), or query head h's, h // G."""
    return torch.arange(Hkv, device=device) if S == 1 else torch.arange(S, device=device) // (S // Hkv)


def _rows_of_both(k: torch.Tensor, v: torch.Tensor, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(k's rows, v's rows) at pos, as `_rows`; gathered once when v is k's first Dv features (MLA's absorbed
    step attends over [latent | rotary key] with the latents as values)."""
    ks = _rows(k, pos)
    if (not torch.compiler.is_compiling() and v.data_ptr() == k.data_ptr() and v.stride() == k.stride()
            and v.shape[:3] == k.shape[:3]):
        return ks, ks[..., :v.shape[-1]]
    return ks, _rows(v, pos)


def _grouped(t: torch.Tensor | None, N: int) -> torch.Tensor | None:
    """(B', 1 or H, Lb, K) -> (B', 1 or N, 1 or G, Lb, K)."""
    if t is None:
        return None
    B_, S, Lb, K = t.shape
    return t.view(B_, 1, 1, Lb, K) if S == 1 else t.view(B_, N, S // N, Lb, K)


def _torch_block(p: Problem, start: int, stop: int, pos, keep, bias) -> torch.Tensor:
    """Queries [start, stop) over their gathered rows, in torch ops: (B, H, Lb, Dv)."""
    B, H, _, D = p.q.shape
    ks, vs = _rows_of_both(p.k, p.v, pos)  # (B, N, Lb, K, D), (B, N, Lb, K, Dv)
    N = ks.shape[1]
    keep5 = _grouped(keep, N)
    vs = zero_where(~keep5.any(2)[..., None], vs)  # slots no head keeps: NaN stored there stays out
    q = p.q[:, :, start:stop].reshape(B, N, H // N, stop - start, D)  # (B, N, G, Lb, D)
    bias = None if bias is None else _grouped(bias.expand(bias.shape[0], bias.shape[1], *keep.shape[2:]), N)
    scores = scored(torch.einsum("bngld,bnlkd->bnglk", q, ks), p.scale, p.softcap, bias)
    sink = None if p.sinks is None else p.sinks.to(scores.dtype).view(1, N, H // N, 1, 1)
    weights = masked_softmax(scores, keep5, sink)  # (B, N, G, Lb, K); a row with no slot is all 0
    if p.dropout:
        weights = F.dropout(weights, p.dropout)
    out = torch.einsum("bnglk,bnlkd->bngld", weights.to(vs.dtype), vs)
    return out.reshape(B, H, stop - start, p.v.shape[-1])


def _kernel_step(p: Problem, start: int, stop: int, pos, keep) -> torch.Tensor:
    """Queries [start, stop) by the decode kernel's step over each query's kept rows, gathered by torch and
    compacted to the front (under torch.compile, or with no build to read them in place): (B, H, Lb, Dv).
    keep (B, 1, Lb, K)."""
    B, H, _, D = p.q.shape
    Lb, K = stop - start, pos.shape[-1]
    if torch.compiler.is_compiling() or not bool(keep.all()):  # eager, on the CPU: one host read
        order = torch.argsort((~keep).to(torch.uint8), dim=-1, stable=True)  # kept slots first, in key order
        pos = pos.gather(-1, order)
        count = keep.sum(-1).view(B * Lb, 1)  # (B · Lb, 1) kept rows per query
    else:  # every slot kept (distinct keys, all allowed): nothing to compact
        count = torch.full((B * Lb, 1), K, dtype=torch.long, device=pos.device)
    q = p.q[:, :, start:stop].transpose(1, 2).reshape(B * Lb, H, 1, D)
    ks, vs = (t.transpose(1, 2).reshape(B * Lb, p.k.shape[1], K, t.shape[-1])  # (B · Lb, Hkv, K, X)
              for t in _rows_of_both(p.k, p.v, pos))
    zeros = torch.zeros_like(count)
    out = decode_step(q, ks, vs, zeros, count, zeros.float(), p.scale, p.softcap, None, p.sinks)
    return out.view(B, Lb, H, p.v.shape[-1]).transpose(1, 2)  # (B, H, Lb, Dv)
