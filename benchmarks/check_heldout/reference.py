"""The plain float64 attention every held-out case is verified against, written out step by step.

Weights come in `F.linear`'s orientation: a projection is (weight (out, in), bias or None). Legend: B batch,
H heads, Hkv kv heads, Lq/Lk lengths, D head dim, E embed.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

Projection = tuple  # (weight (out, in), bias (out,) or None)


@dataclass
class Rotary:
    """RoPE on the first `dim` features of each head: half-split pairs (i, i + dim/2) or neighbours
    (2i, 2i + 1); `sign=-1` turns the other way (a valid RoPE with the opposite angle)."""
    dim: int
    base: float = 10000.0
    interleaved: bool = False
    sign: float = 1.0


@dataclass
class QKNorm:
    """An RMSNorm over each head's D features of q and of k (weights (D,) or None), before or after RoPE;
    `whole_width`: over the whole projected width (H*D, weights (H*D,)) before the head split instead."""
    q_weight: torch.Tensor | None = None
    k_weight: torch.Tensor | None = None
    eps: float = 1e-6
    after_rope: bool = False
    whole_width: bool = False


@dataclass
class Spec:
    """What a layer computes: its head counts and every variant it uses."""
    heads: int
    kv_heads: int | None = None
    head_dim: int | None = None
    causal: bool = False
    window: int | None = None          # each query sees its last `window` keys, itself included
    local: int | None = None           # each query sees the keys at most `local` positions away, both sides
    rotary: Rotary | None = None
    qk_norm: QKNorm | None = None
    softcap: float | None = None
    sinks: torch.Tensor | None = None  # (H,) logits in each row's softmax denominator
    scale: float | None = None         # default 1/sqrt(D)
    extra: dict = field(default_factory=dict)


def linear(x: torch.Tensor, projection: Projection) -> torch.Tensor:
    """x through (weight (out, in), bias or None), or through a function of x (a low-rank path with a norm
    inside, written out by the case's reader)."""
    if callable(projection):
        return projection(x)
    weight, bias = projection
    return F.linear(x, weight, bias)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None, eps: float) -> torch.Tensor:
    """x * rsqrt(mean(x^2) + eps) over the last axis, times the weight when there is one."""
    out = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return out if weight is None else out * weight


