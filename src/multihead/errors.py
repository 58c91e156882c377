"""The one exception every bad input raises, and the small checks that build its messages."""

import torch


class AttentionError(ValueError):
    """Bad input to multihead: the message says what was expected and what came."""


class CannotRunError(AttentionError):
    """The backend asked for by name cannot compute this call exactly. `backend` names it and `code` is the
    stable reason code (e.g. "decode.grad") that mh.dispatch also reports."""

    def __init__(self, message: str, *, backend: str, code: str):
        super().__init__(message)
        self.backend, self.code = backend, code


class KeywordError(AttentionError, TypeError):
    """A keyword multihead does not take (often torch's name for one it does): a TypeError, as Python
    raises for unknown keywords, and an AttentionError whose message points to the right one."""


TORCH_KEYWORDS = {
    "attn_mask": "mask=Mask.block(attn_mask) for torch's bool mask (True = blocked), or "
                 "mask=Mask.additive(attn_mask) for a float one",
    "key_padding_mask": "mask=Mask.key_padding(key_padding_mask) (True = padding, as in torch)",
    "is_causal": "causal=True",
    "need_weights": "mh.capture_attention(model) to record the attention weights",
    "average_attn_weights": "mh.capture_attention(model) to record the attention weights",
}


def torch_keyword_error(who: str, names) -> KeywordError:
    """The error for torch.nn.MultiheadAttention keywords passed to multihead: what to write instead."""
    hints = [f"{name}=... -> {TORCH_KEYWORDS[name]}" for name in names if name in TORCH_KEYWORDS]
    unknown = [name for name in names if name not in TORCH_KEYWORDS]
    text = f"{who} got unexpected keyword argument(s) {', '.join(map(repr, names))}."
    if hints:
        text += (" These are torch.nn.MultiheadAttention's keywords; here masks are a multihead.Mask: "
                 + "; ".join(hints) + ". For torch's exact signature use multihead.compat.MultiheadAttention.")
    if unknown:
        text += " It takes query, key, value, and the keywords mask, causal, cache and positions."
    return KeywordError(text)


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


def check_hidden(x, embed_dim: int, weight: torch.Tensor) -> None:
    """AttentionError unless x is a (B, L, embed_dim) tensor of the dtype and on the device of `weight`."""
    if not isinstance(x, torch.Tensor) or x.dim() != 3 or x.shape[-1] != embed_dim:
        got = shape_str(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise AttentionError(f"x must be (B, L, E={embed_dim}); got {got}.")
    if x.dtype != weight.dtype or x.device != weight.device:
        raise AttentionError(f"x is {x.dtype} on {x.device} but the module's parameters are {weight.dtype} "
                             f"on {weight.device}; convert one of them with .to().")
