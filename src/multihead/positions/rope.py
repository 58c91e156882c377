"""RoPE: rotary position embedding (Su et al., "RoFormer", 2021) as a module: `q, k = rope(q, k, positions)`.

Every query and key is turned by an angle proportional to its absolute position (see `rotary` for the
two feature layouts). A turned query q_i and key k_j then meet as  q·R(i)ᵀR(j)·k = q·R(j - i)·k : their
score depends on j - i alone, and turning keeps every vector's length.

Positions are absolute. With a KV cache the new tokens sit after what is cached, so positions start at
each sequence's cached length, and may differ from row to row:

    rope(q, k, torch.arange(L))                     # (L,): one prompt layout for the whole batch
    rope(q, k, lengths[:, None] + torch.arange(L))  # (B, L): row b continues at lengths[b]

Shapes: B batch, H query heads, Hkv key heads, L new positions, D head dim, R rotary dim.
    q (B, H, L, D)   k (B, Hkv, L, D)   positions (L,) or (B, L) (or (1, L)), integers
    cos, sin (B or 1, L, R)

Angles are computed in float32 (positions · inv_freq, as HF does), then cast to the input dtype.
`__call__` reads no value back to the host, so it compiles with fullgraph=True and exports. Negative
positions are therefore not rejected (that check would need a value on the host): they turn backwards.

Dynamic NTK keeps state, exactly as HF's rotary embedding does: it remembers the longest sequence it has
seen (the `seen_length` buffer, starting at the original length N). A call whose positions reach past it
grows the base; a call that stays within N goes back to plain RoPE; a call in between reuses the longest
base seen. The longest position is taken over the whole batch, so all rows share one base, as in HF.
"""
from __future__ import annotations

from typing import Any, Mapping

import torch
from torch import nn

from multihead.errors import AttentionError, shape_str
from multihead.positions.rope_scaling import RopeScaling, frequencies, grown_frequencies, long_frequencies
from multihead.positions.rotary import apply_rotary


