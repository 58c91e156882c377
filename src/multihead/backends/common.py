"""What every backend shares: the one masked-softmax reference, inert keys, exact zeros, the NaN-row rule.

Shapes: q (B, H, Lq, D), k (B, Hkv, Lk, D), v (B, Hkv, Lk, Dv); H a multiple of Hkv (GQA).

The reference math (a learner's attention, softmax in float32), written once:

    scores  = q @ k^T * scale                    (B, H, Lq, Lk), at least float32
    scores  = softcap * tanh(scores / softcap)   (only with softcap, Gemma 2)
    scores += bias  (or scores = fn(scores))     the mask's terms
    weights = masked_softmax(scores, keep, sink) blocked entries weigh exactly 0; a row that keeps no key
                                                 is all 0 (zero gradient); a sink logit joins the denominator
    out     = weights @ v                        (B, H, Lq, Dv)

math, attention_with_weights, capture, the decode step's torch form and the ring tiles all call it.
"""
from __future__ import annotations

import math
from dataclasses import replace

import torch
import torch.nn.functional as F

from multihead.backends.capabilities import needs_grad
from multihead.backends.cpu.build import kernel
from multihead.backends.graphs import recorded_graph
from multihead.backends.problem import Problem
from multihead.backends.reasons import cannot
from multihead.backends.sink_rescale import FLASH_CPU_DTYPES
from multihead.masks import Index, NormalForm
from multihead.masks.part import part_tensors

# Devices whose fused kernels return a NaN query row as zeros (they read a row whose scores are all NaN
# as a fully masked one): torch 2.13's CPU flash kernel given no mask, and its compiled CPU flex kernel.
# (sdpa_args.run_sdpa asks `q.is_cpu`, the cheap form of this question, on its hot path.)
LOSES_NAN_QUERIES = ("cpu",)


