"""Masks: one structured `Mask`, one file per kind of part, and the normal form every backend reads.

part.py says what a part knows; normal_form.py what kernels take; intervals.py the one formula for
the keys a query keeps under causal, window, chunk and length terms.
"""
from multihead.masks.index import Index
from multihead.masks.mask import Mask
from multihead.masks.normal_form import NormalForm
from multihead.masks.part import Part

__all__ = ["Index", "Mask", "NormalForm", "Part"]
