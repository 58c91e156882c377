"""BlockCompressor: DeepSeek V4's compressed memory, one entry for every `rate` tokens.

Shape legend: B batch, L new tokens, E embed_dim, D entry width (head_dim), m rate, n entries made by
this call, N entries in all, R rotary features, Dc = 2D with overlap, else D.

A sliding window keeps the last few tokens exactly; everything older is read through entries, each one
a learned, gated average of a block of m tokens:

    c, z     = kv_proj(x), gate_proj(x)                 (B, L, Dc) per token: a value and a gate per feature
    entry_w  = Σ_j softmax_j(z_j + bias_j) · c_j          per feature, over the m tokens j of block w
    entry_w  = RoPE(kv_norm(entry_w)) at position w · m   the last R features turn (block start)

With overlap (compressed-sparse layers, m = 4 in V4), each token projects two series of D features:
block w averages the first half of block w-1's tokens with the second half of its own, over 2m
slots, so neighbouring entries share tokens. Heavily compressed layers (m = 128) have no overlap.

A block is compressed once all its m tokens exist: a decoder carries the tokens of the unfinished block
(`pending`) and, with overlap, the last finished block's first half (`overlap`) from one call to the
next, in a CompressorState kept by the layer's cache. `turn_trailing` rotates the last R features (V4
lays each head out as [no rope | rope]); with inverse=True it turns them back.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from multihead.errors import AttentionError
from multihead.positions import RoPE
from multihead.positions.rotary import apply_rotary


def turn_trailing(x: torch.Tensor, rope: RoPE, positions: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """x (B, H, L, D) with its last R = rope.head_dim features turned to positions (L,) or (B, L) (by
    minus the angle with inverse=True, undoing the turn); the first D - R pass through."""
    R = rope.head_dim
    cos, sin = rope.cos_sin(positions, x.dtype)  # (B|1, L, R)
    turned = apply_rotary(x[..., -R:], cos, -sin if inverse else sin, rope.interleaved)
    return torch.cat((x[..., :-R], turned), dim=-1)


class CompressorState(nn.Module):
    """What a BlockCompressor carries between a decoder's calls, for B sequences of up to max_entries
    entries: entries (B, max_entries, D); pending_kv/pending_gate (B, m - 1, Dc), the unfinished block's
    tokens; with overlap, overlap_kv/overlap_gate (B, m, D), the last finished block's first half."""

    def __init__(self, batch_size: int, max_entries: int, head_dim: int, rate: int, overlap: bool, *, device=None,
                 dtype=None):
        super().__init__()
        factory = {"device": device, "dtype": dtype}
        width = 2 * head_dim if overlap else head_dim
        self.register_buffer("entries", torch.zeros(batch_size, max_entries, head_dim, **factory))
        self.register_buffer("pending_kv", torch.zeros(batch_size, rate - 1, width, **factory))
        self.register_buffer("pending_gate", torch.zeros(batch_size, rate - 1, width, **factory))
        if overlap:
            self.register_buffer("overlap_kv", torch.zeros(batch_size, rate, head_dim, **factory))
            self.register_buffer("overlap_gate", torch.zeros(batch_size, rate, head_dim, **factory))
        else:
            self.overlap_kv = self.overlap_gate = None

    def commit(self, update: Compressed, start: int, rate: int) -> None:
        """Write what a call over tokens start ... made: its new entries, the pending tokens, the overlap."""
        first, n = start // rate, update.new_entries.shape[1]
        self.entries[:, first:first + n] = update.new_entries
        pending = update.pending_kv.shape[1]
        self.pending_kv[:, :pending] = update.pending_kv
        self.pending_gate[:, :pending] = update.pending_gate
        if update.overlap_kv is not None:
            self.overlap_kv.copy_(update.overlap_kv)
            self.overlap_gate.copy_(update.overlap_gate)


@dataclass
class Compressed:
    """A compressor call's result: every entry so far (B, N, D), and what CompressorState.commit writes."""

    entries: torch.Tensor
    new_entries: torch.Tensor  # (B, n, D)
    pending_kv: torch.Tensor  # (B, p, Dc): the tokens of the block still unfinished after this call
    pending_gate: torch.Tensor
    overlap_kv: torch.Tensor | None  # (B, m, D): this call's last finished block's first half (None: unchanged)
    overlap_gate: torch.Tensor | None


