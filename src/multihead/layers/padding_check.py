"""A warning for the padding mask that blocks everything: Hugging Face's attention_mask (1 = real token)
passed to Mask.key_padding (True = padding) blocks every key of each sequence that has no padding, and the
module then returns only out_proj's bias for those rows, silently.

``warn_if_all_keys_padded(module, mask)`` is called by MultiHeadAttention.forward. It reads the mask's
values only where that is free (a CPU tensor, eager: ``values_checkable``), never on an accelerator or
under torch.compile, so it costs no host sync. A module looks at the first LOOKS = 8 padding masks it is
given, then stops looking (a token mask passed as padding shows at once: with padding to the longest
sequence every batch has a sequence without padding), and warns at most once; Python shows a warning once
per call site by default, so a model whose layers share one mask warns once. Silence it with
``warnings.filterwarnings("ignore", category=AllKeysPaddedWarning)``.
"""
from __future__ import annotations

import os
import sys
import warnings
from pathlib import Path

import torch

from multihead.masks import Mask
from multihead.masks.values import values_checkable

LOOKS = 8            # padding masks a module examines before it stops looking (and after it warned)
LOOKED = "_padding_masks_looked_at"   # the count, in the module's __dict__
_QUIET_DIRS = tuple(str(Path(m.__file__).parent) + os.sep for m in (torch, sys.modules[__package__.partition('.')[0]]))  # skipped


class AllKeysPaddedWarning(UserWarning):
    """Mask.key_padding blocked every key of some sequence: likely a 1 = token mask passed as padding."""


def warn_if_all_keys_padded(module: torch.nn.Module, mask: object) -> None:
    """Warn when the key padding of `mask` (its normal form's keep of whole keys) blocks every key of some
    sequence; `module` looks at its first LOOKS padding masks only, and warns at most once."""
    if torch.compiler.is_compiling() or not isinstance(mask, Mask):
        return
    state = module.__dict__
    if state.get(LOOKED, 0) >= LOOKS:
        return
    keep = mask.normal_form().key_keep  # (B or 1, 1, 1, Lk), True = some query may see the key: the key-only terms
    if keep is None or not values_checkable(keep):
        return
    blocked = ~keep.reshape(keep.shape[0], -1).any(dim=-1)  # (B,): True where every key is padding
    if not bool(blocked.any()):
        state[LOOKED] = state.get(LOOKED, 0) + 1
        return
    state[LOOKED] = LOOKS  # warned: look no more
    rows = blocked.nonzero().flatten().tolist()
    warnings.warn(message(rows, keep.shape[0]), AllKeysPaddedWarning, stacklevel=_caller_level())


def message(rows: list[int], batch: int) -> str:
    """What probably happened, and what to write instead."""
    which = "every sequence" if len(rows) == batch else "sequence" + ("s " if len(rows) > 1 else " ") + \
        ", ".join(map(str, rows))
    return (f"Mask.key_padding blocks every key of {which} in this batch (True = padding): those queries attend "
            "to nothing, so their attention output is zero and the module returns only out_proj's bias there. "
            "This is probably a Hugging Face attention_mask (1 = real token, 0 = padding) passed as a padding "
            "mask, which also makes every other sequence attend to its padding alone; write "
            "mh.Mask.key_padding(attention_mask == 0) instead. (Warned once per module.)")


def _caller_level() -> int:
    """The stacklevel of the first frame outside torch and multihead: the line that called the module."""
    frame, level = sys._getframe(1), 1
    while frame is not None and frame.f_code.co_filename.startswith(_QUIET_DIRS):
        frame, level = frame.f_back, level + 1
    return level
