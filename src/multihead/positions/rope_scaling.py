"""RoPE's frequencies, and the `rope_scaling` kinds that stretch them for longer contexts.

Pair k of the R rotated features (k = 0 .. R/2 - 1) turns by  position · inv_freq[k]  with

    inv_freq[k] = base ** (-2k / R)          (R/2,) float32; pair 0 turns fastest, one radian a step

A model trained on N positions has only seen the slow pairs turn a little. The scaling kinds reuse that
training for longer inputs by slowing the pairs down. They are Hugging Face's `rope_scaling` (or, in
transformers 5, `rope_parameters`) dicts; "type" is accepted as an old spelling of "rope_type":

    {"rope_type": "default"}                 plain RoPE
    {"rope_type": "linear", "factor": f}     every frequency / f: position p acts as p / f
    {"rope_type": "dynamic", "factor": f}    dynamic NTK: while the sequence seen so far has s > N
                                             positions, base grows to base · (f·s/N - (f - 1)) ** (R / (R - 2))
    {"rope_type": "llama3", "factor": f, "low_freq_factor": lo, "high_freq_factor": hi,
     "original_max_position_embeddings": N}  Llama 3.1: pairs with wavelength 2π/inv_freq > N/lo turn f
                                             times slower, those under N/hi are untouched, and the ones
                                             between blend the two smoothly

    {"rope_type": "yarn", "factor": f, "original_max_position_embeddings": N, ...}
                                             YaRN: pairs that turn fewer than beta_slow (1) times over N
                                             positions are interpolated (f times slower), those turning
                                             more than beta_fast (32) times are kept, a linear ramp between;
                                             cos and sin are multiplied by an attention factor (default
                                             0.1 ln f + 1, or DeepSeek's mscale / mscale_all_dim ratio)
    {"rope_type": "longrope", "long_factor": [...], "short_factor": [...],
     "original_max_position_embeddings": N}  LongRoPE (Phi-3): pair k turns 1 / factor[k] times as fast,
                                             with the long factors once a call reaches past N positions,
                                             the short ones otherwise; attention factor
                                             sqrt(1 + ln f / ln N), f = max_position / N by default

A dict may also carry "rope_theta" (must equal `base`) and "partial_rotary_factor" (R = int(D · it)), as
transformers 5 writes them. N for llama3 is the dict's "original_max_position_embeddings", else the
module's `max_position` (likewise for yarn and longrope). For dynamic, HF measures growth against the config's `max_position_embeddings`,
so `max_position` wins there and the dict's "original_max_position_embeddings" is the fallback.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any, Mapping

import torch

from multihead.errors import AttentionError

_COMMON_KEYS = {"rope_type", "type", "rope_theta", "partial_rotary_factor"}
KINDS: dict[str, tuple[set[str], set[str]]] = {  # kind -> (required keys, optional keys), beyond the common ones
    "default": (set(), set()),
    "linear": ({"factor"}, set()),
    "dynamic": ({"factor"}, {"original_max_position_embeddings"}),
    "llama3": ({"factor", "low_freq_factor", "high_freq_factor"}, {"original_max_position_embeddings"}),
    "yarn": ({"factor"}, {"original_max_position_embeddings", "attention_factor", "beta_fast", "beta_slow",
                          "mscale", "mscale_all_dim", "truncate"}),
    "longrope": ({"long_factor", "short_factor"}, {"factor", "attention_factor", "original_max_position_embeddings"}),
}
_LENGTH_KINDS = ("dynamic", "llama3", "yarn", "longrope")  # the kinds that need N


@dataclass(frozen=True)
class RopeScaling:
    """One parsed scaling dict. `theta` and `partial_rotary_factor` are what the dict said, or None."""

    kind: str = "default"
    factor: float = 1.0
    original_length: int | None = None  # N: llama3's and dynamic's original context length
    low_freq_factor: float | None = None
    high_freq_factor: float | None = None
    theta: float | None = None
    partial_rotary_factor: float | None = None
    attention_factor: float = 1.0  # yarn, longrope: cos and sin are multiplied by it
    beta_fast: float = 32.0  # yarn's ramp: pairs turning more than beta_fast times over N keep their speed
    beta_slow: float = 1.0  # ... and those turning fewer than beta_slow times are interpolated
    truncate: bool = True  # yarn: round the ramp's ends to whole pairs
    long_factor: tuple[float, ...] = ()  # longrope: per-pair divisors past N, and within N
    short_factor: tuple[float, ...] = ()

    @classmethod
    def parse(cls, scaling: Mapping[str, Any] | None, *, max_position: int | None = None) -> RopeScaling:
        """Read an HF rope_scaling / rope_parameters dict (None = default RoPE)."""
        if scaling is None:
            return cls()
        if not isinstance(scaling, Mapping):
            raise AttentionError(
                f"RoPE scaling expects a dict like HF's rope_scaling, or None; got {type(scaling).__name__}."
            )
        kind = _kind_of(scaling)
        required, optional = KINDS[kind]
        missing = sorted(required - set(scaling))
        unknown = sorted(set(scaling) - required - optional - _COMMON_KEYS)
        if missing or unknown:
            raise AttentionError(
                f"RoPE scaling {kind!r} expects keys {sorted(required)} (optional "
                f"{sorted(optional | _COMMON_KEYS)}); got {sorted(scaling)}"
                + (f", missing {missing}" if missing else "") + (f", unknown {unknown}" if unknown else "") + "."
            )
        read = lambda key: _positive(scaling[key], key) if scaling.get(key) is not None else None  # noqa: E731
        parsed = cls(
            kind=kind,
            factor=read("factor") or 1.0,
            original_length=_original_length(kind, scaling, max_position),
            low_freq_factor=read("low_freq_factor"),
            high_freq_factor=read("high_freq_factor"),
            theta=read("rope_theta"),
            partial_rotary_factor=read("partial_rotary_factor"),
        )
        if kind in ("yarn", "longrope"):
            parsed = _context_extension(parsed, scaling, max_position)
        if kind == "llama3" and not parsed.low_freq_factor < parsed.high_freq_factor:
            raise AttentionError(
                "RoPE scaling 'llama3' expects low_freq_factor < high_freq_factor; got "
                f"{parsed.low_freq_factor} and {parsed.high_freq_factor}."
            )
        return parsed


def frequencies(scaling: RopeScaling, base: float, rotary_dim: int, device=None) -> torch.Tensor:
    """inv_freq (R/2,) float32 for `scaling`; for dynamic, the frequencies up to the original length."""
    inv_freq = 1.0 / (base ** _exponents(rotary_dim, device))
    if scaling.kind == "linear":
        return inv_freq / scaling.factor
    if scaling.kind == "llama3":
        return _llama3(inv_freq, scaling)
    if scaling.kind == "yarn":
        return _yarn(inv_freq, scaling, base, rotary_dim)
    if scaling.kind == "longrope":
        return inv_freq / _per_pair(scaling.short_factor, rotary_dim, device)
    return inv_freq


def long_frequencies(scaling: RopeScaling, base: float, rotary_dim: int, device=None) -> torch.Tensor:
    """LongRoPE's inv_freq (R/2,) float32 for calls that reach past the original length N."""
    inv_freq = 1.0 / (base ** _exponents(rotary_dim, device))
    return inv_freq / _per_pair(scaling.long_factor, rotary_dim, device)


