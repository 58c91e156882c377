"""Masks: one structured `Mask`, one file per kind of part, and the normal form every backend reads.

part.py says what a part knows; normal_form.py what kernels take; intervals.py the one formula for
the keys a query keeps under causal, window, chunk and length terms.

A new kind of mask: one file here (a frozen dataclass Part: its check, keep or bias or score, describe, and
the one Fold call that says where it goes), a plain class method on Mask that builds it, and its tests
(tests/test_core_new_mask_kind.py is a whole kind in a test file). A kind kernels should take natively in a
way no slot expresses yet adds that slot: a field of NormalForm and a method of Fold.
"""
from multihead.masks.index import Index
from multihead.masks.mask import Mask
from multihead.masks.normal_form import NormalForm
from multihead.masks.part import Part

__all__ = ["Index", "Mask", "NormalForm", "Part"]
