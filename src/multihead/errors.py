"""The one exception every bad input raises, and the small checks that build its messages."""

import torch


class AttentionError(ValueError):
    """Bad input to multihead: the message says what was expected and what came."""


def shape_str(shape) -> str:
    """`(2, 7)` for a torch.Size or tuple, the form every error message uses."""
    dims = tuple(int(d) for d in shape)
    return "(" + ", ".join(map(str, dims)) + ("," if len(dims) == 1 else "") + ")"


def check_flag(value, name: str) -> bool:
    """`value` if it is a real bool; AttentionError for strings, numbers and tensors."""
    if isinstance(value, bool):
        return value
    if isinstance(value, torch.Tensor):
        raise AttentionError(f"{name} must be True or False; got a tensor of shape {shape_str(value.shape)}. "
                             "Per-row causal masks go in a Mask (Mask.keep / Mask.block).")
    raise AttentionError(f"{name} must be True or False; got {value!r} ({type(value).__name__}).")


def check_number(value, name: str, expected: str, ok) -> None:
    """AttentionError unless `value` is an int or float (never a bool or tensor) for which ok(value) holds."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
        raise AttentionError(f"{name} must be {expected}; got {value!r} ({type(value).__name__}).")