def grown_frequencies(scaling: RopeScaling, base: float, rotary_dim: int, length: torch.Tensor) -> torch.Tensor:
    """Dynamic NTK's inv_freq (R/2,) float32 once `length` (a 0-dim tensor, > N) positions were seen.

    Written with tensor arithmetic in HF's order, so the numbers match HF's and no value leaves the device.
    """
    N, f = scaling.original_length, scaling.factor
    grown_base = base * ((f * length.to(torch.float32) / N) - (f - 1)) ** (rotary_dim / (rotary_dim - 2))
    return 1.0 / (grown_base ** _exponents(rotary_dim, length.device))


def _exponents(rotary_dim: int, device) -> torch.Tensor:
    """2k / R for k = 0 .. R/2 - 1, float32 (R/2,)."""
    return torch.arange(0, rotary_dim, 2, dtype=torch.int64, device=device).to(torch.float32) / rotary_dim


def _llama3(inv_freq: torch.Tensor, scaling: RopeScaling) -> torch.Tensor:
    N, f = scaling.original_length, scaling.factor
    lo, hi = scaling.low_freq_factor, scaling.high_freq_factor
    wavelength = 2 * math.pi / inv_freq
    slow, fast = wavelength > N / lo, wavelength < N / hi  # slow pairs turn f times slower; fast ones keep
    blend = (N / wavelength - lo) / (hi - lo)  # 0 at the slow edge, 1 at the fast edge
    between = (1 - blend) * inv_freq / f + blend * inv_freq
    return torch.where(slow, inv_freq / f, torch.where(fast, inv_freq, between))


