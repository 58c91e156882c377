"""What an implementation actually runs: the kernels torch's dispatcher sees during one call.

The benchmark tables label each row with this instead of with what the code is believed to do: for
example nn.MultiheadAttention in eval mode under no_grad takes torch's native MHA kernel, not SDPA.
"""
from __future__ import annotations

from collections.abc import Callable

from torch.utils._python_dispatch import TorchDispatchMode

# top-level aten kernels that say how the attention itself is computed
ATTENTION_KERNELS = {
    "_scaled_dot_product_flash_attention_for_cpu": "SDPA CPU flash",
    "_scaled_dot_product_flash_attention": "SDPA flash",
    "_scaled_dot_product_efficient_attention": "SDPA efficient",
    "_scaled_dot_product_cudnn_attention": "SDPA cuDNN",
    "_native_multi_head_attention": "torch's native MHA kernel",
}
SCORE_KERNELS = ("bmm", "baddbmm")  # scores and weighted values as batched matrix products
SOFTMAX_KERNELS = ("_softmax", "_masked_softmax", "_safe_softmax")
GEMM_KERNELS = ("mm", "addmm")


class _Recorder(TorchDispatchMode):
    """Records the name of every aten kernel called at the top level while it is active."""

    def __init__(self):
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def kernels_called(fn: Callable[[], object]) -> list[str]:
    """The aten kernel names `fn()` calls, in order (one call of `fn`)."""
    with _Recorder() as rec:
        fn()
    return rec.names


def summarize(names: list[str]) -> str:
    """A short label such as "3 GEMMs + SDPA CPU flash" or "4 GEMMs + scores (bmm + softmax)"."""
    parts = []
    gemms = sum(n in GEMM_KERNELS for n in names)
    if gemms:
        parts.append(f"{gemms} GEMM" + ("s" if gemms > 1 else ""))
    attention = [ATTENTION_KERNELS[n] for n in dict.fromkeys(names) if n in ATTENTION_KERNELS]
    if attention:
        parts += attention
    elif any(n in SCORE_KERNELS for n in names) and any(n in SOFTMAX_KERNELS for n in names):
        parts.append("N^2 scores (bmm + softmax)")
    return " + ".join(parts) or "no attention kernel seen"


def what_runs(fn: Callable[[], object]) -> str:
    """`summarize(kernels_called(fn))`."""
    return summarize(kernels_called(fn))
