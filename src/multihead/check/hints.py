"""``--call`` hints: what to take as given instead of detecting it.

Format: comma-separated ``key=value`` pairs, e.g. ``"heads=4,layout=seq,causal=no,inputs=qkv"``.
heads: number of heads; layout: batch | seq; causal: yes | no; inputs: x | qkv | q_kv.
"""

from __future__ import annotations

from dataclasses import dataclass

from multihead.check.calling import CallSpec
from multihead.check.load import LoadError

_CHOICES = {"layout": ("batch", "seq"), "causal": ("yes", "no"), "inputs": ("x", "qkv", "q_kv")}


@dataclass
class Hints:
    heads: int | None = None
    layout: str | None = None
    causal: bool | None = None
    inputs: str | None = None


def parse_hints(text: str | None) -> Hints:
    """Hints from ``"key=value,..."``; unknown keys or values raise LoadError saying what is allowed."""
    hints = Hints()
    for item in filter(None, (part.strip() for part in (text or "").split(","))):
        key, sep, value = item.partition("=")
        key, value = key.strip(), value.strip()
        if not sep:
            raise LoadError(f"--call expects key=value pairs, got {item!r}")
        if key == "heads":
            if not value.isdigit() or int(value) < 1:
                raise LoadError(f"--call heads must be a positive integer, got {value!r}")
            hints.heads = int(value)
        elif key in _CHOICES:
            if value not in _CHOICES[key]:
                raise LoadError(f"--call {key} must be one of {', '.join(_CHOICES[key])}, got {value!r}")
            setattr(hints, key, value == "yes" if key == "causal" else value)
        else:
            raise LoadError(f"unknown --call hint {key!r}; known: heads, " + ", ".join(_CHOICES))
    return hints


def apply_hints(spec: CallSpec, hints: Hints) -> CallSpec:
    """The spec with the hinted fields overriding what the signature suggested."""
    if hints.inputs:
        spec.inputs = hints.inputs
    if hints.layout:
        spec.layout = hints.layout
    if hints.causal is not None:
        spec.causal = hints.causal
    return spec
