"""The RoPE wavelength bases to try on a module that does not say its own (``from_module``'s dataflow
converter and the checker try the same ones)."""
from __future__ import annotations

from torch import nn

ROPE_BASE_NAMES = ("base", "theta", "rope_theta", "rope_base", "rotary_base", "rotary_emb_base")
DEFAULT_ROPE_BASE = 10000.0


def rope_bases(module: nn.Module, given: dict | None = None) -> list[float]:
    """The RoPE bases to try: a number > 1 named like a base among ``given`` (constructor arguments) or the
    module's attributes, then 10000."""
    found = [(given or {}).get(name, getattr(module, name, None)) for name in ROPE_BASE_NAMES]
    numbers = [float(v) for v in found if isinstance(v, (int, float)) and not isinstance(v, bool) and v > 1]
    return list(dict.fromkeys(numbers + [DEFAULT_ROPE_BASE]))
