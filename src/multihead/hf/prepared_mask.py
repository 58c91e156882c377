"""PreparedMask: the Mask `hf_mask` returns, which also stands in for the tensor transformers' eager mask is.

Most models hand the mask straight to the attention function, which reads its structure (the fast
path). A few compute attention themselves and do tensor arithmetic on the mask first: Bloom adds it
to its ALiBi scores, MPT calls `.to(torch.bool)` and `masked_fill`s with it. For them a PreparedMask
acts as the tensor the "eager" mask function would have built for the same call:

    (B, 1, Lq, Lk) float `dtype`, 0 where the query may attend, torch.finfo(dtype).min where it may not

Any torch function, operator (+, -, *, /, ==, <, [...]) or tensor method or attribute (`.to`, `.bool()`,
`.dtype`, `.device`) applied to it runs on that tensor, built once per mask and kept while the mask's
own tensors are unchanged. `shape`, `ndim` and `contiguous()` answer without building it: generate
prepares masks ahead for static caches and passes them back in, and the structure must survive that.
"""
from __future__ import annotations

import torch
import torch.utils._pytree as pytree

from multihead.masks import Mask
from multihead.masks.mask import flatten_keys, flatten_parts, unflatten_parts


class PreparedMask(Mask):
    """A Mask for the (B, 1, Lq, Lk) grid that also behaves as HF's eager float mask; see the module docstring."""

    __slots__ = ("shape", "dtype", "device", "_eager")

    def __init__(self, parts: tuple = (), shape: tuple[int, ...] = (0, 1, 0, 0), dtype: torch.dtype = torch.float32,
                 device=None):
        super().__init__(parts)
        self.shape = torch.Size(shape)
        self.dtype = dtype
        self.device = torch.device("cpu") if device is None else torch.device(device)
        self._eager = None  # (the parts' tensor versions, the eager tensor), eager only

    @property
    def ndim(self) -> int:
        return 4

    def contiguous(self) -> PreparedMask:
        return self

    def eager(self) -> torch.Tensor:
        """(B, 1, Lq, Lk) `dtype`: 0 = attend, finfo(dtype).min = blocked, as transformers' eager_mask builds it."""
        if torch.compiler.is_compiling() or any(t.is_inference() for t in self.tensors):
            return self._build_eager()
        versions = tuple(t._version for t in self.tensors)
        kept = self._eager
        if kept is None or kept[0] != versions:
            kept = self._eager = (versions, self._build_eager())
        return kept[1]

    def _build_eager(self) -> torch.Tensor:
        keep, _ = self.materialize(*self.shape, device=self.device)  # no part hf_mask builds adds a bias
        keep = torch.ones((), dtype=torch.bool, device=self.device) if keep is None else keep
        zero = torch.zeros((), dtype=self.dtype, device=self.device)
        blocked = torch.tensor(torch.finfo(self.dtype).min, dtype=self.dtype, device=self.device)
        return torch.where(keep.expand(self.shape), zero, blocked)

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        as_tensor = lambda x: x.eager() if isinstance(x, PreparedMask) else x  # noqa: E731
        args, kwargs = pytree.tree_map(as_tensor, (args, kwargs or {}), is_leaf=lambda x: isinstance(x, PreparedMask))
        return func(*args, **kwargs)

    def __getattr__(self, name: str):
        """Tensor methods and attributes (`.to`, `.bool()`, `.masked_fill`, ...) of the eager mask."""
        if name.startswith("_") or name in PreparedMask.__slots__:  # not set yet (copying): no eager build
            raise AttributeError(name)
        return getattr(self.eager(), name)

    __hash__ = Mask.__hash__  # stays hashable although == compares as a tensor


def _on_eager(name: str):
    """The method `name` of PreparedMask: the tensor method `name` applied to the eager mask."""
    def method(self, *args):
        return getattr(self.eager(), name)(*args)
    method.__name__ = name
    return method


for _name in ("__getitem__", "__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__truediv__",
              "__neg__", "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__", "__invert__"):
    setattr(PreparedMask, _name, _on_eager(_name))


def _flatten(m: PreparedMask):
    leaves, parts = flatten_parts(m.parts)
    return leaves, (parts, tuple(m.shape), m.dtype, m.device)


pytree.register_pytree_node(
    PreparedMask, _flatten,
    lambda leaves, context: PreparedMask(unflatten_parts(leaves, context[0]), *context[1:]),
    serialized_type_name="multihead.hf.PreparedMask",
    flatten_with_keys_fn=lambda m: (list(zip(flatten_keys(m.parts), _flatten(m)[0])), _flatten(m)[1]),
)
