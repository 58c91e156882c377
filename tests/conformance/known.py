"""Known defects of the core (issue 17, items 2-6, and one the campaign found), how to recognise them.

After that branch merges, empty KNOWN and remove the xfail marks that cite these items: every test
then holds the whole contract. `known_defect` is how the property tests and campaign.py set aside a
failure that one of these explains (and only such a failure).
"""
from __future__ import annotations

import torch

from tests.conformance.cases import Case

LOW = (torch.bfloat16, torch.float16)
KNOWN = {
    1: "issue 17 item 1 (banded under torch.compile formats a symbolic length: a second length >= 2048 crashes)",
    2: "issue 17 item 2 (ALiBi in bf16/fp16 is built in the input dtype on the fast path), fixed on the core branch",
    3: "issue 17 item 3 (Mask.additive in bf16/fp16 crashes), fixed on the core branch",
    4: "issue 17 item 4 (a mask built in inference_mode breaks the memo), fixed on the core branch",
    5: "issue 17 item 5 (NaN in a query row comes back as 0 on sdpa), fixed on the core branch",
    "precision": ("issue 17 'Precision' (float biases summed and passed in the input dtype on the fast path), "
                  "fixed on the core branch"),
    "one_query": ("found by the conformance campaign, not in issue 17: with Lq = 1, Mask.only_key_blocks reads "
                  "Mask.lengths' query_lens as a key-only mask (the query dim has size 1), so sdpa does not zero a "
                  "padded query; reported to the core branch"),
    6: "issue 17 item 6 ((B, Lq) lengths let NaN past the lengths through), fixed on the core branch",
}


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
