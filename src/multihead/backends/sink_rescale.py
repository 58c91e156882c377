"""Sinks on a fused kernel that returns the log-sum-exp: the output rescaled per row, with an exact backward.

A sink logit s (one per head) joins each row's softmax denominator and carries no value. A kernel that
returns its output o and its log-sum-exp L over the kept keys therefore gives the sink-aware output as

    w  = e^L / (e^L + e^s) = sigmoid(L - s)       (B, H, Lq), the share the sink leaves the keys
    o' = o * w                                    (B, H, Lq, Dv)

Backward, with g = dLoss/do', lse' = log(e^L + e^s) the log-sum-exp over the keys and the sink, and
P' = exp(S - lse') = P * w the sink-aware weights (P = exp(S - L) the kernel's own):

    dS = P' * (g v^T - rowsum(g * o'))            the softmax's backward over the keys and the sink (whose
                                                   value is 0, so it adds nothing to the row term)
    dV = P'^T g
    ds = -sum over batch and rows of rowsum(g * o') * (1 - w)      (H,)

dS and dV are exactly the kernel's own backward given lse' in the place of its log-sum-exp (it recomputes
P' from it) and o' in the place of its output (its delta term, rowsum(g * o')): one kernel call. (Equally,
grad_out = g * w with the kernel's own L gives the same; lse' spares that (B, H, Lq, Dv) product.)

A row that keeps no key has L = -inf (or the dtype's minimum), so w = 0: its output, the gradient it
sends into q, k and v, and its share of ds are all 0.

The kernel here is torch's CPU flash attention (`_scaled_dot_product_flash_attention_for_cpu` and its
backward), which takes GQA (fewer kv heads) and an additive float mask broadcastable to (B, H, Lq, Lk).
Shapes: q (B, H, Lq, D), k and v (B, Hkv, Lk, D), sinks (H,).
"""
from __future__ import annotations

import torch

FLASH_CPU_DTYPES = (torch.float32, torch.float64, torch.bfloat16, torch.float16)


def _rescaled(q, k, v, sinks, attn_mask, is_causal: bool, scale: float, shift):
    """torch's CPU flash kernel, its output rescaled by the sinks: (o' (B, H, Lq, D), lse (B, H, Lq) in at least
    float32, w (B, H, Lq) the share the sink leaves the keys, the sink logits per row in lse's dtype)."""
    out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, is_causal,
                                                                          attn_mask=attn_mask, scale=scale)
    sink = sinks.to(lse.dtype).view(1, -1, 1)  # (1, H, 1)
    if shift is not None:  # the mask's rows were moved down by `shift`, and lse with them: the sink moves too
        sink = sink - shift.squeeze(-1).to(lse.dtype)
    share = torch.sigmoid(lse - sink)
    return out * share.unsqueeze(-1).to(out.dtype), lse, share, sink


class _FlashWithSinks(torch.autograd.Function):
    """o' = o * sigmoid(lse - sink) from the CPU flash kernel; backward through the kernel's own backward."""

    @staticmethod
    def forward(ctx, q, k, v, sinks, attn_mask, is_causal: bool, scale: float, shift):
        final, lse, share, sink = _rescaled(q, k, v, sinks, attn_mask, is_causal, scale, shift)
        ctx.save_for_backward(q, k, v, attn_mask, final, torch.logaddexp(lse, sink), share)
        ctx.is_causal, ctx.scale, ctx.sinks_dtype = is_causal, scale, sinks.dtype
        return final

    @staticmethod
    def backward(ctx, grad):
        q, k, v, attn_mask, final, lse_with_sink, share = ctx.saved_tensors
        grad = grad.contiguous()
        grad_q = grad_k = grad_v = grad_sinks = None
        if any(ctx.needs_input_grad[:3]):  # the kernel's backward with P' = exp(S - lse'), g and o'
            grad_q, grad_k, grad_v = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward(
                grad, q, k, v, final, lse_with_sink, 0.0, ctx.is_causal, attn_mask=attn_mask, scale=ctx.scale)
        if ctx.needs_input_grad[3]:  # w (1 - w) = -dw/ds
            row = (grad.to(share.dtype) * final.to(share.dtype)).sum(-1)  # rowsum(g * o'), (B, H, Lq)
            grad_sinks = -(row * (1 - share)).sum(dim=(0, 2)).to(ctx.sinks_dtype)  # (H,)
        return grad_q, grad_k, grad_v, grad_sinks, None, None, None, None


def flash_with_sinks(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor,
                     attn_mask: torch.Tensor | None, is_causal: bool, scale: float,
                     shift: torch.Tensor | None = None) -> torch.Tensor:
    """Attention with per-head sink logits on torch's CPU flash kernel: (B, H, Lq, D), differentiable in q, k, v
    and sinks (H,). attn_mask: None, a bool keep mask or an additive float mask, broadcastable to
    (B, H, Lq, Lk); a mask that needs grad is not supported (its gradient is not computed). shift: (.., Lq, 1),
    a constant per row already subtracted from attn_mask (so that the kernel's scores stay small), which the
    sinks' comparison adds back."""
    attn_mask = _additive(attn_mask, q)
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad or sinks.requires_grad):
        return _FlashWithSinks.apply(q, k, v, sinks, attn_mask, is_causal, scale, shift)
    return _rescaled(q, k, v, sinks, attn_mask, is_causal, scale, shift)[0]  # nothing to differentiate: nothing saved


def flash_with_lse(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sinks: torch.Tensor | None,
                   attn_mask: torch.Tensor | None, is_causal: bool, scale: float,
                   shift: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(out (B, H, Lq, D), lse (B, H, Lq) float32) from torch's CPU flash kernel, sinks (H,) or None joining each
    row's denominator; lse over the kept scores and the sinks, in the scores' own frame (`shift` added back).
    No gradient (the kernel's log-sum-exp has no backward); attn_mask as in `flash_with_sinks`."""
    attn_mask = _additive(attn_mask, q)
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    if sinks is not None:
        out, lse, _, sink = _rescaled(q, k, v, sinks, attn_mask, is_causal, scale, shift)
        lse = torch.logaddexp(lse, sink)
    else:
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, is_causal,
                                                                              attn_mask=attn_mask, scale=scale)
    lse = lse.float()
    return out, lse if shift is None else lse + shift.squeeze(-1).float()


def _additive(attn_mask: torch.Tensor | None, q: torch.Tensor) -> torch.Tensor | None:
    """A bool keep mask as an additive one (-inf where blocked), in q's dtype; None stays None."""
    if attn_mask is not None and attn_mask.dtype == torch.bool:
        return torch.zeros((), dtype=q.dtype, device=q.device).expand_as(attn_mask).masked_fill(~attn_mask,
                                                                                                float("-inf"))
    if attn_mask is not None and attn_mask.dtype != q.dtype:
        return attn_mask.to(q.dtype)
    return attn_mask
