"""Modern attention's options, found in a learner's module like a mask convention: a sliding window,
QK-norm, attention sinks and a softcap on the scores (partial and interleaved RoPE live in ``rotary.py``).

``Options`` holds what was found (``behaviour/find_options.py`` finds it) and puts it into the checker's plain
maths (``catalogue.reference_variant`` calls ``norm_width``, ``norm_q_k``, ``cap``, ``window_keep`` and
``softmax``) and into its reference module (``reference_kwargs`` and ``reference_layers`` for
``compare.py``), the way
``multihead.MultiHeadAttention`` does it:

    q, k = rms_norm(q), rms_norm(k)        over each head's D features (QK-norm, Qwen3), before RoPE or after
    scores = cap * tanh(scores / cap)      after the scale (softcap, Gemma 2)
    key j kept for query i when i - j < window (with the causal mask: the last `window` keys, i included)
    softmax over the keys and one sink logit per head, which carries no value (sinks, gpt-oss)

Shapes: q (B, H, Lq, D), k (B, Hkv, Lk, D), scores (B, H, Lq, Lk).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from multihead.positions import RoPE

Named = tuple[str, torch.Tensor]  # (the learner's parameter name, the parameter itself)


def rms_norm(t: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """t / sqrt(mean(t**2) + eps) over the last dimension, times ``weight`` when there is one."""
    normed = t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + eps)
    return normed if weight is None else normed * weight


OFFSET = "1 + "  # a norm weight stored as an offset from one (Gemma's RMSNorm: x * (1 + w)), named "1 + <name>"


@dataclass(eq=False)
class QKNorm:
    """RMSNorm of q and k: over each head's D features (``whole_width``: over all H*D before the split, the
    ``qk-norm-wrong-axis`` mistake), with the learner's weights or none, before RoPE or after it."""

    q_weight: Named | None
    k_weight: Named | None
    eps: float
    after_rope: bool = False
    whole_width: bool = False

    @property
    def weights(self) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """The weights the norm multiplies by: the learner's, or 1 + theirs (a name starting with OFFSET)."""
        return tuple(None if named is None else 1.0 + named[1] if named[0].startswith(OFFSET) else named[1]
                     for named in (self.q_weight, self.k_weight))


@dataclass(eq=False)
class Options:
    """The options a module was found to use (None: not used)."""

    window: int | None = None  # keys in the last `window` positions (i - j < window)
    qk_norm: QKNorm | None = None
    sinks: Named | None = None  # (H,) sink logits
    softcap: float | None = None
    intended: dict = field(default_factory=dict)  # what the constructor names: window, rotary_dim

    def norm_q_k(self, q: torch.Tensor, k: torch.Tensor, after_rope: bool) -> tuple[torch.Tensor, torch.Tensor]:
        """q (B, H, Lq, D) and k (B, Hkv, Lk, D) through QK-norm when it happens at this point (over each
        head; the whole-width mistake happens in ``norm_width`` instead)."""
        norm = self.qk_norm
        if norm is None or norm.whole_width or norm.after_rope != after_rope:
            return q, k
        q_weight, k_weight = norm.weights
        return rms_norm(q, q_weight, norm.eps), rms_norm(k, k_weight, norm.eps)

    def norm_width(self, t: torch.Tensor, role: str) -> torch.Tensor:
        """A projection (B, L, H*D) through the whole-width norm of ``role`` ("q" or "k"), if that is what the
        module does."""
        norm = self.qk_norm
        if norm is None or not norm.whole_width:
            return t
        return rms_norm(t, norm.weights["qk".index(role)], norm.eps)

    def cap(self, scores: torch.Tensor) -> torch.Tensor:
        return scores if self.softcap is None else self.softcap * torch.tanh(scores / self.softcap)

    def window_keep(self, q_at: torch.Tensor, k_at: torch.Tensor) -> torch.Tensor | None:
        """(Lq, Lk) bool, True = within the window, for query positions q_at (Lq,) and key positions k_at (Lk,)."""
        if self.window is None:
            return None
        return (q_at[:, None] - k_at[None, :]) < self.window

    def softmax(self, scores: torch.Tensor, dim: int) -> torch.Tensor:
        """softmax over ``dim``; over the keys with sinks, each row's denominator also holds exp(sink[h])."""
        if self.sinks is None or dim != -1:
            return torch.softmax(scores, dim=dim)
        B, H, Lq, _ = scores.shape
        sink = self.sinks[1].to(scores.dtype).view(1, H, 1, 1).expand(B, H, Lq, 1)
        return torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]  # (B, H, Lq, Lk)

    def reference_kwargs(self) -> dict:
        """MultiHeadAttention arguments for these options (QK-norm's layers: ``reference_layers``)."""
        return {"window": self.window, "softcap": self.softcap, "sinks": self.sinks is not None}

    def reference_layers(self, reference: nn.Module, head_dim: int, params: dict) -> None:
        """Put sinks and QK-norm into the reference module (its q_norm/k_norm, a norm after its RoPE, or a
        norm on its whole q/k projections) and add the learner's parameters they read to ``params`` (the
        reference's parameter name -> the learner's tensor)."""
        if self.sinks is not None:
            params["sinks"] = self.sinks[1]
        norm = self.qk_norm
        if norm is None:
            return
        q_weight, k_weight = norm.weights
        sizes = (reference.q_proj.out_features, reference.k_proj.out_features) if norm.whole_width else \
            (head_dim, head_dim)
        dtype = reference.q_proj.weight.dtype
        layers = [nn.RMSNorm(size, eps=norm.eps, elementwise_affine=weight is not None, dtype=dtype)
                  for size, weight in zip(sizes, (q_weight, k_weight))]
        reference.q_norm = reference.k_norm = None
        if norm.whole_width:  # each whole projection, then RMSNorm(H*D)
            reference.q_proj, reference.k_proj = (NormedProjection(proj, layer) for proj, layer in
                                                  zip((reference.q_proj, reference.k_proj), layers))
            names = ("q_proj.norm.weight", "k_proj.norm.weight")
        elif norm.after_rope:
            reference.rope = RopeThenNorm(reference.rope, *layers)
            names = ("rope.q_norm.weight", "rope.k_norm.weight")
        else:
            reference.q_norm, reference.k_norm = layers
            names = ("q_norm.weight", "k_norm.weight")
        params.update({name: weight for name, weight in zip(names, (q_weight, k_weight)) if weight is not None})


class NormedProjection(nn.Linear):
    """A projection whose whole output then goes through RMSNorm (QK-norm over all heads at once); it stands
    where MultiHeadAttention calls q_proj or k_proj, and keeps their parameter names."""

    def __init__(self, linear: nn.Linear, norm: nn.Module):
        super().__init__(linear.in_features, linear.out_features, bias=linear.bias is not None,
                         dtype=linear.weight.dtype)
        self.norm = norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(super().forward(x))


class RopeThenNorm(nn.Module):
    """The reference's RoPE followed by QK-norm (a module that normalises q and k after turning them); it
    stands where MultiHeadAttention calls its rope: ``(q, k, positions) -> (q, k)``."""

    def __init__(self, rope: RoPE | None, q_norm: nn.Module, k_norm: nn.Module):
        super().__init__()
        self.inner, self.q_norm, self.k_norm = rope, q_norm, k_norm

    def cos_sin(self, positions, dtype=None):
        return self.inner.cos_sin(positions, dtype)

    def forward(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor):
        if self.inner is not None:
            q, k = self.inner(q, k, positions)
        return self.q_norm(q), self.k_norm(k)
