"""An MLA module whose attention form is picked by a switch in its file, as DeepSeek-V3's reference inference
code picks it: ``attn_impl = "absorb"`` (or ``"naive"``) at module level, read by ``__init__`` (which caches
differ) and by ``forward``.

The checker judges the naive form against MLA written out plainly and the absorbed form against the naive
one (``targets/latent.py``), so it builds the module under the naive value and keeps the switch there while it checks
(``Switch.hold``); the absorbed form is a twin built under the other value that shares every parameter of the
module it stands for (``AbsorbedTwins``), so randomised, float64 or changed weights are the same in both.
"""

from __future__ import annotations

import contextlib
import sys
import weakref
from dataclasses import dataclass

from torch import nn

SWITCH_NAMES = ("attn_impl", "attention_impl", "mla_impl", "attn_mode", "attention_mode", "impl")
NAIVE_VALUES = ("naive", "plain", "decompressed", "vanilla")
ABSORBED_VALUES = ("absorb", "absorbed", "absorption", "absorb_weights")


@dataclass
class Switch:
    """A module-level string in the learner's file that picks the naive or the absorbed form."""

    namespace: dict  # the file's globals
    name: str
    naive: str
    absorbed: str
    original: str  # its value in the file

    @contextlib.contextmanager
    def set(self, value: str):
        """The switch at ``value`` inside the block, back to what it was after."""
        before = self.namespace[self.name]
        self.namespace[self.name] = value
        try:
            yield
        finally:
            self.namespace[self.name] = before

    def hold(self) -> None:
        """The switch at the naive value until ``release``: the module the checker calls is the naive form."""
        self.namespace[self.name] = self.naive

    def release(self) -> None:
        self.namespace[self.name] = self.original


def find_switch(cls: type) -> Switch | None:
    """The switch in the file that defines ``cls``, when its value is one of the naive or absorbed words (the
    other form is then the other kind of word: "naive" <-> "absorb"), else None."""
    namespace = vars(sys.modules[cls.__module__]) if cls.__module__ in sys.modules else {}
    for name in SWITCH_NAMES:
        value = namespace.get(name)
        if not isinstance(value, str):
            continue
        if value.lower() in NAIVE_VALUES:
            return Switch(namespace, name, value, "absorb", value)
        if value.lower() in ABSORBED_VALUES:
            return Switch(namespace, name, "naive", value, value)
    return None


def share_parameters(twin: nn.Module, module: nn.Module) -> None:
    """Make every parameter of ``twin`` the same tensor as ``module``'s parameter of that name."""
    for name, param in module.named_parameters():
        owner, _, leaf = name.rpartition(".")
        twin.get_submodule(owner)._parameters[leaf] = param


class AbsorbedTwins:
    """The absorbed form of modules built under the naive value: for each such module (or a copy of it), a twin
    built under the absorbed value with the same parameters."""

    def __init__(self, switch: Switch, build):
        self.switch = switch
        self.build = build  # () -> a new module of the learner's class (the same constructor arguments)
        self._twins: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def twin(self, module: nn.Module) -> nn.Module:
        """The absorbed twin of ``module`` (built once), its buffers in its parameters' dtype, in eval mode."""
        if module not in self._twins:
            with self.switch.set(self.switch.absorbed):
                twin = self.build()
            share_parameters(twin, module)
            self._twins[module] = twin
        twin = self._twins[module]
        dtype = next(module.parameters()).dtype
        return twin.to(dtype).train(module.training)

    def call(self, module: nn.Module, run):
        """``run(twin)`` with the switch at the absorbed value."""
        twin = self.twin(module)
        with self.switch.set(self.switch.absorbed):
            return run(twin)


SWITCHED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # naive module -> its AbsorbedTwins
