"""The implementations a suite compares, each built for one self-attention shape.

A `Runner` holds a built module and its input, and runs the forward (or forward+backward) pass with
nothing else in the timed region: masks, layouts and inputs are prepared once, when it is built.
Shapes: x (B, N, E) batch-first; E = H * D.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

import multihead as mh
from multihead.bench.kernels import what_runs
from multihead.bench.timing import Timing


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

    def what_runs(self) -> str:
        """The kernels each pass calls (forward under no_grad, forward with autograd for training)."""
        with torch.no_grad():
            inference = what_runs(self.call)
        training = what_runs(self.call)
        return inference if inference == training else f"forward: {inference}; fwd+bwd: {training}"

    def forward(self) -> torch.Tensor:
        """Inference: one forward pass without autograd."""
        with torch.no_grad():
            return self.call()

    def forward_backward(self) -> None:
        """Training step: forward, sum, backward into fresh parameter gradients."""
        for p in self.params:
            p.grad = None
        self.call().float().sum().backward()


class MinimalAttention(nn.Module):
    """A plausible minimal self-attention: QKV projection, SDPA, output projection. x (B, N, E) -> (B, N, E).

    fused_qkv: one (3E, E) GEMM (`qkv`), else three (E, E) GEMMs (`q_proj`, `k_proj`, `v_proj`).
    contiguous: copy q, k, v into contiguous (B, H, N, D) tensors before SDPA, else hand SDPA the
    strided views of the projection output. No checks and no options: nothing but the work.
    """

    def __init__(self, embed: int, heads: int, causal: bool, *, fused_qkv: bool, contiguous: bool,
                 **factory):
        super().__init__()
        self.heads, self.causal, self.fused_qkv, self.contiguous = heads, causal, fused_qkv, contiguous
        if fused_qkv:
            self.qkv = nn.Linear(embed, 3 * embed, **factory)
        else:
            self.q_proj, self.k_proj, self.v_proj = (nn.Linear(embed, embed, **factory) for _ in range(3))
        self.out_proj = nn.Linear(embed, embed, **factory)

    def split(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x (B, N, E) -> q, k, v, each (B, H, N, D)."""
        B, N, E = x.shape
        H, D = self.heads, E // self.heads
        if self.fused_qkv:
            q, k, v = self.qkv(x).view(B, N, 3, H, D).permute(2, 0, 3, 1, 4)  # each (B, H, N, D)
        else:
            q, k, v = (proj(x).view(B, N, H, D).transpose(1, 2) for proj in (self.q_proj, self.k_proj,
                                                                               self.v_proj))
        if self.contiguous:
            q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
        return q, k, v

    def forward(self, x: torch.Tensor, keep: torch.Tensor | None = None) -> torch.Tensor:
        """x (B, N, E); keep: an optional bool SDPA mask (True = attend) used instead of causal."""
        B, N, E = x.shape
        q, k, v = self.split(x)
        causal = self.causal and keep is None
        o = F.scaled_dot_product_attention(q, k, v, keep, is_causal=causal)  # (B, H, N, D)
        return self.out_proj(o.transpose(1, 2).reshape(B, N, E))  # (B, N, E)


# The floor's candidates: {name: (fused_qkv, contiguous)}. The floor is the fastest of them in each run.
FLOOR_VARIANTS = {
    "floor[3 GEMMs, views]": (False, False),
    "floor[3 GEMMs, contiguous]": (False, True),
    "floor[fused QKV, views]": (True, False),
    "floor[fused QKV, contiguous]": (True, True),
}


def family(name: str) -> str:
    """The implementation a variant belongs to: "floor[3 GEMMs, views]" -> "floor"."""
    return name.split("[", 1)[0]


def fastest_variants(t: Mapping[str, Timing]) -> dict[str, str]:
    """{family: the name of its variant with the lowest median}, over every timed name."""
    best: dict[str, str] = {}
    for name, timing in t.items():
        fam = family(name)
        if fam not in best or timing.median_s < t[best[fam]].median_s:
            best[fam] = name
    return best


def _factory(shape: Shape) -> dict:
    return {"device": shape.device, "dtype": shape.dtype}


def build_ours(shape: Shape, backend: str = "auto") -> Runner:
    """multihead.MultiHeadAttention, causal through its `causal=True` flag."""
    mod = mh.MultiHeadAttention(shape.embed, shape.heads, backend=backend, **_factory(shape)).eval()
    x = shape.input()
    name = "ours" if backend == "auto" else f"ours[{backend}]"
    return Runner(name, lambda: mod(x, causal=shape.causal), mod)


def build_floor(shape: Shape, name: str = "floor[3 GEMMs, views]") -> Runner:
    """One minimal implementation of FLOOR_VARIANTS, named `name`."""
    fused, contiguous = FLOOR_VARIANTS[name]
    mod = MinimalAttention(shape.embed, shape.heads, shape.causal, fused_qkv=fused, contiguous=contiguous,
                           **_factory(shape)).eval()
    x = shape.input()
    return Runner(name, lambda: mod(x), mod)


# nn.MultiheadAttention in each mode a user could pick: {name: (need_weights, training)}. In eval
# mode under no_grad, torch takes its native fast path; in training mode (dropout 0) it calls SDPA.
TORCH_MHA_VARIANTS = {
    "nn.MultiheadAttention[default]": (True, False),
    "nn.MultiheadAttention[need_weights=False, eval]": (False, False),
    "nn.MultiheadAttention[need_weights=False, train, dropout 0]": (False, True),
}
TORCH_DEFAULT = "nn.MultiheadAttention[default]"


def build_torch_mha(shape: Shape, name: str = TORCH_DEFAULT) -> Runner:
    """nn.MultiheadAttention (dropout 0) with a (N, N) bool causal mask and the is_causal hint."""
    need_weights, training = TORCH_MHA_VARIANTS[name]
    mod = nn.MultiheadAttention(shape.embed, shape.heads, batch_first=True, **_factory(shape))
    mod.train(training)
    x = shape.input()
    mask = shape.causal_block() if shape.causal else None

    def call():
        return mod(x, x, x, attn_mask=mask, need_weights=need_weights, is_causal=shape.causal)[0]

    return Runner(name, call, mod, "averaged weights returned" if need_weights else "")


PEERS: dict[str, Callable[[Shape], Runner]] = {
    "ours": build_ours,
    **{name: (lambda s, name=name: build_floor(s, name)) for name in FLOOR_VARIANTS},
    **{name: (lambda s, name=name: build_torch_mha(s, name)) for name in TORCH_MHA_VARIANTS},
}
