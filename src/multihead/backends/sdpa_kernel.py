"""Which kernel torch's scaled_dot_product_attention picks for one call, and torch's reasons.

SDPA is one function in front of several kernels. On CPU torch runs its flash kernel or falls back to
the math composite; on CUDA it tries flash, memory-efficient and cuDNN in its priority order, then
math. `sdpa_kernel_report` asks torch the question SDPA itself asks (`torch._fused_sdp_choice`), and
for every fused kernel ranked before the one picked, collects the reason torch gives for passing it
over (torch's own debug warnings). Not for the hot path: it exists to describe a call.
Shapes: q (B, H, Lq, D), k (B, Hkv, Lk, D), v (B, Hkv, Lk, Dv).
"""
from __future__ import annotations

import re
import warnings

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from multihead.errors import AttentionError

WHAT_IT_IS = {
    SDPBackend.FLASH_ATTENTION: "flash attention",
    SDPBackend.EFFICIENT_ATTENTION: "memory-efficient attention",
    SDPBackend.CUDNN_ATTENTION: "cuDNN fused attention",
    SDPBackend.MATH: "the math composite, which builds the (B, H, Lq, Lk) scores",
    SDPBackend.OVERRIDEABLE: "the device's own fused kernel",
}
SHORT_NAMES = {
    SDPBackend.FLASH_ATTENTION: "flash",
    SDPBackend.EFFICIENT_ATTENTION: "efficient",
    SDPBackend.CUDNN_ATTENTION: "cuDNN",
    SDPBackend.MATH: "math",
    SDPBackend.OVERRIDEABLE: "overrideable",
}
# torch.backends.cuda's checks, one per fused CUDA kernel; each warns its reasons with debug=True
CUDA_CHECKS = {
    SDPBackend.FLASH_ATTENTION: "can_use_flash_attention",
    SDPBackend.EFFICIENT_ATTENTION: "can_use_efficient_attention",
    SDPBackend.CUDNN_ATTENTION: "can_use_cudnn_attention",
}
_TORCH_SOURCE = re.compile(r"\s*\(Triggered internally at .*\)\s*$", re.DOTALL)


def kernel_name(kernel: SDPBackend, device_type: str) -> str:
    """'CPU flash', 'flash', 'efficient', 'cuDNN', 'math' or 'overrideable'."""
    name = SHORT_NAMES.get(kernel, str(kernel))
    return "CPU flash" if kernel == SDPBackend.FLASH_ATTENTION and device_type == "cpu" else name


def chosen_kernel(q, k, v, attn_mask, is_causal, dropout, scale, enable_gqa) -> SDPBackend:
    """The kernel torch's SDPA will run for these arguments (raises torch's error when none can)."""
    choice = torch._fused_sdp_choice(q, k, v, attn_mask, dropout, is_causal, scale=scale,
                                     enable_gqa=enable_gqa)
    return SDPBackend(choice)


def _torch_words(text: str) -> str:
    """A torch message without the C++ source location torch appends to it."""
    return _TORCH_SOURCE.sub("", text).strip()


def _reasons(run) -> tuple[list[str], RuntimeError | None]:
    """The warnings torch emits while `run()` checks a kernel, and the error it raised (or None)."""
    error = None
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            run()
        except RuntimeError as err:  # "No available kernel": the reasons came as warnings before it
            error = err
    found = [_torch_words(str(w.message)) for w in caught]
    return [r for r in found if r and not r.endswith("not used because:")], error


def _cpu_flash_reasons(q, k, v, attn_mask, is_causal, dropout, scale, enable_gqa) -> list[str]:
    """Why the CPU flash kernel cannot run: torch's reasons, got by offering it flash alone."""
    if not torch.backends.cuda.flash_sdp_enabled():
        return ["it is disabled at run time (torch.nn.attention.sdpa_kernel or "
                "torch.backends.cuda.enable_flash_sdp(False))"]
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION]):
        return _reasons(lambda: torch._fused_sdp_choice(q, k, v, attn_mask, dropout, is_causal,
                                                        scale=scale, enable_gqa=enable_gqa))[0]


def _cuda_reasons(kernel: SDPBackend, q, k, v, attn_mask, is_causal, dropout, enable_gqa) -> list[str]:
    """Why a fused CUDA kernel cannot run, from torch.backends.cuda's check with debug=True."""
    check = getattr(torch.backends.cuda, CUDA_CHECKS[kernel], None)
    if check is None:
        return []
    params = torch.backends.cuda.SDPAParams(q, k, v, attn_mask, dropout, is_causal, enable_gqa)
    usable = []
    reasons, _ = _reasons(lambda: usable.append(check(params, True)))
    if usable and usable[0]:
        return ["it could run, but torch ranks the chosen kernel first for this call"]
    return reasons


def _device_type(q: torch.Tensor) -> str:
    """Where SDPA will run: 'cpu', 'cuda', ..."""
    return q.device.type


def _ranked_before(chosen: SDPBackend, device_type: str) -> list[SDPBackend]:
    """The fused kernels torch tries before `chosen` on this device, in its order."""
    if device_type == "cpu":
        order = [SDPBackend.FLASH_ATTENTION, SDPBackend.MATH]
    elif device_type == "cuda":
        order = [SDPBackend(i) for i in torch._C._get_sdp_priority_order()]
    else:
        return []
    tried = order[:order.index(chosen)] if chosen in order else order
    return [b for b in tried if b in CUDA_CHECKS]


def sdpa_kernel_report(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_mask: torch.Tensor | None,
                       is_causal: bool, dropout: float, scale: float | None, enable_gqa: bool) -> str:
    """One line: the SDPA kernel torch will pick for this call, and why the faster ones were passed over.

    q (B, H, Lq, D), k (B, Hkv, Lk, D), v (B, Hkv, Lk, Dv); the other arguments as SDPA takes them.
    For example "CPU flash (flash attention)", or "math (the math composite, ...); CPU flash not used:
    Both fused kernels do not support non-zero dropout." (torch's own words after "not used:").
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise AttentionError(f"{name} must be a torch.Tensor; got {type(t).__name__}.")
    if attn_mask is not None and not isinstance(attn_mask, torch.Tensor):
        raise AttentionError(f"attn_mask must be a torch.Tensor or None; got {type(attn_mask).__name__}.")
    args = (q, k, v, attn_mask, bool(is_causal), float(dropout), scale, bool(enable_gqa))
    device_type = _device_type(q)
    found: list[SDPBackend] = []
    reasons, error = _reasons(lambda: found.append(chosen_kernel(*args)))
    if error is not None:
        return f"no kernel: torch says {' '.join([_torch_words(str(error)), *reasons])}"
    chosen = found[0]
    line = f"{kernel_name(chosen, device_type)} ({WHAT_IT_IS.get(chosen, 'unknown kernel')})"
    for passed in _ranked_before(chosen, device_type):
        if device_type == "cpu":
            reasons = _cpu_flash_reasons(*args)
        else:
            reasons = _cuda_reasons(passed, q, k, v, attn_mask, bool(is_causal), float(dropout),
                                    bool(enable_gqa))
        why = " ".join(reasons) if reasons else "torch gives no reason"
        line += f"; {kernel_name(passed, device_type)} not used: {why}"
    return line