def _yarn(inv_freq: torch.Tensor, scaling: RopeScaling, base: float, rotary_dim: int) -> torch.Tensor:
    """Blend interpolated (f times slower) and original frequencies along a ramp over the pairs."""
    N, f = scaling.original_length, scaling.factor

    def pair_turning(turns: float) -> float:
        """The (fractional) pair index that turns `turns` times over N positions."""
        return rotary_dim * math.log(N / (turns * 2 * math.pi)) / (2 * math.log(base))

    low, high = pair_turning(scaling.beta_fast), pair_turning(scaling.beta_slow)
    if scaling.truncate:
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, rotary_dim - 1)
    if low == high:
        high += 0.001  # a ramp of zero width would divide by zero
    pairs = torch.arange(rotary_dim // 2, dtype=torch.float32, device=inv_freq.device)
    kept_share = 1 - ((pairs - low) / (high - low)).clamp(0, 1)  # 1: keeps its speed, 0: f times slower
    wavelength_factor = 1.0 / inv_freq  # base ** (2k / R)
    return 1.0 / (f * wavelength_factor) * (1 - kept_share) + inv_freq * kept_share


def _per_pair(factors: tuple[float, ...], rotary_dim: int, device) -> torch.Tensor:
    """LongRoPE's per-pair divisors as a (R/2,) float32 tensor; AttentionError unless there are R/2."""
    if len(factors) != rotary_dim // 2:
        raise AttentionError(f"RoPE scaling 'longrope' expects one factor per rotated pair, R/2 = {rotary_dim // 2}; "
                             f"got {len(factors)}.")
    return torch.tensor(factors, dtype=torch.float32, device=device)


def _context_extension(parsed: RopeScaling, scaling: Mapping[str, Any], max_position: int | None) -> RopeScaling:
    """yarn's and longrope's factor (default max_position / N), ramp or per-pair factors, and attention factor."""
    N = parsed.original_length
    factor = parsed.factor if scaling.get("factor") is not None else None
    if factor is None:
        if max_position is None:
            raise AttentionError(f"RoPE scaling {parsed.kind!r} without a factor needs max_position= "
                                 "(the factor is then max_position / original_max_position_embeddings).")
        factor = max_position / N
    given = scaling.get("attention_factor")
    if parsed.kind == "longrope":
        pairs = {name: _factor_list(scaling[name], name) for name in ("long_factor", "short_factor")}
        attention = 1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(N))
        return replace(parsed, factor=factor, long_factor=pairs["long_factor"], short_factor=pairs["short_factor"],
                       attention_factor=_positive(given, "attention_factor") if given is not None else attention)
    mscale, all_dims = (scaling.get(key) for key in ("mscale", "mscale_all_dim"))
    if mscale and all_dims:
        attention = _yarn_mscale(factor, _positive(mscale, "mscale")) / _yarn_mscale(
            factor, _positive(all_dims, "mscale_all_dim"))
    else:
        attention = _yarn_mscale(factor)
    truncate = scaling.get("truncate", True)
    if not isinstance(truncate, bool):
        raise AttentionError(f"RoPE scaling's 'truncate' must be True or False; got {truncate!r}.")
    return replace(parsed, factor=factor, truncate=truncate,
                   attention_factor=_positive(given, "attention_factor") if given is not None else attention,
                   beta_fast=_positive(scaling.get("beta_fast") or 32, "beta_fast"),
                   beta_slow=_positive(scaling.get("beta_slow") or 1, "beta_slow"))


def _yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention temperature 0.1 * mscale * ln(factor) + 1 (1 when the context is not stretched)."""
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _factor_list(values: Any, key: str) -> tuple[float, ...]:
    if isinstance(values, (str, bytes)) or not hasattr(values, "__iter__"):
        raise AttentionError(f"RoPE scaling's {key!r} must be a list of positive numbers; got {values!r}.")
    return tuple(_positive(v, key) for v in values)


def _kind_of(scaling: Mapping[str, Any]) -> str:
    kinds = {scaling[key] for key in ("rope_type", "type") if key in scaling}
    if len(kinds) > 1:
        raise AttentionError(f"RoPE scaling has 'rope_type' and 'type' disagreeing; got {sorted(map(str, kinds))}.")
    kind = kinds.pop() if kinds else "default"
    if kind not in KINDS:
        raise AttentionError(f"RoPE scaling kind must be one of {sorted(KINDS)}; got {kind!r}.")
    return kind


def _original_length(kind: str, scaling: Mapping[str, Any], max_position: int | None) -> int | None:
    if kind not in _LENGTH_KINDS:
        return None
    from_dict = scaling.get("original_max_position_embeddings")
    first, second = (max_position, from_dict) if kind == "dynamic" else (from_dict, max_position)
    length = first if first is not None else second
    if length is None:
        raise AttentionError(
            f"RoPE scaling {kind!r} needs the original context length: expected "
            "'original_max_position_embeddings' in the dict or max_position=; got neither."
        )
    whole = isinstance(length, int) or (isinstance(length, float) and length.is_integer())
    if isinstance(length, bool) or not whole or length < 1:
        raise AttentionError(f"RoPE scaling's original context length must be a positive integer; got {length!r}.")
    return int(length)


def _positive(value: Any, key: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise AttentionError(f"RoPE scaling's {key!r} must be a positive finite number; got {value!r}.")
    return float(value)
