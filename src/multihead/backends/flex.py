"""The FlexAttention backend: torch's flex_attention, with the mask as a mask_mod and a score_mod.

Flex asks for the mask one entry at a time, as functions of scalar indices. Every part of the mask
already is such a function (`Index.point` is the grid of one entry), so both come from the normal
form's parts:

    mask_mod(b, h, q_idx, kv_idx)        = AND of every part's keep          -> a BlockMask
    score_mod(score, b, h, q_idx, kv_idx) = softcap(score) + every part's bias

score is q . k * scale. The BlockMask (create_block_mask, blocks of 128 x 128) lets the kernel skip
every block that no query of it may see; it is built only over the batch rows and heads the keep
terms vary with. Keys no query may see are zeroed in k and v first (inert, as on every backend).

Sinks: flex also returns each row's log-sum-exp L over its keys. A sink logit s joins the softmax
denominator, so out_with_sink = out * e^L / (e^L + e^s) = out * sigmoid(L - s): exact, and its
gradient flows through L. Rows that keep no key come out of flex as exact zeros with L = -inf (so
the sink factor is 0 there too).

When "auto" picks it: flex_attention is a fused kernel only under torch.compile. Outside it, torch
runs an unfused implementation that materialises the (B, H, Lq, Lk) scores like the reference math,
with more overhead, so "auto" never picks it in eager mode, on any device. Under torch.compile it is
picked on CUDA only, and not where SDPA could run the call with no dense mask at all (is_causal or no
mask): SDPA's flash kernels win there. As this backend sits after SDPA, "auto" in practice reaches it
for the calls SDPA refuses (softcap, sinks), where the alternative is the reference math: on an H100
(bf16, B=4, H=16, L=4096, D=128, causal, softcap) compiled flex took 6.3 ms forward and backward, the
math 12.3 ms.

On the CPU, compiled flex with a block mask would be much faster than compiled SDPA with a dense mask
(measured here, 1 thread, H=8, D=64, causal, a window of 256, no_grad: SDPA / flex 1.38 at 512 keys, 2.3
at 1024, 8.8 at 4096), but "auto" does not pick it there: torch 2.13's compiled CPU kernel is
inference-only, takes no float64, and with dynamic shapes fails to build (a C++ error, an undeclared
`cur_qSplitSize` in the generated code) for some masks that nothing in their shapes tells apart: a
mask_mod reading a tensor (key padding, lengths), a bottom-right alignment, and a window combined with
chunks did; a window, chunks or causal alone did not. Asked for by name (backend="flex") under
torch.compile on the CPU it runs, with a score_mod that keeps the NaN contract (make_score_mod).

torch warns once per process that flex_attention ran without torch.compile. In eager mode that is
this backend working as described above (chosen by name, or to check results), and the warning's
advice (compile flex_attention itself) does not apply: a user who wants the fused kernel compiles
their own model. So run() filters that one warning around its own call, outside torch.compile only
(torch never warns there). torch then counts it as shown, so a later direct eager call of
flex_attention elsewhere in the process is not warned either.

What torch cannot do here (each is refused with its reason): a backward pass on CPU (flex_attention
refuses inputs that need grad there, eager or compiled), dropout, the log-sum-exp under torch.compile
on CPU (so no sinks there), and in the compiled GPU kernel head dims outside 16..256 or float64
(seen with torch 2.11 on an H100). Not refused, as no shape tells it: torch 2.13's compiled CPU kernel
fails to build (a C++ error) for some mask_mods when shapes are dynamic (see above), and takes no float64.
"""
from __future__ import annotations

import warnings
from typing import NamedTuple

import torch

from multihead.backends.capabilities import Capabilities
from multihead.backends.common import LOSES_NAN_QUERIES, inert_keys, score_variants_unsupported
from multihead.backends.problem import Problem
from multihead.backends.reasons import cannot, declines
from multihead.masks import Index, NormalForm

try:
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
except ImportError:  # torch without FlexAttention
    create_block_mask = flex_attention = None
try:
    from torch.nn.attention.flex_attention import AuxRequest
except ImportError:  # older torch: return_lse=True instead
    AuxRequest = None

NO_BACKWARD = ("cpu", "mps")  # devices where torch's flex_attention refuses inputs that need grad
COMPILED_HEAD_DIMS = (16, 256)  # torch.compile's GPU kernel: tl.dot needs 16; above 256 shared memory
# runs out (seen on an H100, forward and backward in bf16)
EAGER_WARNING = "flex_attention called without torch.compile"


def point_index(form: NormalForm, b, h, q_idx, kv_idx, Lq: int, Lk: int) -> Index:
    """The form's grid at entry (b, h, q_idx, kv_idx), with each sequence's extents."""
    return Index.point(b, h, q_idx, kv_idx, Lq, Lk, form.extents)


def make_mask_mod(form: NormalForm, Lq: int, Lk: int):
    """mask_mod(b, h, q_idx, kv_idx) -> bool: AND of every part's keep at that entry."""
    def mask_mod(b, h, q_idx, kv_idx):
        keep, _ = form.dense(point_index(form, b, h, q_idx, kv_idx, Lq, Lk))
        return keep

    return mask_mod


