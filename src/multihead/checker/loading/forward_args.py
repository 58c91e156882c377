"""Forward arguments the checker fills in on every call, by their names: what the learner's model would hand
the layer besides the hidden states.

* a start position (``start_pos``, ``offset``...): 0, the call is the whole prompt;
* token positions (``token_positions``, ``position_ids``, ``cache_position``...): 0 ... L-1, as (1, L);
* a complex rotary table (``freqs_cis``, DeepSeek-V3's and Llama's reference code): (L, R/2) complex,
  position t turned by t * 10000^(-2i/R), R the rotary size the module runs with (``choose_sizes``);
* HF's ``position_embeddings`` = (cos, sin), each (1, L, D) in the half-split layout ``cat(f, f)``;
* ``cos`` and ``sin`` as two arguments (``rotate_half`` code): each (L, R), the same half-split layout;
* RoFormer's ``sinusoidal_pos``: (1, 1, L, R) = [sin | cos] of the angles, each half (L, R/2).

The checker then finds the rotation by behaviour as for any module (``rotary.py``): the table it hands over
is one of the RoPE variants it tries.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from multihead.convert.rope_bases import DEFAULT_ROPE_BASE

START_NAMES = ("start_pos", "start_position", "offset", "past_length", "past_len", "start_index", "start")
POSITION_NAMES = ("token_positions", "position_ids", "positions", "pos_ids", "input_pos", "cache_position",
                  "position_idx", "pos_idx")
TABLE_NAMES = ("freqs_cis", "freq_cis", "pos_cis", "freqs_complex", "freqs")
COS_SIN_NAMES = ("position_embeddings", "cos_sin", "rotary_pos_emb")
COS_NAMES = ("cos", "freqs_cos", "rope_cos")
SIN_NAMES = ("sin", "freqs_sin", "rope_sin")
SINUSOIDAL_NAMES = ("sinusoidal_pos", "sinusoidal_pos_emb", "sinusoidal_position_embeddings")
TABLE_KINDS = ("table", "cos_sin", "cos", "sin", "sinusoidal")  # the kinds whose rotary size is chosen (choose_sizes)
KINDS = {**{n: "start" for n in START_NAMES}, **{n: "positions" for n in POSITION_NAMES},
         **{n: "table" for n in TABLE_NAMES}, **{n: "cos_sin" for n in COS_SIN_NAMES},
         **{n: "cos" for n in COS_NAMES}, **{n: "sin" for n in SIN_NAMES},
         **{n: "sinusoidal" for n in SINUSOIDAL_NAMES}}
ROTARY_SIZE_NAMES = ("qk_rope_head_dim", "rope_head_dim", "qk_rope_dim", "rotary_dim", "rope_dim", "rotary_ndims",
                     "head_dim", "d_head", "head_size", "dim_head", "d_k")


@dataclass
class Filler:
    """One forward argument the checker fills in: ``kind`` "start", "positions", "table", "cos_sin", "cos",
    "sin" or "sinusoidal"; ``size``: the table's rotary size R (the TABLE_KINDS), None until chosen."""

    name: str
    kind: str
    size: int | None = None

    def value(self, x: torch.Tensor):
        """The argument for a call on batch-first x (B, L, E)."""
        L = x.shape[1]
        if self.kind == "start":
            return 0
        positions = torch.arange(L)
        if self.kind == "positions":
            return positions[None]  # (1, L)
        R = self.size or 2
        freqs = DEFAULT_ROPE_BASE ** (-torch.arange(0, R, 2, dtype=torch.float64) / R)
        angles = positions.double()[:, None] * freqs  # (L, R/2)
        if self.kind == "table":
            complex_dtype = torch.complex128 if x.dtype == torch.float64 else torch.complex64
            return torch.polar(torch.ones_like(angles), angles).to(complex_dtype)  # (L, R/2)
        if self.kind == "sinusoidal":
            return torch.cat((angles.sin(), angles.cos()), dim=-1)[None, None].to(x.dtype)  # (1, 1, L, R)
        table = torch.cat((angles, angles), dim=-1)  # (L, R)
        if self.kind == "cos":
            return table.cos().to(x.dtype)
        if self.kind == "sin":
            return table.sin().to(x.dtype)
        return table[None].cos().to(x.dtype), table[None].sin().to(x.dtype)  # (1, L, R) each


def filler_for(name: str) -> Filler | None:
    """The Filler for a forward parameter named ``name``, or None."""
    kind = KINDS.get(name)
    return None if kind is None else Filler(name, kind)


def size_candidates(width: int, heads: int | None, named: dict) -> list[int]:
    """The rotary sizes to try for a table, most likely first: a size the constructor names (qk_rope_head_dim,
    head_dim...), the head size for the head count given, then every even size down from the width."""
    found = [named.get(n) for n in ROTARY_SIZE_NAMES]
    found += [width // heads] if heads and width % heads == 0 else []
    found += list(range(width - width % 2, 1, -2))
    return list(dict.fromkeys(v for v in found if isinstance(v, int) and not isinstance(v, bool) and v > 0
                              and v % 2 == 0))


def choose_sizes(fillers: list[Filler], runs, width: int, heads: int | None, named: dict) -> None:
    """Give the table fillers (one rotary size for all: ``cos`` and ``sin`` go together) the first candidate
    size (``size_candidates``) under which ``runs()`` (one call of the module) returns True."""
    tables = [f for f in fillers if f.kind in TABLE_KINDS]
    for size in size_candidates(width, heads, named) if tables else ():
        for filler in tables:
            filler.size = size
        if runs():
            return
    for filler in tables:
        filler.size = None
