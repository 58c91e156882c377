"""Input checks shared by the textbook classes.

The documents check their inputs with bare ``assert`` (or not at all). The textbook keeps each
document's computation as written, but turns bad input into a clear ``AttentionError`` that says what
was expected and what came. These checks only read shapes; they never change a valid computation.
"""

from __future__ import annotations

import torch

from multihead.errors import AttentionError, shape_str


def check_num_heads(num_heads: int) -> None:
    """Raise unless ``num_heads`` is a positive int."""
    if isinstance(num_heads, bool) or not isinstance(num_heads, int) or num_heads < 1:
        raise AttentionError(f"num_heads must be a positive int, got {num_heads!r}")


def check_heads_divide(total: int, num_heads: int, total_name: str) -> int:
    """Return the head size ``total // num_heads``; raise unless the heads split ``total`` evenly."""
    check_num_heads(num_heads)
    if total % num_heads != 0:
        raise AttentionError(
            f"{total_name}={total} must be divisible by num_heads={num_heads} "
            f"(each head gets {total_name} // num_heads features); "
            f"{total} % {num_heads} = {total % num_heads}"
        )
    return total // num_heads


def check_features(x: torch.Tensor, name: str, ndim: int, layout: str, features: int) -> None:
    """Raise unless ``x`` has ``ndim`` dims (named by ``layout``) and ``features`` in the last one."""
    if not isinstance(x, torch.Tensor):
        raise AttentionError(f"{name} must be a torch.Tensor {layout}, got {type(x).__name__}")
    if x.dim() != ndim or x.shape[-1] != features:
        raise AttentionError(
            f"{name} must have shape {layout} with last dim {features}, got {shape_str(x.shape)}"
        )


def check_same_dims(a: torch.Tensor, a_name: str, b: torch.Tensor, b_name: str,
                    dims: tuple[int, ...], what: str) -> None:
    """Raise unless ``a`` and ``b`` agree on every dim in ``dims`` (e.g. batch, or key length)."""
    if any(a.shape[d] != b.shape[d] for d in dims):
        raise AttentionError(
            f"{a_name} {shape_str(a.shape)} and {b_name} {shape_str(b.shape)} "
            f"must have the same {what}"
        )


def check_broadcasts(mask: torch.Tensor, target: tuple[int, ...], name: str, layout: str) -> None:
    """Raise unless ``mask`` broadcasts to exactly ``target`` (the scores it is applied to)."""
    if not isinstance(mask, torch.Tensor):
        raise AttentionError(f"{name} must be a torch.Tensor, got {type(mask).__name__}")
    try:
        fits = tuple(torch.broadcast_shapes(mask.shape, target)) == tuple(target)
    except RuntimeError:
        fits = False
    if not fits:
        raise AttentionError(
            f"{name} of shape {shape_str(mask.shape)} cannot broadcast to the scores "
            f"{layout} = {shape_str(target)}"
        )
