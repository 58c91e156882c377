"""Config objects for constructors like ``__init__(self, config)`` (minGPT, nanoGPT, GPT-2, BERT, CLIP).

``--config '{"n_embd": 16, "n_head": 4}'`` becomes an attribute object. Attributes it does not give come
from the config class the constructor names (``__init__(self, args: ModelArgs)``, a dataclass whose fields
all have defaults, as DeepSeek-V3's reference code has it; context lengths capped at the checker's longest
probe, so that a cache sized for 16k tokens stays small), then by name (``names.guess_value``:
``config.n_embd`` -> 16, ``config.attn_pdrop`` -> 0.0...), and every attribute the constructor reads is
recorded, so that the report can say which ones were used and which one could not be guessed.
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
import sys

from multihead.checker.loading.constructor_args import LENGTH, LENGTH_NAMES, guess_value


class GuessedConfig:
    """An attribute object: given values first, then guesses by name; unknown names raise AttributeError
    (so ``getattr(config, "x", default)`` and ``hasattr`` behave as with a real config)."""

    def __init__(self, given: dict | None = None, defaults: dict | None = None):
        object.__setattr__(self, "_given", {k: _nested(v) for k, v in (given or {}).items()})
        object.__setattr__(self, "_defaults", dict(defaults or {}))
        object.__setattr__(self, "_read", {})
        object.__setattr__(self, "_unknown", [])

    def __getattr__(self, name: str):
        if name.startswith("__") or name in ("_given", "_defaults", "_read", "_unknown"):
            raise AttributeError(name)
        if name in self._given:
            value = self._given[name]
        elif name in self._defaults:
            value = self._defaults[name]
        else:
            found, value = guess_value(name)
            if not found:
                if name not in self._unknown:
                    self._unknown.append(name)
                raise AttributeError(f"config has no attribute {name!r} (the checker cannot guess it)")
        self._read[name] = value
        return value

    def __setattr__(self, name: str, value) -> None:
        self._given[name] = value

    def __deepcopy__(self, memo) -> GuessedConfig:
        copied = GuessedConfig(copy.deepcopy(self._given, memo), copy.deepcopy(self._defaults, memo))
        copied._read.update(self._read)
        return copied

    def values(self) -> dict:
        """Every attribute read or given: name -> value."""
        return {**self._read, **self._given}

    def unknown(self) -> list[str]:
        """Attributes asked for that were neither given nor guessed."""
        return list(self._unknown)

    def with_values(self, **changes) -> GuessedConfig:
        """A copy with some attributes set (used to rebuild the module with another head count)."""
        return GuessedConfig({**self._given, **changes}, self._defaults)

    def __repr__(self) -> str:
        return "config(" + ", ".join(f"{k}={v!r}" for k, v in self.values().items()) + ")"


def class_defaults(annotation, owner: type) -> dict:
    """The field defaults of the config class a constructor parameter is annotated with (a dataclass, or a
    string naming one in the constructor's module), context lengths capped at ``names.LENGTH``; {} when the
    annotation is no such class or a field has no default."""
    if isinstance(annotation, str):
        annotation = getattr(sys.modules.get(owner.__module__), annotation.strip("'\""), None)
    if not (inspect.isclass(annotation) and dataclasses.is_dataclass(annotation)):
        return {}
    try:
        values = dataclasses.asdict(annotation())
    except Exception:  # a field without a default, or a __post_init__ that needs more
        return {}
    return {name: min(value, LENGTH) if name in LENGTH_NAMES and isinstance(value, int) else value
            for name, value in values.items()}


def _nested(value):
    return GuessedConfig(value) if isinstance(value, dict) else value
