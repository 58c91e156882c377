"""Role descriptions (``RoleAssignment.describe``: "qkv rows 0:16", "qkv rows viewed as (H=4, 3, D)[:, 0]",
"4 per-head Linears: ...", "W_DKV, then kv_norm") in the report's language: the layer names stay as written."""

from __future__ import annotations

import re

# (pattern, Chinese) applied in order to an English description
_ZH = (
    (re.compile(r" rows viewed as (\(.*?\))(\[.*?\])"), r" 的各行按 \1 排列后取 \2"),
    (re.compile(r" rows (\d+):(\d+)"), r" 的第 \1:\2 行"),
    (re.compile(r"^(\d+) per-head Linears: "), r"\1 个按头划分的 Linear："),
    (re.compile(r", then "), "，再经过 "),
)


def role_text(where: str, lang: str) -> str:
    """``where`` as the report shows it in ``lang`` ("en" or "zh")."""
    if lang != "zh":
        return where
    for pattern, replacement in _ZH:
        where = pattern.sub(replacement, where)
    return where
