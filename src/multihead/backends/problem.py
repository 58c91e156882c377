"""Problem: one validated attention call, the unit every backend receives; make_problem checks and builds it."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from multihead.backends.kv_forms import kv_form_of, resolved
from multihead.errors import AttentionError, check_flag, check_number, shape_str
from multihead.masks import Index, Mask, NormalForm
from multihead.masks.causal import causal_part
from multihead.masks.normal_form import EMPTY, normal_form

_CAUSAL = (causal_part(),)  # what causal=True adds to the mask's parts


@dataclass(eq=False, slots=True)
class Problem:
    """q (B, H, Lq, D), k (B, Hkv, Lk, D), v (B, Hkv, Lk, Dv); `form`, the mask's normal form (causal=True
    included; no parts without a mask).

    softcap: scores -> softcap * tanh(scores / softcap) before the mask, or None.
    sinks: (H,) logits joining each row's softmax denominator (carrying no value), or None.
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    form: NormalForm
    scale: float
    dropout: float
    softcap: float | None = None
    sinks: torch.Tensor | None = None
    kv_form: str = "dense"  # how k and v come (kv_forms.py): "dense" tensors, "quantized" codes and scales
    lse: bool = False  # the caller asked for the log-sum-exp too (attention(..., return_lse=True))
    grad: bool | None = None  # whether autograd needs a gradient, once asked (capabilities.needs_grad)

    @property
    def dims(self) -> tuple[int, int, int, int]:
        """(B, H, Lq, Lk)."""
        B, H, Lq, _ = self.q.shape
        return B, H, Lq, self.k.shape[-2]

    @property
    def gqa(self) -> bool:
        """Whether k/v have fewer heads than q; a plain bool even where shapes are traced or symbolic."""
        return True if self.k.shape[1] != self.q.shape[1] else False  # noqa: SIM210 (a branch, not bool())

    @property
    def softmax_dtype(self) -> torch.dtype:
        """The input dtype promoted to at least float32."""
        return torch.promote_types(self.q.dtype, torch.float32)

    def index(self, rows_may_shift: bool = False) -> Index:
        """The whole (B, H, Lq, Lk) grid, with the mask's per-sequence extents.

        rows_may_shift: the consumer's softmax has no sinks, so per-row constants may be dropped.
        """
        B, H, Lq, Lk = self.dims
        return self.form.index(B, H, Lq, Lk, self.q.device, rows_may_shift)

    def dense_mask(self, dtype=None):
        """(keep, bias) broadcastable to (B, H, Lq, Lk), each None when absent.

        bias is in `dtype`, by default the softmax dtype; with Mask.score_mod it is a function of the scores.
        """
        if len(self.form.parts) == 0:
            return None, None
        return self.form.score_terms(self.index(), dtype or self.softmax_dtype)


