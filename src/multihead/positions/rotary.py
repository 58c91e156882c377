"""Rotating features: `apply_rotary(x, cos, sin, interleaved)`, the arithmetic half of RoPE.

RoPE turns each query and key by an angle that grows with its position. The features are taken two by
two, and each pair (a, b) is a point in a plane that turns by its own angle t:

    (a, b)  ->  (a·cos t - b·sin t,  b·cos t + a·sin t)

Models disagree on which two features make a pair. Take D = 8 features and four pairs p0..p3; pair
pk turns by angle tk, and ck = cos tk (p0 turns fastest):

    half-split (GPT-NeoX, Llama; HF `rotate_half`)    interleaved (GPT-J; HF `rotate_every_two`)

    feature  0  1  2  3  4  5  6  7                   feature  0  1  2  3  4  5  6  7
    pair     p0 p1 p2 p3 p0 p1 p2 p3                  pair     p0 p0 p1 p1 p2 p2 p3 p3
    cos      c0 c1 c2 c3 c0 c1 c2 c3                  cos      c0 c0 c1 c1 c2 c2 c3 c3

    a pair is (k, k + D/2)                            a pair is (2k, 2k + 1)

Both turn every pair by the same angles; they only pair up different features. Weights trained with
one layout need that layout: the choice belongs to the checkpoint, not to taste.

Partial rotary (GPT-NeoX, Phi, GPT-J): only the first R = rotary_dim features turn; the other D - R
pass through unchanged. The layout applies inside those R features.

Shapes: B batch, H heads, L positions, D head dim, R rotary dim (even, R <= D).
"""
from __future__ import annotations

import torch

from multihead.errors import AttentionError, shape_str


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, interleaved: bool = False) -> torch.Tensor:
    """Rotate the first R features of x by the angles whose cos/sin are given.

    x: (B, H, L, D). cos, sin: (B or 1, L, R) in the layout `interleaved` names, as `RoPE.cos_sin`
    returns them. Returns a tensor shaped like x. The arithmetic runs in cos's dtype (HF casts cos/sin
    to the input dtype first; `RoPE.cos_sin(positions, x.dtype)` does the same).
    """
    _check_rotary_inputs(x, cos, sin)
    rotary_dim = cos.shape[-1]
    cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)  # (B|1, L, R) -> (B|1, 1, L, R): broadcast over heads
    turning, passing = x[..., :rotary_dim], x[..., rotary_dim:]  # (B, H, L, R), (B, H, L, D - R)
    turned = turning * cos + _quarter_turn(turning, interleaved) * sin
    if passing.shape[-1] == 0:
        return turned
    return torch.cat((turned, passing), dim=-1)  # (B, H, L, D)


def _quarter_turn(x: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """Each pair (a, b) becomes (-b, a): the 90° turn that, weighted by sin, completes the rotation."""
    if interleaved:
        evens, odds = x[..., 0::2], x[..., 1::2]  # (..., R/2) each: a and b of every pair
        return torch.stack((-odds, evens), dim=-1).flatten(-2)  # (..., R/2, 2) -> (..., R)
    half = x.shape[-1] // 2
    first, second = x[..., :half], x[..., half:]  # (..., R/2) each: a and b of every pair
    return torch.cat((-second, first), dim=-1)  # (..., R)


def _check_rotary_inputs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    for name, t in (("x", x), ("cos", cos), ("sin", sin)):
        if not isinstance(t, torch.Tensor) or not t.is_floating_point():
            got = type(t).__name__ if not isinstance(t, torch.Tensor) else f"dtype {t.dtype}"
            raise AttentionError(f"apply_rotary expects {name} as a floating tensor; got {got}.")
    if x.dim() != 4:
        raise AttentionError(f"apply_rotary expects x shaped (B, H, L, D); got {shape_str(x.shape)}.")
    if cos.shape != sin.shape:
        raise AttentionError(
            f"apply_rotary expects cos and sin of one shape; got cos {shape_str(cos.shape)}, "
            f"sin {shape_str(sin.shape)}."
        )
    B, _, L, D = x.shape
    if cos.dim() != 3 or cos.shape[0] not in (1, B) or cos.shape[1] != L:
        raise AttentionError(
            f"apply_rotary expects cos/sin shaped (B or 1, L, R) = ({B} or 1, {L}, R) for x "
            f"{shape_str(x.shape)}; got {shape_str(cos.shape)}."
        )
    R = cos.shape[-1]
    if R % 2 or not 0 < R <= D:
        raise AttentionError(
            f"apply_rotary expects an even rotary dim R with 0 < R <= D={D}; got R={R}."
        )
    if cos.device != x.device or sin.device != x.device:
        raise AttentionError(
            f"apply_rotary expects cos/sin on x's device {x.device}; got {cos.device} and {sin.device}."
        )
