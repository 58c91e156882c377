"""Masks: one structured `Mask`, and one file per kind of part (each registers its constructors).

See mask.py for the design: every part knows its own forms, so backends never branch on kinds.
"""
from multihead.masks import (  # noqa: F401 (constructors)
    additive, alibi, causal, chunks, keep, lengths, mask_mod, score_mod, segments, window,
)
from multihead.masks.index import Index
from multihead.masks.mask import Mask, Part

__all__ = ["Index", "Mask", "Part"]
