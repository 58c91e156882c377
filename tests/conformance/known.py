"""Known defects of the core, and how to recognise them: none today.

The suite was written while issue 17's items 1-6 were still open, plus one defect it found itself (a
single padded query under Mask.lengths with query_lens); all are fixed and their tests hold the whole
contract. `known_defect` is how the property tests and campaign.py would set aside a failure that a
listed defect explains (and only such a failure), should one be listed again.
"""
from __future__ import annotations

import torch

from tests.conformance.cases import Case

LOW = (torch.bfloat16, torch.float16)
KNOWN: dict = {}  # every defect this suite found is fixed; a new one goes here with how to recognise it


def reason(item) -> str:
    return KNOWN[item]


def known_defect(case: Case, backend: str, mode: str, message: str) -> str | None:
    """The KNOWN entry that explains this failure, or None."""
    kinds = {s.kind for s in case.specs}
    if 4 in KNOWN and mode == "inference_mode" and "Inference tensors" in message:
        return KNOWN[4]
    if 3 in KNOWN and "additive" in kinds and "without overflow" in message:
        return KNOWN[3]
    if 2 in KNOWN and "alibi" in kinds and case.dtype in LOW and " off by " in message:
        return KNOWN[2]
    if "one_query" in KNOWN and case.Lq == 1 and any(s.kind == "lengths" and s.args.get("query") is not None
                                                     for s in case.specs) and backend in ("auto", "sdpa", "banded"):
        return KNOWN["one_query"]
    if "precision" in KNOWN and "additive" in kinds and case.dtype in LOW and " off by " in message:
        return KNOWN["precision"]
    return None