class BlockCompressor(nn.Module):
    """DeepSeek V4's compressor, with transformers' weight names: kv_proj and gate_proj (E -> Dc),
    position_bias (m, Dc) added to the gates, kv_norm (RMSNorm over D).

    embed_dim E, head_dim D, rate m. overlap: blocks of 2m slots, half from the previous block
    (compressed-sparse layers). rope: an mh.RoPE over the R trailing features. norm_eps: kv_norm's epsilon.
    """

    def __init__(self, embed_dim: int, head_dim: int, rate: int, *, overlap: bool, rope: RoPE, norm_eps: float = 1e-6,
                 device: torch.device | str | None = None, dtype: torch.dtype | None = None) -> None:
        super().__init__()
        for name, value in (("embed_dim", embed_dim), ("head_dim", head_dim), ("rate", rate)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise AttentionError(f"BlockCompressor {name} must be a positive int; got {value!r}.")
        if not isinstance(rope, RoPE) or rope.head_dim > head_dim:
            raise AttentionError(f"BlockCompressor rope must be an mh.RoPE over at most head_dim={head_dim} features; "
                                 f"got {rope!r}.")
        self.head_dim, self.rate, self.overlap = head_dim, rate, overlap
        width = 2 * head_dim if overlap else head_dim
        factory = {"device": device, "dtype": dtype}
        self.kv_proj = nn.Linear(embed_dim, width, bias=False, **factory)
        self.gate_proj = nn.Linear(embed_dim, width, bias=False, **factory)
        self.position_bias = nn.Parameter(torch.zeros(rate, width, **factory))
        self.kv_norm = nn.RMSNorm(head_dim, eps=norm_eps, **factory)
        self.rope = rope

    def new_state(self, batch_size: int, max_len: int, *, dtype: torch.dtype | None = None) -> CompressorState:
        """An empty CompressorState for sequences of up to max_len tokens (max_len // m entries)."""
        weight = self.kv_proj.weight
        return CompressorState(batch_size, max_len // self.rate, self.head_dim, self.rate, self.overlap,
                               device=weight.device, dtype=dtype or weight.dtype)

    def forward(self, x: torch.Tensor, state: CompressorState | None = None, start: int = 0) -> Compressed:
        """Compress x (B, L, E), the tokens at positions start ... start + L - 1, into entries; with a
        state, after the `start` tokens it has seen (read only: commit its result to keep it)."""
        kv, gate = self.kv_proj(x), self.gate_proj(x)  # (B, L, Dc)
        m, D = self.rate, self.head_dim
        waiting = start % m if state is not None else 0
        if waiting:  # the unfinished block's first tokens, from earlier calls
            kv = torch.cat((state.pending_kv[:, :waiting].to(kv.dtype), kv), dim=1)
            gate = torch.cat((state.pending_gate[:, :waiting].to(gate.dtype), gate), dim=1)
        (B, _, Dc), n = kv.shape, kv.shape[1] // m
        chunk_kv = kv[:, :n * m].view(B, n, m, Dc)  # (B, n, m, Dc)
        chunk_gate = gate[:, :n * m].view(B, n, m, Dc) + self.position_bias
        overlap_kv = overlap_gate = None
        if self.overlap and n:
            has_prior = state is not None and start >= m
            prior = (state.overlap_kv, state.overlap_gate) if has_prior else None
            chunk_kv, chunk_gate, overlap_kv, overlap_gate = self._overlapped(chunk_kv, chunk_gate, prior)
        weights = chunk_gate.softmax(dim=2, dtype=torch.float32).to(chunk_kv.dtype)  # per feature, over the slots
        pooled = self.kv_norm((chunk_kv * weights).sum(dim=2)[..., :D])  # (B, n, D); no block: (B, 0, Dc) cut to D
        first = start // m if state is not None else 0
        positions = (first + torch.arange(n, device=x.device)) * m  # each block at its first token
        new = turn_trailing(pooled[:, None], self.rope, positions)[:, 0] if n else pooled
        entries = new if state is None or first == 0 else torch.cat((state.entries[:, :first].to(new.dtype), new), 1)
        return Compressed(entries, new, kv[:, n * m:], gate[:, n * m:], overlap_kv, overlap_gate)

    def _overlapped(self, chunk_kv, chunk_gate, prior):
        """Blocks (B, n, m, 2D) -> slots (B, n, 2m, D): the previous block's first halves (the prior's for
        block 0, or slots that weigh 0), then the block's own second halves. Also returns the last block's
        first halves (B, m, D), the next call's prior."""
        B, n, m, _ = chunk_kv.shape
        D = self.head_dim
        slots_kv = chunk_kv.new_zeros(B, n, 2 * m, D)
        slots_gate = chunk_gate.new_full((B, n, 2 * m, D), float("-inf"))
        slots_kv[:, :, m:], slots_gate[:, :, m:] = chunk_kv[..., D:], chunk_gate[..., D:]
        slots_kv[:, 1:, :m], slots_gate[:, 1:, :m] = chunk_kv[:, :-1, :, :D], chunk_gate[:, :-1, :, :D]
        if prior is not None:
            slots_kv[:, 0, :m], slots_gate[:, 0, :m] = prior[0].to(slots_kv.dtype), prior[1].to(slots_gate.dtype)
        return slots_kv, slots_gate, chunk_kv[:, -1, :, :D], chunk_gate[:, -1, :, :D]

    def extra_repr(self) -> str:
        return f"head_dim={self.head_dim}, rate={self.rate}, overlap={self.overlap}"