def make_problem(q, k, v, mask, causal, scale, dropout, softcap=None, sinks=None, lse: bool = False) -> Problem:
    """Check every input, fold `causal` and the mask into the normal form. Raises AttentionError.

    k and v are tensors, or both one of the forms of kv_forms.py (a quantized or paged cache's view), as
    kv_forms.resolved reads them (a prompt's fresh floats; pages gathered outside a decode step)."""
    if not isinstance(k, torch.Tensor):
        k, v = resolved(q, k, v)
    kv_form = kv_form_of(k)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) and (name == "q" or kv_form in (None, "dense") or kv_form_of(t) != kv_form):
            raise AttentionError(f"{name} must be a torch.Tensor of shape (B, H, L, D); got {type(t).__name__}.")
        if len(t.shape) != 4:
            raise AttentionError(f"{name} must have 4 dims (B, H, L, D); got shape {shape_str(t.shape)}.")
    if kv_form == "dense" and not (q.dtype == k.dtype == v.dtype):
        raise AttentionError(f"q, k, v must share one dtype; got {q.dtype}, {k.dtype}, {v.dtype}.")
    if not q.is_floating_point():
        raise AttentionError(f"q, k, v must be floating point; got {q.dtype}.")
    if not (q.device == k.device == v.device):
        raise AttentionError(f"q, k, v must be on one device; got {q.device}, {k.device}, {v.device}.")
    B, H, Lq, D = q.shape
    Bk, Hkv, Lk, Dk = k.shape
    if k.shape[:3] != v.shape[:3]:
        raise AttentionError(
            f"k and v must agree on (B, Hkv, Lk); got k {shape_str(k.shape)} and v {shape_str(v.shape)}."
        )
    if Bk != B:
        raise AttentionError(f"q has batch {B} but k/v have batch {Bk}.")
    if Dk != D:
        raise AttentionError(f"q and k must share the head dim D; got q D={D}, k D={Dk}.")
    if Hkv == 0 or H % Hkv:
        if q.shape[2] == k.shape[2] == v.shape[2] and Hkv:  # dim 2 agrees, dim 1 does not: heads there?
            raise AttentionError(
                f"q {shape_str(q.shape)} and k {shape_str(k.shape)} differ in dim 1 but agree in dim 2: this looks "
                f"like the (B, L, H, D) layout of a .view(B, L, H, D), with lengths {H} and {Hkv} in dim 1. "
                "mh.attention takes (B, H, L, D): call .transpose(1, 2) on q, k and v first. (If they are "
                f"(B, H, L, D), query heads H={H} must be a multiple of key/value heads Hkv={Hkv}.)"
            )
        raise AttentionError(
            f"query heads H={H} must be a multiple of key/value heads Hkv={Hkv} (grouped-query attention)."
        )
    if mask is not None and not isinstance(mask, Mask):
        raise AttentionError(
            f"mask must be a multihead.Mask; got {type(mask).__name__}. Say what your tensor means: "
            "Mask.keep(t) (True = attend), Mask.block(t) (True = blocked), Mask.additive(t) (float "
            "offsets), Mask.key_padding(t) (True = padding) or Mask.lengths(valid_lens)."
        )
    causal = causal is True or (causal is not False and check_flag(causal, "causal"))
    if mask is not None:
        mask.check(B, H, Lq, Lk, q.device)
    if scale is None:
        scale = 1.0 / math.sqrt(D) if D else 1.0
    elif type(scale) is not float or not 0.0 < scale < math.inf:  # the common float passes without a call
        check_number(scale, "scale", "a positive finite number", lambda x: 0 < x < math.inf)
    if type(dropout) is not float or not 0.0 <= dropout < 1.0:
        check_number(dropout, "dropout", "a probability in [0, 1)", lambda x: 0.0 <= x < 1.0)
    if softcap is not None:
        check_number(softcap, "softcap", "a positive finite number or None", lambda x: 0 < x < math.inf)  # NaN: False
        softcap = float(softcap)
    if sinks is not None:
        _check_sinks(sinks, H, q)
    if lse is not True and lse is not False:
        check_flag(lse, "return_lse")
    form = fold(mask, causal)
    return Problem(q, k, v, form, float(scale), float(dropout), softcap, sinks, kv_form, bool(lse))


def fold(mask: Mask | None, causal: bool) -> NormalForm:
    """The normal form of `mask` (checked) with causal=True's part added: the one fold of a call."""
    parts = () if mask is None else mask.parts
    if causal:
        parts = parts + _CAUSAL
    return normal_form(parts) if len(parts) else EMPTY


LAYOUTS = ("bhsd", "bshd")


def heads_first(q, k, v, layout: str):
    """q, k, v in the (B, H, L, D) layout the core works in: as they come for layout="bhsd", transposed from
    flash-attn's (B, L, H, D) for layout="bshd" (views, no copy)."""
    if layout == "bhsd":
        return q, k, v
    if layout != "bshd":
        raise AttentionError(f"layout must be one of {LAYOUTS} ((B, H, L, D) or (B, L, H, D)); got {layout!r}.")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor) or t.dim() != 4:
            raise AttentionError(f"layout='bshd' takes {name} as a tensor of shape (B, L, H, D); got "
                                 f"{shape_str(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__}.")
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


def _check_sinks(sinks, H: int, q: torch.Tensor) -> None:
    if not isinstance(sinks, torch.Tensor) or not sinks.is_floating_point():
        raise AttentionError(f"sinks must be a float tensor of shape (H={H},); got {sinks!r:.60}.")
    if tuple(sinks.shape) != (H,):
        raise AttentionError(f"sinks must have shape (H={H},); got {shape_str(sinks.shape)}.")
    if sinks.device != q.device:
        raise AttentionError(f"sinks are on {sinks.device} but q is on {q.device}.")
