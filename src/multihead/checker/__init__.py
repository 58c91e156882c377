"""`multihead check`: tell a learner whether their multi-head attention is right, and what is wrong.

    from multihead.checker import check
    report = check("my_attention.py:MyAttention", init={"d_model": 16, "num_heads": 4})
    report.passed, report.bug, report.topic, print(report)

Works without rich; only ``multihead.checker.cli`` (the terminal front end) imports it.
"""

from multihead.checker.catalogue import BUGS
from multihead.checker.report import CheckReport
from multihead.checker.run import check

__all__ = ["BUGS", "CheckReport", "check"]