def make_score_mod(form: NormalForm | None, softcap: torch.Tensor | None, Lq: int, Lk: int, nan_as_inf: bool = False,
                   exact: bool = False):
    """score_mod(score, b, h, q_idx, kv_idx) -> softcap(score) + every part's bias at that entry.

    softcap is a 0-dim tensor on the inputs' device: a Python float captured here would become a
    symbolic number once its value changes between calls, which flex's backward cannot trace.
    nan_as_inf: a NaN score becomes +inf, so the row's softmax is NaN (inf - inf) as in torch's math; the
    compiled CPU kernel otherwise reads a NaN row as fully masked (zeros) and drops a NaN key's score.
    exact: the terms are summed in float64 and rounded once (eager flex, which is unfused anyway): a large
    bias (ALiBi far from its keys) then costs one rounding, as in the reference math, not two.
    """
    def score_mod(score, b, h, q_idx, kv_idx):
        if softcap is not None:
            score = softcap * torch.tanh(score / softcap)
        work = torch.float64 if exact else score.dtype
        if form is not None and form.scored:  # Mask.score_mod: every term in part order
            score = form.scores(score.to(work), point_index(form, b, h, q_idx, kv_idx, Lq, Lk)).to(score.dtype)
        elif form is not None:
            _, bias = form.dense(point_index(form, b, h, q_idx, kv_idx, Lq, Lk), work)
            score = (score.to(work) + bias).to(score.dtype)
        if nan_as_inf:
            score = torch.where(torch.isnan(score), float("inf"), score)
        return score

    return score_mod


class FlexForms(NamedTuple):
    block_mask: object | None  # a BlockMask of the keep terms; None when no part blocks anything
    adds_bias: bool  # some part adds to the scores (the score_mod must add the biases)


def flex_forms(form: NormalForm, B: int, H: int, Lq: int, Lk: int, device) -> FlexForms:
    """The form as Flex takes it. The BlockMask covers only the batch rows and heads that the keep
    terms vary over (the others broadcast); which those are is read from the shapes of the dense form."""
    if len(form.parts) == 0:
        return FlexForms(None, False)
    keep, bias = form.dense(form.index(B, H, Lq, Lk, device))
    if keep is None:
        return FlexForms(None, bias is not None or form.scored)
    rows, heads = ((1,) * (4 - keep.dim()) + tuple(keep.shape))[:2]
    block_mask = create_block_mask(make_mask_mod(form, Lq, Lk), B if rows > 1 else None, H if heads > 1 else None,
                                   Lq, Lk, device=device)
    return FlexForms(block_mask, bias is not None or form.scored)


def skipped_blocks(block_mask) -> float:
    """Fraction of the BlockMask's (query block, key block) pairs that the kernel skips (reads values)."""
    computed = block_mask.kv_num_blocks.sum()
    if block_mask.full_kv_num_blocks is not None:
        computed = computed + block_mask.full_kv_num_blocks.sum()
    return 1.0 - float(computed) / block_mask.kv_indices.numel()


def _flex(q, k, v, score_mod, block_mask, scale: float, gqa: bool, lse: bool):
    """torch's flex_attention: out (B, H, Lq, Dv), and with `lse` also the log-sum-exp (B, H, Lq)."""
    if not lse:
        extra = {}
    elif AuxRequest is not None:
        extra = {"return_aux": AuxRequest(lse=True)}
    else:
        extra = {"return_lse": True}
    result = flex_attention(q, k, v, score_mod, block_mask, scale, gqa, **extra)
    if lse and AuxRequest is not None:
        return result[0], result[1].lse
    return result


NOT_IN_TORCH = cannot("flex.not-in-torch", "this torch has no torch.nn.attention.flex_attention (it needs "
                                           "torch >= 2.5)")
HEAD_DIMS = cannot("flex.head-dims", lambda p: f"the compiled GPU flex kernel takes head dims from "
                                               f"{COMPILED_HEAD_DIMS[0]} to {COMPILED_HEAD_DIMS[1]}; got "
                                               f"D={p.q.shape[-1]}, Dv={p.v.shape[-1]}")
FLOAT64 = cannot("flex.float64", "the compiled GPU flex kernel has no float64")
CPU_LSE = cannot("flex.cpu-lse", "the compiled CPU flex kernel cannot return the log-sum-exp that sinks need")
CPU_DTYPES = (torch.float32, torch.float16, torch.bfloat16)  # what torch 2.13's compiled CPU flex kernel takes
CPU_DTYPE = cannot("flex.cpu-dtype", "the compiled CPU flex kernel takes float32, float16 and bfloat16")
EAGER = declines("flex.eager", "outside torch.compile flex_attention is unfused: it materialises the (B, H, Lq, Lk) "
                               "scores like the reference math, with more overhead")
NOT_CUDA = declines("flex.not-cuda", "under torch.compile it is picked on CUDA only (the CPU kernel is "
                                     "inference-only and fails to build for some masks)")