def rotate(x: torch.Tensor, positions: torch.Tensor, rotary: Rotary) -> torch.Tensor:
    """x (B, H, L, D) turned by its positions (L,) on the first rotary.dim features."""
    dim = rotary.dim
    inv_freq = rotary.base ** (-torch.arange(0, dim, 2, dtype=torch.float64) / dim)  # (dim/2,)
    angles = rotary.sign * positions.to(torch.float64)[:, None] * inv_freq[None, :]  # (L, dim/2)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    turned, rest = x[..., :dim], x[..., dim:]
    if rotary.interleaved:
        x1, x2 = turned[..., 0::2], turned[..., 1::2]
        pairs = torch.stack((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)  # (B, H, L, dim/2, 2)
        turned = pairs.flatten(-2)
    else:
        x1, x2 = turned[..., : dim // 2], turned[..., dim // 2:]
        turned = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return torch.cat((turned, rest), dim=-1)


def allowed(keep: torch.Tensor | None, spec: Spec, lq: int, lk: int) -> torch.Tensor:
    """The (B or 1, 1, Lq, Lk) keys each query may attend: the caller's keep mask (B|1, 1, Lq, Lk), causal
    (bottom-right) and the window."""
    rows = torch.arange(lq)[:, None] + (lk - lq)
    cols = torch.arange(lk)[None, :]
    ok = torch.ones(lq, lk, dtype=torch.bool)
    if spec.causal:
        ok &= cols <= rows
    if spec.window is not None:
        ok &= cols > rows - spec.window
    if spec.local is not None:
        ok &= (cols - rows).abs() <= spec.local
    ok = ok[None, None]
    if keep is None:
        return ok
    return ok & keep.bool()


def attend(q, k, v, ok, spec: Spec) -> torch.Tensor:
    """softmax(scale q k^T, masked) v for q (B, H, Lq, D) and k, v (B, Hkv, Lk, D|Dv) -> (B, H, Lq, Dv)."""
    group = q.shape[1] // k.shape[1]
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # (B, H, Lk, D)
    scale = spec.scale if spec.scale is not None else q.shape[-1] ** -0.5
    scores = q @ k.transpose(-2, -1) * scale  # (B, H, Lq, Lk)
    if spec.softcap is not None:
        scores = spec.softcap * torch.tanh(scores / spec.softcap)
    scores = scores.masked_fill(~ok, float("-inf"))
    if spec.sinks is not None:
        sink = spec.sinks.view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
        weights = torch.cat((scores, sink), dim=-1).softmax(dim=-1)[..., :-1]
    else:
        weights = scores.softmax(dim=-1)
    weights = torch.nan_to_num(weights, nan=0.0)  # a query with no key left reads nothing
    return weights @ v


def mha(xq: torch.Tensor, xkv: torch.Tensor, w: dict, spec: Spec, keep: torch.Tensor | None = None,
        xv: torch.Tensor | None = None) -> torch.Tensor:
    """Multi-head attention of xq (B, Lq, E) over keys from xkv (B, Lk, Ekv) and values from xv (default xkv),
    projections w['q'], w['k'], w['v'], w['o'] (w['o'] None: no output projection), and w['gate'] where the
    heads' output is gated by sigmoid(xq W_gate^T) before w['o']; keep (B|1, 1, Lq, Lk) True = may attend.
    With RoPE the queries are the last Lq positions."""
    xv = xkv if xv is None else xv
    batch, lq, lk = xq.shape[0], xq.shape[1], xkv.shape[1]
    heads, kv_heads = spec.heads, spec.kv_heads or spec.heads
    norm = spec.qk_norm
    q, k = linear(xq, w["q"]), linear(xkv, w["k"])  # (B, Lq, H*D), (B, Lk, Hkv*D)
    if norm is not None and norm.whole_width:
        q, k = rms_norm(q, norm.q_weight, norm.eps), rms_norm(k, norm.k_weight, norm.eps)
    q = q.view(batch, lq, heads, -1).transpose(1, 2)      # (B, H, Lq, D)
    k = k.view(batch, lk, kv_heads, -1).transpose(1, 2)  # (B, Hkv, Lk, D)
    v = linear(xv, w["v"]).view(batch, lk, kv_heads, -1).transpose(1, 2)  # (B, Hkv, Lk, Dv)
    if norm is not None and not norm.after_rope and not norm.whole_width:
        q, k = rms_norm(q, norm.q_weight, norm.eps), rms_norm(k, norm.k_weight, norm.eps)
    if spec.rotary is not None:
        q = rotate(q, torch.arange(lk - lq, lk), spec.rotary)
        k = rotate(k, torch.arange(lk), spec.rotary)
    if norm is not None and norm.after_rope:
        q, k = rms_norm(q, norm.q_weight, norm.eps), rms_norm(k, norm.k_weight, norm.eps)
    out = attend(q, k, v, allowed(keep, spec, lq, lk), spec)  # (B, H, Lq, Dv)
    out = out.transpose(1, 2).reshape(batch, lq, -1)          # (B, Lq, H*Dv)
    if w.get("gate") is not None:
        out = out * torch.sigmoid(linear(xq, w["gate"]))
    return out if w.get("o") is None else linear(out, w["o"])


@dataclass
class LatentSpec:
    """Multi-head latent attention's sizes (DeepSeek-V2/V3 naming)."""
    heads: int
    nope_dim: int
    rope_dim: int
    v_dim: int
    kv_rank: int
    interleaved: bool = True
    base: float = 10000.0
    eps: float = 1e-6
    scale: float | None = None  # default 1/sqrt(nope_dim + rope_dim)


def mla(x: torch.Tensor, w: dict, spec: LatentSpec) -> torch.Tensor:
    """Causal MLA on x (B, L, E), written out naively: w['q'] (one projection) or w['q_a'], w['q_norm'],
    w['q_b']; w['kv_a'] giving [latent C | rotary key R]; w['kv_norm']; w['kv_b'] giving each head's
    [k_nope | v]; w['o']."""
    batch, length, _ = x.shape
    heads, dn, dr, dv = spec.heads, spec.nope_dim, spec.rope_dim, spec.v_dim
    if "q" in w:
        q = linear(x, w["q"])
    else:
        q = linear(rms_norm(linear(x, w["q_a"]), w["q_norm"], spec.eps), w["q_b"])
    q = q.view(batch, length, heads, dn + dr).transpose(1, 2)  # (B, H, L, Dn+R)
    latent, k_rope = linear(x, w["kv_a"]).split([spec.kv_rank, dr], dim=-1)  # (B, L, C), (B, L, R)
    kv = linear(rms_norm(latent, w["kv_norm"], spec.eps), w["kv_b"])
    kv = kv.view(batch, length, heads, dn + dv).transpose(1, 2)  # (B, H, L, Dn+Dv)
    k_nope, v = kv.split([dn, dv], dim=-1)
    rotary = Rotary(dr, spec.base, spec.interleaved)
    positions = torch.arange(length)
    q_rope = rotate(q[..., dn:], positions, rotary)
    k_rope = rotate(k_rope[:, None], positions, rotary).expand(-1, heads, -1, -1)  # (B, H, L, R)
    q = torch.cat((q[..., :dn], q_rope), dim=-1)
    k = torch.cat((k_nope, k_rope), dim=-1)
    scale = spec.scale if spec.scale is not None else (dn + dr) ** -0.5
    out = attend(q, k, v, allowed(None, Spec(heads, causal=True), length, length), Spec(heads, scale=scale))
    return linear(out.transpose(1, 2).reshape(batch, length, heads * dv), w["o"])
