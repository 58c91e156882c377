"""The drop-in's errors: each is a multihead AttentionError *and* the type torch raises for the same input.

Code written against torch.nn.MultiheadAttention catches AssertionError or RuntimeError; code written
against multihead catches AttentionError. Both keep working:

    try:
        attn(query, key, value, attn_mask=mask)
    except AssertionError:      # or except mh.AttentionError: the same error
        ...
"""
from __future__ import annotations

from multihead.errors import AttentionError

__all__ = ["CompatAssertionError", "CompatPaddingMaskError", "CompatRuntimeError"]


class CompatAssertionError(AttentionError, AssertionError):
    """Bad input where torch.nn.MultiheadAttention raises AssertionError (shapes of inputs and masks)."""


class CompatRuntimeError(AttentionError, RuntimeError):
    """Bad input where torch.nn.MultiheadAttention raises RuntimeError (mask sizes, is_causal without a
    mask, dtypes), and torch.jit.script on a model holding the drop-in."""


class CompatPaddingMaskError(AttentionError):
    """A key_padding_mask of the wrong rank or size. torch raises AssertionError on its regular path and
    RuntimeError on its fused fast path (eval, no grad, self-attention) for the same mask; the drop-in raises
    the one for the path torch would take, a PaddingMaskAssertionError or a PaddingMaskRuntimeError, both of
    this class. (Being both types at once would be caught by the wrong handler: code that expects
    RuntimeError from one check and AssertionError from another, as torch's own tests do, tells them apart.)"""


class PaddingMaskAssertionError(CompatPaddingMaskError, CompatAssertionError):
    """A bad key_padding_mask where torch takes its regular path (training, grad, cross-attention, ...)."""


class PaddingMaskRuntimeError(CompatPaddingMaskError, CompatRuntimeError):
    """A bad key_padding_mask where torch takes its fused inference fast path."""