SDPA_FASTER = declines("flex.sdpa-faster", "SDPA runs this call with no dense mask; its flash kernels are faster")
PICKED_ON = ("cuda",)  # device types where "auto" picks it under torch.compile


def _sdpa_takes_it_plainly(form: NormalForm, ix: Index) -> bool:
    """Whether SDPA runs this mask with no dense mask at all (none, or a top-left causal term alone)."""
    if len(form.parts) == 0:
        return True
    return len(form.causal_on(ix)) > 0 and len(form.parts) == len(form.causal_parts)


class FlexBackend:
    """Plan: FlexForms (the BlockMask and whether a score_mod adds biases)."""

    name = "flex"
    capabilities = Capabilities(empty=False, dropout=False, no_backward_on=NO_BACKWARD)

    def plan(self, p: Problem, auto: bool = True):
        why = self._cannot(p)
        if why is not None:
            return why
        if auto:
            if not torch.compiler.is_compiling():
                return EAGER
            if p.q.device.type not in PICKED_ON:
                return NOT_CUDA
            if score_variants_unsupported(p) is None and _sdpa_takes_it_plainly(p.form, p.index()):
                return SDPA_FASTER
        B, H, Lq, Lk = p.dims
        return flex_forms(p.form, B, H, Lq, Lk, p.q.device)

    def _cannot(self, p: Problem):
        if flex_attention is None:
            return NOT_IN_TORCH
        device = p.q.device.type
        compiling = torch.compiler.is_compiling()
        D, Dv = p.q.shape[-1], p.v.shape[-1]
        lo, hi = COMPILED_HEAD_DIMS
        if compiling and device not in NO_BACKWARD and not lo <= min(D, Dv) <= max(D, Dv) <= hi:
            return HEAD_DIMS
        if compiling and device not in NO_BACKWARD and p.q.dtype == torch.float64:
            return FLOAT64
        if compiling and device == "cpu" and p.sinks is not None:
            return CPU_LSE
        if compiling and device == "cpu" and p.q.dtype not in CPU_DTYPES:
            return CPU_DTYPE
        return None

    def describe(self, p: Problem, forms: FlexForms) -> str:
        B, H, Lq, Lk = p.dims
        ix = p.index()
        parts = p.form.parts
        keeps = [part.describe() for part in parts if part.keep(ix) is not None]
        biases = [f"{part.describe()} bias" for part in parts if part.bias(ix, torch.float32) is not None]
        biases += [part.describe() for part in p.form.score_parts]
        scores = (["softcap"] if p.softcap is not None else []) + biases
        text = "torch.nn.attention.flex_attention"
        text += f", mask_mod = {' & '.join(keeps)}" if keeps else ", no mask_mod"
        text += f", score_mod = {' + '.join(scores)}" if scores else ", no score_mod"
        block_mask = forms.block_mask
        if block_mask is not None:
            Bm, Hm = block_mask.kv_indices.shape[:2]
            text += (f", BlockMask of {block_mask.BLOCK_SIZE[0]}x{block_mask.BLOCK_SIZE[1]} blocks over "
                     f"(B={Bm}, H={Hm}, Lq={Lq}, Lk={Lk}), {skipped_blocks(block_mask):.0%} of blocks skipped")
        if p.sinks is not None:
            text += ", sinks from the log-sum-exp"
        if p.gqa:
            text += ", enable_gqa=True"
        if not torch.compiler.is_compiling():
            text += " (eager: unfused, the scores are materialised)"
        return text

    def run(self, p: Problem, forms: FlexForms) -> torch.Tensor:
        k, v = inert_keys(p.form, p.index(), p.k, p.v)
        _, _, Lq, Lk = p.dims
        score_mod = None
        nan_as_inf = torch.compiler.is_compiling() and p.q.device.type in LOSES_NAN_QUERIES
        if p.softcap is not None or forms.adds_bias or nan_as_inf:
            softcap = p.softcap if p.softcap is None else torch.full((), p.softcap, dtype=p.softmax_dtype,
                                                                      device=p.q.device)
            score_mod = make_score_mod(p.form if forms.adds_bias else None, softcap, Lq, Lk, nan_as_inf,
                                       exact=not torch.compiler.is_compiling())
        q = p.q
        if torch.compiler.is_compiling():
            result = _flex(q, k, v, score_mod, forms.block_mask, p.scale, p.gqa, p.sinks is not None)
        else:
            # eager flex scores in the inputs' dtype, so a large bias rounds away in bf16 / fp16: it runs in the
            # softmax dtype, as the compiled kernel scores in float32 (eager flex is unfused either way)
            q, k, v = (t.to(p.softmax_dtype) for t in (q, k, v))
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message=EAGER_WARNING)
                result = _flex(q, k, v, score_mod, forms.block_mask, p.scale, p.gqa, p.sinks is not None)
        if p.sinks is None:
            return result.to(p.q.dtype)
        out, lse = result  # (B, H, Lq, Dv), (B, H, Lq)
        keep = torch.sigmoid(lse - p.sinks.to(lse.dtype).view(1, -1, 1))  # the share the sink leaves the keys
        return (out * keep.unsqueeze(-1).to(out.dtype)).to(p.q.dtype)
