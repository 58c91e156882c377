"""The implementations a suite compares, each built for one self-attention shape.

A `Runner` holds a built module and its input, and runs the forward (or forward+backward) pass with
nothing else in the timed region: masks, layouts and inputs are prepared once, when it is built.
Shapes: x (B, N, E) batch-first; E = H * D.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn


@dataclass(frozen=True)
class Shape:
    """One self-attention workload: x (batch, length, embed), `heads` heads, causal or not."""

    batch: int
    length: int
    embed: int
    heads: int
    causal: bool = True
    dtype: torch.dtype = torch.float32
    device: str = "cpu"

    @property
    def head_dim(self) -> int:
        return self.embed // self.heads

    def input(self, seed: int = 0) -> torch.Tensor:
        """A random x (B, N, E)."""
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(self.batch, self.length, self.embed, generator=g)
        return x.to(device=self.device, dtype=self.dtype)

    def causal_block(self) -> torch.Tensor:
        """(N, N) bool, True above the diagonal = blocked (the nn.MultiheadAttention convention)."""
        n = self.length
        return torch.ones(n, n, dtype=torch.bool, device=self.device).triu(1)


@dataclass
class Runner:
    """A built implementation: `call()` runs one forward pass on the prepared input."""

    name: str
    call: Callable[[], torch.Tensor]
    module: nn.Module
    note: str = ""
    params: list[torch.Tensor] = field(init=False)

    def __post_init__(self):
        self.params = [p for p in self.module.parameters() if p.requires_grad]

    def forward(self) -> torch.Tensor:
        """Inference: one forward pass without autograd."""
        with torch.no_grad():
            return self.call()

    def forward_backward(self) -> None:
        """Training step: forward, sum, backward into fresh parameter gradients."""
        for p in self.params:
            p.grad = None
        self.call().float().sum().backward()


class FusedFloor(nn.Module):
    """The floor: one fused QKV GEMM, SDPA with is_causal, one output GEMM. x (B, N, E) -> (B, N, E)."""

    def __init__(self, embed: int, heads: int, causal: bool, **factory):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.qkv = nn.Linear(embed, 3 * embed, **factory)
        self.out = nn.Linear(embed, embed, **factory)

    def forward(self, x: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, N, E); keep: an optional bool SDPA mask (True = attend) used instead of causal."""
        B, N, E = x.shape
        qkv = self.qkv(x).view(B, N, 3, self.heads, E // self.heads)  # (B, N, 3, H, D)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)  # each (B, H, N, D)
        causal = self.causal and keep is None
        o = F.scaled_dot_product_attention(q, k, v, keep, is_causal=causal)  # (B, H, N, D)
        return self.out(o.transpose(1, 2).reshape(B, N, E))  # (B, N, E)


def _factory(shape: Shape) -> dict:
    return {"device": shape.device, "dtype": shape.dtype}


def build_ours(shape: Shape, backend: str = "auto") -> Runner:
    """multihead.MultiHeadAttention, causal through its `causal=True` flag."""
    import multihead as mh

    mod = mh.MultiHeadAttention(shape.embed, shape.heads, backend=backend, **_factory(shape)).eval()
    x = shape.input()
    name = "ours" if backend == "auto" else f"ours[{backend}]"
    return Runner(name, lambda: mod(x, causal=shape.causal), mod)


def build_floor(shape: Shape) -> Runner:
    """The fused QKV GEMM + SDPA + output GEMM floor nothing else can beat by design."""
    mod = FusedFloor(shape.embed, shape.heads, shape.causal, **_factory(shape)).eval()
    x = shape.input()
    return Runner("floor", lambda: mod(x), mod, "fused QKV GEMM + SDPA(is_causal) + out GEMM")


def build_torch_mha(shape: Shape, need_weights: bool = True) -> Runner:
    """nn.MultiheadAttention with a (N, N) bool causal mask and the is_causal hint."""
    mod = nn.MultiheadAttention(shape.embed, shape.heads, batch_first=True, **_factory(shape)).eval()
    x = shape.input()
    mask = shape.causal_block() if shape.causal else None

    def call():
        return mod(x, x, x, attn_mask=mask, need_weights=need_weights, is_causal=shape.causal)[0]

    name = "nn.MultiheadAttention" + ("" if need_weights else "(need_weights=False)")
    note = "averaged weights returned" if need_weights else "SDPA inside"
    return Runner(name, call, mod, note)


PEERS: dict[str, Callable[[Shape], Runner]] = {
    "ours": build_ours,
    "floor": build_floor,
    "nn.MultiheadAttention": build_torch_mha,
    "nn.MultiheadAttention(need_weights=False)": lambda s: build_torch_mha(s, need_weights=False),
}
