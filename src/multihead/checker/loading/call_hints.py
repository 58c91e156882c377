"""``--call`` hints: what to take as given instead of detecting it.

Format: comma-separated ``key=value`` pairs, e.g. ``"heads=4,layout=seq,causal=no,inputs=qkv,mask=keep"``.
heads: number of heads; layout: batch | seq; causal: yes | no; inputs: x | qkv | q_kv; mask: the
caller's mask convention, a claim the module must keep (``mask_meaning.CLAIMS``): keep (True/1 = may
attend), block (True/1 = blocked), additive (added to the scores), lengths (valid lengths), key_padding
((B, Lk), True = padding).
"""

from __future__ import annotations

from dataclasses import dataclass

from multihead.checker.loading.calling import CallSpec
from multihead.checker.loading.learner_file import LoadError

_CHOICES = {"layout": ("batch", "seq"), "causal": ("yes", "no"), "inputs": ("x", "qkv", "q_kv"),
            "mask": ("keep", "block", "additive", "lengths", "key_padding")}


@dataclass
class Hints:
    heads: int | None = None
    layout: str | None = None
    causal: bool | None = None
    inputs: str | None = None
    mask: str | None = None  # the caller's mask convention (a claim), one of _CHOICES["mask"]


def parse_hints(text: str | None) -> Hints:
    """Hints from ``"key=value,..."``; unknown keys or values raise LoadError saying what is allowed."""
    if not isinstance(text, (str, type(None))):
        raise LoadError(f"--call expects text like 'heads=4,layout=seq', got {type(text).__name__}",
                        f"--call 应是类似 'heads=4,layout=seq' 的文本，实际是 {type(text).__name__}")
    hints = Hints()
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep:
            raise LoadError(f"--call expects key=value pairs, got {item!r}",
                            f"--call 需要 键=值 的形式，实际是 {item!r}")
        if key == "heads":
            if not value.isdigit() or int(value) < 1:
                raise LoadError(f"--call heads must be a positive integer, got {value!r}",
                                f"--call heads 必须是正整数，实际是 {value!r}")
            hints.heads = int(value)
        elif key in _CHOICES:
            if value not in _CHOICES[key]:
                choices = ", ".join(_CHOICES[key])
                raise LoadError(f"--call {key} must be one of {choices}, got {value!r}",
                                f"--call {key} 只能是 {choices} 之一，实际是 {value!r}")
            setattr(hints, key, value == "yes" if key == "causal" else value)
        else:
            known = "heads, " + ", ".join(_CHOICES)
            raise LoadError(f"unknown --call hint {key!r}; known: {known}",
                            f"未知的 --call 提示 {key!r}；可用的有：{known}")
    return hints


def apply_hints(spec: CallSpec, hints: Hints) -> CallSpec:
    """The spec with the hinted fields overriding what the signature suggested."""
    if hints.inputs:
        spec.inputs = hints.inputs
    if hints.layout:
        spec.layout = hints.layout
    if hints.causal is not None:
        spec.causal = hints.causal
    spec.mask_claim = hints.mask
    return spec
