"""The conformance suite's float64 reference, written from each constructor's stated convention.

A `PartSpec` is one mask part as raw data (the tensors a user has) plus its kind. From it come
- the project's Mask (`build_mask`, through the public constructors), and
- this file's own dense evaluation (`dense_terms`): a bool keep grid (B, H, Lq, Lk) and the score
  terms in part order, computed with plain tensor code from the conventions in the README's "Masks"
  table. It never calls Mask.dense, Index or a backend, so a wrong mask form in the project shows up.

`reference_attention` is plain attention on those terms: float64 throughout, or "the same-dtype
reference math" (matmuls in the input dtype, softmax in float32) whose drift sets the tolerance.
Shapes: q (B, H, Lq, D), k and v (B, Hkv, Lk, D); keep (B, H, Lq, Lk).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from multihead import Mask


@dataclass
class PartSpec:
    """One mask part: kind and its raw arguments (tensors as the user passes them)."""

    kind: str
    args: dict = field(default_factory=dict)

    def __repr__(self) -> str:
        shown = {n: (tuple(a.shape) if isinstance(a, torch.Tensor) else getattr(a, "__name__", a))
                 for n, a in self.args.items()}
        return f"{self.kind}{shown}"


# ---------------------------------------------------------------- the project's masks, from the raw data
def build_part(spec: PartSpec) -> Mask:
    a = spec.args
    if spec.kind == "keep":
        return Mask.keep(a["t"])
    if spec.kind == "block":
        return Mask.block(a["t"])
    if spec.kind == "additive":
        return Mask.additive(a["t"])
    if spec.kind == "lengths":
        return Mask.lengths(a["valid"], a.get("query"))
    if spec.kind == "key_padding":
        return Mask.key_padding(a["pad"])
    if spec.kind == "causal":
        return Mask.causal(a["align"])
    if spec.kind == "window":
        return Mask.window(a["size"], a["align"])
    if spec.kind == "chunks":
        return Mask.chunks(a["size"], a["align"])
    if spec.kind == "alibi":
        return Mask.alibi(a["slopes"], a["align"])
    if spec.kind == "segments":
        return Mask.segments(a["ids"], a["key_ids"])
    if spec.kind == "sparse":
        return Mask.sparse(a["indices"])
    if spec.kind == "mask_mod":
        return Mask.mask_mod(a["fn"])
    if spec.kind == "score_mod":
        return Mask.score_mod(a["fn"])
    raise KeyError(spec.kind)


def build_mask(specs: list[PartSpec]) -> Mask | None:
    mask = None
    for spec in specs:
        part = build_part(spec)
        mask = part if mask is None else mask & part
    return mask


# ---------------------------------------------------------------- the reference's own dense evaluation
def grid_indices(B: int, H: int, Lq: int, Lk: int):
    """(b, h, i, j) as int64 tensors (B, 1, 1, 1), (1, H, 1, 1), (1, 1, Lq, 1), (1, 1, 1, Lk)."""
    return (torch.arange(B).view(-1, 1, 1, 1), torch.arange(H).view(1, -1, 1, 1), torch.arange(Lq).view(1, 1, -1, 1),
            torch.arange(Lk).view(1, 1, 1, -1))


def extents(specs: list[PartSpec], B: int, Lq: int, Lk: int):
    """(valid queries (B,), valid keys (B,)): from the one Mask.lengths with (B,) lengths, else Lq and Lk."""
    found = [s for s in specs if s.kind == "lengths" and s.args["valid"].dim() == 1]
    if len(found) != 1:
        return torch.full((B,), Lq), torch.full((B,), Lk)
    a = found[0].args
    q = a.get("query")
    return (torch.full((B,), Lq) if q is None else q.long().cpu()), a["valid"].long().cpu()


def query_position(align: str, i, b, q_ext, k_ext):
    """i, or bottom-right: i + valid keys - valid queries of row b."""
    return i if align == "top_left" else i + (k_ext[b] - q_ext[b])


def dense_terms(specs: list[PartSpec], B: int, H: int, Lq: int, Lk: int):
    """(keep (B, H, Lq, Lk) bool, [score term: function scores64 -> scores64]) in part order."""
    b, h, i, j = grid_indices(B, H, Lq, Lk)
    full = (B, H, Lq, Lk)
    q_ext, k_ext = extents(specs, B, Lq, Lk)
    keep = torch.ones(B, H, Lq, Lk, dtype=torch.bool)
    terms = []
    for spec in specs:
        a = spec.args
        kind = spec.kind
        if kind in ("keep", "block"):
            t = torch.broadcast_to(a["t"].cpu() != 0, full)
            keep = keep & (t if kind == "keep" else ~t)
        elif kind == "additive":
            t = torch.broadcast_to(a["t"].cpu().double(), full)
            keep = keep & (t != float("-inf"))
            offsets = torch.where(t == float("-inf"), 0.0, t)
            terms.append(lambda s, o=offsets: s + o)
        elif kind == "lengths":
            valid = a["valid"].cpu().long()
            if valid.dim() == 1:
                keep = keep & (j < valid[b])
            else:
                keep = keep & (j < valid[b, i])
            if a.get("query") is not None:
                keep = keep & (i < a["query"].cpu().long()[b])
        elif kind == "key_padding":
            keep = keep & (~(a["pad"].cpu() != 0)[b, j])
        elif kind == "causal":
            keep = keep & (j <= query_position(a["align"], i, b, q_ext, k_ext))
        elif kind == "window":
            keep = keep & (j > query_position(a["align"], i, b, q_ext, k_ext) - a["size"])
        elif kind == "chunks":  # same chunk of `size` positions: floor division of both positions
            position = query_position(a["align"], i, b, q_ext, k_ext)
            keep = keep & (torch.div(j, a["size"], rounding_mode="floor")
                           == torch.div(position, a["size"], rounding_mode="floor"))
        elif kind == "alibi":
            slopes = a["slopes"].cpu().double()
            distance = (query_position(a["align"], i, b, q_ext, k_ext) - j).double()
            terms.append(lambda s, d=-slopes[h] * distance: s + d)
        elif kind == "segments":
            keep = keep & (a["ids"].cpu()[b, i] == a["key_ids"].cpu()[b, j])
        elif kind == "sparse":  # key j is kept where some slot of the query's list names it
            lists = a["indices"].cpu().long()
            lists = lists[:, None] if lists.dim() == 3 else lists  # (B, 1 or H, Lq, K)
            listed = (lists[..., None] == torch.arange(Lk)).any(-2)  # (B, 1 or H, Lq, Lk); -1 names no key
            keep = keep & listed
        elif kind == "mask_mod":
            keep = keep & (a["fn"](b, h, i, j).cpu())
        elif kind == "score_mod":
            terms.append(lambda s, fn=a["fn"]: torch.broadcast_to(fn(s, b, h, i, j), s.shape).to(s.dtype))
        else:
            raise KeyError(kind)
    return keep, terms


def hidden_keys(specs: list[PartSpec], B: int, H: int, Lq: int, Lk: int) -> torch.Tensor:
    """(B, Lk) bool: keys that the key-level kinds (padding, lengths) let no query see (must be inert)."""
    level = [s for s in specs if s.kind in ("key_padding", "lengths")]
    keep, _ = dense_terms(level, B, H, Lq, Lk)
    if Lq == 0:
        return torch.zeros(B, Lk, dtype=torch.bool)
    return ~keep.any(dim=2).any(dim=1)


def reference_attention(q, k, v, specs, *, scale=None, softcap=None, sinks=None, dtype=torch.float64,
                        terms=None):
    """Attention on the reference's own dense terms. dtype float64: everything in float64; another dtype:
    the same-dtype reference math (inputs and matmuls in dtype, scores and softmax in float32).

    Keys no query may see are zeroed first; rows that keep no key are exactly 0 (zero gradient).
    terms: a precomputed dense_terms(...) (keep, score terms). Returns (B, H, Lq, Dv) in dtype.
    """
    B, H, Lq, D = q.shape
    Hkv, Lk = k.shape[1], k.shape[2]
    keep, score_terms = terms if terms is not None else dense_terms(specs, B, H, Lq, Lk)
    keep = keep.to(q.device)
    q, k, v = q.to(dtype), k.to(dtype), v.to(dtype)
    seen = keep.any(dim=2).any(dim=1)[:, None, :, None]  # (B, 1, Lk, 1): keys some query keeps
    k = torch.where(seen, k, torch.zeros((), dtype=dtype))
    v = torch.where(seen, v, torch.zeros((), dtype=dtype))
    group = H // Hkv
    k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    soft = torch.float64 if dtype == torch.float64 else torch.float32
    scale = D ** -0.5 if scale is None else scale
    s = (q @ k.transpose(-1, -2)).to(soft) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    for term in score_terms:
        s = term(s.to(torch.float64)).to(soft) if soft != torch.float64 else term(s)
    dead = ~keep.any(dim=-1, keepdim=True)  # (B, H, Lq, 1)
    s = torch.where(keep, s, float("-inf"))
    s = torch.where(dead, 0.0, s)  # a finite row, zeroed below: exact 0 and zero gradient
    if sinks is not None:
        sink = sinks.to(soft).view(1, H, 1, 1).expand(B, H, Lq, 1)
        w = torch.softmax(torch.cat([s, sink], dim=-1), dim=-1)[..., :-1]
    else:
        w = torch.softmax(s, dim=-1)
    w = torch.where(keep, w, 0.0)
    return w.to(dtype) @ v