def repeat_kv(t: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(B, Hkv, L, D) -> (B, H, L, D): each kv head serves H // Hkv consecutive query heads."""
    groups = num_heads // t.shape[1]
    return t if groups == 1 else t.repeat_interleave(groups, dim=1)


def zero_where(where: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
    """t with exact zeros where `where` (broadcastable) is True, NaN included; one pass, grads blocked there."""
    return torch.where(where, torch.zeros((), dtype=t.dtype, device=t.device), t)


def connected_zeros(shape, dtype: torch.dtype, *tensors: torch.Tensor) -> torch.Tensor:
    """Exact zeros of `shape`, still connected to each of `tensors` (gradient 0), even where they hold NaN
    or inf, so that backward() reaches every input of a call that computed nothing."""
    yes = torch.ones((), dtype=torch.bool, device=tensors[0].device)
    zero = sum(zero_where(yes, t.reshape(-1)[:1]).sum() for t in tensors)  # 0-dim; an empty t sums to 0
    return zero.to(dtype).expand(shape)


def masked_softmax(scores: torch.Tensor, keep: torch.Tensor | None = None, sink: torch.Tensor | None = None,
                   with_lse: bool = False):
    """Softmax of `scores` (float, at least float32) over the last dim; entries where `keep` (broadcastable,
    True = kept) is False weigh exactly 0, and a row that keeps nothing is all 0 with zero gradient (NaN
    stored at blocked entries stays out). sink: logits broadcastable to scores[..., :1] that join each
    row's denominator and carry no value. with_lse: also return the log-sum-exp over the kept entries
    (and the sink), -inf for a row that keeps nothing."""
    blocked = None if keep is None else ~keep
    if sink is not None:
        sink = sink.expand(*scores.shape[:-1], 1)
    if with_lse:
        kept = scores if blocked is None else scores.masked_fill(blocked, float("-inf"))
        lse = torch.logsumexp(kept if sink is None else torch.cat([kept, sink], dim=-1), dim=-1)
    if blocked is not None:
        scores = scores.masked_fill(blocked, torch.finfo(scores.dtype).min)  # the safe fill: never NaN
    if sink is None:
        weights = torch.softmax(scores, dim=-1)
    else:
        weights = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
    if blocked is not None:
        weights = weights.masked_fill(blocked, 0.0)
    return (weights, lse) if with_lse else weights


def sink_alone(lse: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
    """lse (B, H, Lq) with each row that keeps no key (-inf) given its sink's logit, when there are sinks (H,):
    the denominator of such a row is its sink alone, which a merge with other keys must count."""
    if sinks is None:
        return lse
    return torch.where(lse == float("-inf"), sinks.to(lse.dtype).view(-1, 1), lse)


def scored(products: torch.Tensor, scale: float, softcap: float | None = None, bias=None) -> torch.Tensor:
    """The score pipeline, written once: q·k products (any float dtype, any shape) -> scores in at least float32,
    times `scale`, capped (softcap * tanh(s / softcap)), then biased (a tensor added, or a function of the
    scores: a mask with a score function). The masked softmax (`masked_softmax`) takes it from there; math, the
    plain-torch decode step, sparse, the quantized blockwise path and the ring tiles all read it."""
    scores = products.to(torch.promote_types(products.dtype, torch.float32)) * scale
    if softcap is not None:
        scores = softcap * torch.tanh(scores / softcap)
    if bias is not None:
        scores = bias(scores) if callable(bias) else scores + bias
    return scores


def reference_weights(q, k, keep=None, bias=None, scale: float = 1.0, softcap=None, sinks=None, with_lse: bool = False):
    """The reference attention weights (B, H, Lq, Lk) in at least float32, blocked entries exactly 0.

    q (B, H, Lq, D), k (B, Hkv, Lk, D). bias: added to the scaled scores, or a function scores -> scores
    (a mask with a score function). sinks: (H,) logits joining each row's denominator. with_lse: (weights,
    lse (B, H, Lq)), the log-sum-exp over the kept scores and the sink.
    """
    k = repeat_kv(k, q.shape[1])
    scores = scored(q @ k.transpose(-2, -1), scale, softcap, bias)  # (B, H, Lq, Lk)
    sink = None if sinks is None else sinks.to(scores.dtype).view(1, -1, 1, 1)
    return masked_softmax(scores, keep, sink, with_lse)


def inert_keys(form: NormalForm, ix: Index, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """k and v with every key that no query may see set to 0, so NaN or inf there never reaches the output."""
    visible = form.key_visible(ix)  # (B, 1, 1, Lk) or None
    if visible is None:
        return k, v
    hidden = ~visible.transpose(-1, -2)  # (B, 1, Lk, 1)
    return zero_where(hidden, k), zero_where(hidden, v)


def reference_on_grid(q, k, v, form: NormalForm, ix: Index, dropout: float, scale: float, softcap=None,
                      sinks=None, with_lse: bool = False):
    """The reference math on one grid (the whole call, a sequence's slice, a block of queries): q (B, H, Lq, D),
    k (B, Hkv, Lk, D), v (B, Hkv, Lk, Dv) -> (B, H, Lq, Dv). Keys no query may see are inert. Per-row
    constants are kept (a score function need not ignore them). with_lse: (out, lse (B, H, Lq) float32)."""
    if ix.rows_may_shift:
        ix = replace(ix, rows_may_shift=False)
    k, v = inert_keys(form, ix, k, v)
    keep, bias = form.score_terms(ix, torch.promote_types(q.dtype, torch.float32))
    weights = reference_weights(q, k, keep, bias, scale, softcap, sinks, with_lse)  # (B, H, Lq, Lk)
    if with_lse:
        weights, lse = weights
    if dropout:
        weights = F.dropout(weights, dropout)
    out = weights.to(v.dtype) @ repeat_kv(v, q.shape[1])
    return (out, lse.float()) if with_lse else out


def keep_nan_rows(out: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """`out` (B, H, Lq, Dv) with NaN in every row whose query (B, H, Lq, D) holds NaN or inf, as torch's math
    gives (for kernels that return such a row as zeros).

    Eager on the CPU, where no gradient is recorded: one pass of the compiled decode extension over q's rows,
    by address (nan_rows.h), writing only the rows that hold NaN; for other dtypes or layouts, or without the
    extension, one sum of q read on the host tells whether any row does. Otherwise, and under torch.compile
    or where autograd records, each row's sum times 0 is added (NaN where the row holds NaN or inf)."""
    if not torch.compiler.is_compiling() and q.is_cpu and not out.requires_grad:
        built, dtype = kernel(), q.dtype
        if (built is not None and (dtype is torch.float32 or dtype is torch.bfloat16) and out.dtype is dtype
                and q.stride(3) == 1 and out.is_contiguous()):
            built.keep_nan_rows(out, q)
            return out
        if math.isfinite(q.sum()):
            return out
    rows = q.sum(-1, keepdim=True)  # (.., Lq, 1)
    return out.add_(rows, alpha=0) if not out.requires_grad else torch.add(out, rows, alpha=0)


SOFTCAP = cannot("fused.softcap", "SDPA cannot apply softcap (tanh on the scores) inside the kernel")
SINKS = cannot("fused.sinks", lambda p: f"sinks need the kernel's log-sum-exp, and on {p.q.device.type} SDPA returns "
                                        "none (torch's CPU flash kernel does: sink_rescale.py)")
SINKS_DROPOUT = cannot("fused.sinks-dropout", "the CPU flash kernel that carries sinks has no dropout")
SINKS_HEAD_DIMS = cannot("fused.sinks-head-dims", lambda p: "the CPU flash kernel that carries sinks needs one head "
                                                            f"dim for q, k and v; got D={p.q.shape[-1]}, "
                                                            f"Dv={p.v.shape[-1]}")
SINKS_DTYPE = cannot("fused.sinks-dtype", lambda p: f"the CPU flash kernel that carries sinks takes float16, bfloat16, "
                                                    f"float32 and float64; got {p.q.dtype}")
SINKS_EXPORT = cannot("fused.sinks-export", "an exported or traced graph (torch.export, ONNX, torch.jit.trace) keeps "
                                            "sinks in the reference math: the ONNX form of the CPU flash kernel's "
                                            "log-sum-exp fails onnxruntime's shape inference, and a trace of its "
                                            "autograd function differs between two traces")
SINKS_MASK_GRAD = cannot("fused.sinks-mask-grad", "the mask's tensors need grad, and the CPU flash kernel that carries "
                                                  "sinks gives no gradient to its mask")


def sinks_unsupported(p: Problem):
    """Why SDPA's kernels cannot carry this problem's sinks (sink_rescale.py's CPU flash path), or None."""
    if p.q.device.type != "cpu":
        return SINKS
    if recorded_graph():
        return SINKS_EXPORT
    if p.dropout:
        return SINKS_DROPOUT
    if p.q.shape[-1] != p.v.shape[-1]:
        return SINKS_HEAD_DIMS
    if p.q.dtype not in FLASH_CPU_DTYPES:
        return SINKS_DTYPE
    if torch.is_grad_enabled() and any(t.requires_grad for part in p.form.parts for t in part_tensors(part)):
        return SINKS_MASK_GRAD
    return None


FLASH_LSE = cannot("sdpa.lse", lambda p: "the log-sum-exp comes from torch's CPU flash kernel: on the CPU, outside "
                                        "recorded graphs, without dropout or gradient, one head dim for q, k and v, "
                                        f"a float dtype; this call: {p.q.device.type}, D={p.q.shape[-1]}, "
                                        f"Dv={p.v.shape[-1]}, {p.q.dtype}, dropout={p.dropout}")


def flash_lse_unsupported(p: Problem):
    """Why torch's CPU flash kernel cannot give this problem's log-sum-exp (sink_rescale.flash_with_lse), or None."""
    if (p.q.device.type != "cpu" or recorded_graph() or p.dropout or p.q.shape[-1] != p.v.shape[-1]
            or p.q.dtype not in FLASH_CPU_DTYPES or needs_grad(p)):
        return FLASH_LSE
    return None


def score_variants_unsupported(p: Problem):
    """Why the fused SDPA kernels cannot compute this problem's score variants (softcap, sinks), or None."""
    if p.softcap is not None:
        return SOFTCAP
    if p.sinks is not None:
        return sinks_unsupported(p)
    return None