class RoPE(nn.Module):
    """Rotary position embedding for queries and keys. No parameters; `inv_freq` (R/2,) is a buffer.

    head_dim: D, even. base: the wavelength base (HF `rope_theta`). interleaved: False for the GPT-NeoX /
    Llama half-split layout, True for GPT-J's interleaved pairs. rotary_dim: R, the number of leading
    features that turn (default D; even, <= D). scaling: an HF rope_scaling / rope_parameters dict (kinds
    default, linear, dynamic, llama3, yarn, longrope), or None. max_position: the model's context length (HF
    `max_position_embeddings`): the original length N for dynamic NTK, and llama3's N when its dict has
    none. device: where the buffers live. dtype: the default dtype of `cos_sin`; angles and `inv_freq`
    stay float32 whatever `.to()` is asked.
    """

    inv_freq: torch.Tensor

    def __init__(self, head_dim: int, base: float = 10000.0, interleaved: bool = False, rotary_dim: int | None = None,
                 scaling: Mapping[str, Any] | None = None, *, max_position: int | None = None,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None):
        super().__init__()
        self.scaling = RopeScaling.parse(scaling, max_position=_optional_int(max_position, "max_position"))
        self.head_dim = _even_int(head_dim, "head_dim", upper=None)
        self.base = _base(base, self.scaling.theta)
        self.rotary_dim = _rotary_dim(self.head_dim, rotary_dim, self.scaling.partial_rotary_factor)
        if not isinstance(interleaved, bool):
            raise AttentionError(f"RoPE interleaved must be True or False; got {interleaved!r}.")
        if self.scaling.kind == "dynamic" and self.rotary_dim == 2:
            raise AttentionError("RoPE dynamic NTK scaling expects rotary_dim > 2 (it divides by R - 2); got 2.")
        if dtype is not None and (not isinstance(dtype, torch.dtype) or not dtype.is_floating_point):
            raise AttentionError(f"RoPE dtype must be a floating dtype or None; got {dtype}.")
        self.interleaved = interleaved
        self.max_position = max_position
        self.dtype = dtype
        inv_freq = frequencies(self.scaling, self.base, self.rotary_dim, device)  # (R/2,) float32
        self.register_buffer("inv_freq", inv_freq, persistent=False)
        if self.scaling.kind == "dynamic":
            seen = torch.tensor(self.scaling.original_length, dtype=torch.int64, device=device)
            self.register_buffer("seen_length", seen, persistent=False)
        if self.scaling.kind == "longrope":
            long = long_frequencies(self.scaling, self.base, self.rotary_dim, device)  # (R/2,) float32
            self.register_buffer("long_inv_freq", long, persistent=False)

    def forward(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Turn q (B, H, L, D) and k (B, Hkv, L, D) to their positions (L,) or (B, L); shapes unchanged."""
        self._check_qk(q, k, positions)
        cos, sin = self._cos_sin_fp32(positions)  # (B|1, L, R) each
        q_cos, q_sin = cos.to(q.dtype), sin.to(q.dtype)
        k_cos, k_sin = (q_cos, q_sin) if k.dtype == q.dtype else (cos.to(k.dtype), sin.to(k.dtype))
        return apply_rotary(q, q_cos, q_sin, self.interleaved), apply_rotary(k, k_cos, k_sin, self.interleaved)

    def cos_sin(self, positions: torch.Tensor, dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin (B or 1, L, R) for positions (L,) or (B, L), in this module's layout, cast to `dtype`
        (default: the module's dtype, else float32). Like HF's rotary embedding forward, this is where
        dynamic NTK updates its state."""
        _check_positions(positions)
        self._check_device(positions.device)
        dtype = next(d for d in (dtype, self.dtype, torch.float32) if d is not None)
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            raise AttentionError(f"RoPE.cos_sin expects a floating dtype; got {dtype!r}.")
        cos, sin = self._cos_sin_fp32(positions)
        return cos.to(dtype), sin.to(dtype)

    # ---------------------------------------------------------------- angles
    def _cos_sin_fp32(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        inv_freq = self._current_frequencies(positions)  # (R/2,) float32
        angles = positions[..., None].to(torch.float32) * inv_freq  # (L,) or (B, L) -> (L, R/2) or (B, L, R/2)
        if angles.dim() == 2:
            angles = angles.unsqueeze(0)  # (L, R/2) -> (1, L, R/2)
        cos, sin = angles.cos(), angles.sin()  # (B|1, L, R/2): one value per pair
        if self.scaling.attention_factor != 1.0:  # yarn, longrope: scores grow by its square
            cos, sin = cos * self.scaling.attention_factor, sin * self.scaling.attention_factor
        if self.interleaved:  # c0 c0 c1 c1 ...: both features of pair k sit side by side
            return cos.repeat_interleave(2, dim=-1), sin.repeat_interleave(2, dim=-1)  # (B|1, L, R)
        return torch.cat((cos, cos), dim=-1), torch.cat((sin, sin), dim=-1)  # c0 c1 ... c0 c1 ...: (B|1, L, R)

    def _current_frequencies(self, positions: torch.Tensor) -> torch.Tensor:
        """inv_freq for this call; dynamic NTK first updates `seen_length`, on the device, in place."""
        if self.scaling.kind == "longrope" and positions.numel():  # past N: the long factors, for this call
            reach = positions.amax() + 1  # 0-dim, on the device
            return torch.where(reach > self.scaling.original_length, self.long_inv_freq, self.inv_freq)
        if self.scaling.kind != "dynamic" or positions.numel() == 0:
            return self.inv_freq
        original = self.scaling.original_length
        seen = positions.amax().to(torch.int64) + 1  # 0-dim: the sequence length this call reaches
        longest = torch.maximum(seen, self.seen_length)
        length = torch.where(seen < original, original, longest)  # back inside N: plain RoPE again (as HF)
        self.seen_length.copy_(length)
        grown = grown_frequencies(self.scaling, self.base, self.rotary_dim, length)
        return torch.where(length > original, grown, self.inv_freq)

    def _apply(self, fn, recurse=True):
        # .half() / .to(bfloat16) cast every float buffer; angles need float32 frequencies, so rebuild them.
        super()._apply(fn, recurse)
        if self.inv_freq.dtype != torch.float32:
            self.inv_freq = frequencies(self.scaling, self.base, self.rotary_dim, self.inv_freq.device)
        if self.scaling.kind == "longrope" and self.long_inv_freq.dtype != torch.float32:
            self.long_inv_freq = long_frequencies(self.scaling, self.base, self.rotary_dim, self.inv_freq.device)
        return self

    def extra_repr(self) -> str:
        return (f"head_dim={self.head_dim}, rotary_dim={self.rotary_dim}, base={self.base}, "
                f"interleaved={self.interleaved}, scaling={self.scaling.kind!r}")

    # ---------------------------------------------------------------- checks (shapes and dtypes only)
    def _check_qk(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> None:
        for name, t, heads in (("q", q, "H"), ("k", k, "Hkv")):
            if not isinstance(t, torch.Tensor) or not t.is_floating_point() or t.dim() != 4:
                got = f"{t.dtype} {shape_str(t.shape)}" if isinstance(t, torch.Tensor) else type(t).__name__
                raise AttentionError(f"RoPE expects {name} as a floating tensor (B, {heads}, L, D); got {got}.")
            if t.shape[-1] != self.head_dim:
                raise AttentionError(
                    f"RoPE(head_dim={self.head_dim}) expects {name}'s last dim D={self.head_dim}; "
                    f"got {name} {shape_str(t.shape)}."
                )
        if (k.shape[0], k.shape[2]) != (q.shape[0], q.shape[2]) or k.device != q.device:
            raise AttentionError(
                f"RoPE expects k (B, Hkv, L, D) with q's B and L on q's device; got q {shape_str(q.shape)} "
                f"on {q.device}, k {shape_str(k.shape)} on {k.device}."
            )
        _check_positions(positions)
        B, L = q.shape[0], q.shape[2]
        if positions.shape[-1] != L or (positions.dim() == 2 and positions.shape[0] not in (1, B)):
            raise AttentionError(
                f"RoPE expects positions shaped (L,) = ({L},) or (B, L) = ({B}, {L}) (or (1, {L})) for q "
                f"{shape_str(q.shape)}; got {shape_str(positions.shape)}."
            )
        if positions.device != q.device:
            raise AttentionError(f"RoPE expects positions on q's device {q.device}; got {positions.device}.")
        self._check_device(q.device)

    def _check_device(self, device: torch.device) -> None:
        if self.inv_freq.device != device:
            raise AttentionError(
                f"RoPE's buffers are on {self.inv_freq.device} but the inputs are on {device}; "
                "expected one device (move the module with .to(device))."
            )


def _check_positions(positions: torch.Tensor) -> None:
    if not isinstance(positions, torch.Tensor):
        raise AttentionError(f"RoPE expects positions as an integer tensor; got {type(positions).__name__}.")
    if positions.is_floating_point() or positions.is_complex() or positions.dtype == torch.bool:
        raise AttentionError(f"RoPE expects integer positions (e.g. torch.long); got dtype {positions.dtype}.")
    if positions.dim() not in (1, 2):
        raise AttentionError(f"RoPE expects positions shaped (L,) or (B, L); got {shape_str(positions.shape)}.")


def _even_int(value: Any, name: str, upper: int | None) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 2 or value % 2:
        raise AttentionError(f"RoPE {name} must be an even integer >= 2; got {value!r}.")
    if upper is not None and value > upper:
        raise AttentionError(f"RoPE {name} must be <= head_dim={upper}; got {value}.")
    return value


def _optional_int(value: Any, name: str) -> int | None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        raise AttentionError(f"RoPE {name} must be a positive integer or None; got {value!r}.")
    return value


def _base(base: Any, theta: float | None) -> float:
    if isinstance(base, bool) or not isinstance(base, (int, float)) or not 1 < base < float("inf"):
        raise AttentionError(f"RoPE base must be a finite number > 1; got {base!r}.")
    if theta is not None and theta != base:
        raise AttentionError(f"RoPE scaling's rope_theta must equal base={base}; got {theta}.")
    return float(base)


def _rotary_dim(head_dim: int, rotary_dim: int | None, fraction: float | None) -> int:
    from_fraction = None if fraction is None else int(head_dim * fraction)
    if rotary_dim is None:
        rotary_dim = head_dim if from_fraction is None else from_fraction
    elif from_fraction is not None and from_fraction != rotary_dim:
        raise AttentionError(
            f"RoPE rotary_dim={rotary_dim} disagrees with the scaling dict's partial_rotary_factor={fraction} "
            f"(head_dim * factor = {from_fraction}); expected them equal, or only one given."
        )
    return _even_int(rotary_dim, "rotary_dim", upper=head_dim)
