"""MultiHeadAttention: project -> split heads -> attend -> merge heads -> project. Nothing else.

Shape legend: B batch, Lq/Lk lengths, E embed_dim (query features), H heads, Hkv kv heads,
D head_dim, O out_dim. With batch_first=False the inputs and output are (L, B, features).
"""
from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from multihead.attention import attention
from multihead.errors import AttentionError, shape_str

PROJECTIONS = ("q", "k", "v", "out")


def resolve_bias(bias) -> dict[str, bool]:
    """bias=True/False for all four projections, or a dict overriding some of them (others True)."""
    if isinstance(bias, bool):
        return dict.fromkeys(PROJECTIONS, bias)
    if isinstance(bias, Mapping):
        unknown = set(bias) - set(PROJECTIONS)
        if unknown:
            raise AttentionError(f"bias keys must be among {PROJECTIONS}; got {sorted(unknown)}.")
        return {name: bool(bias.get(name, True)) for name in PROJECTIONS}
    raise AttentionError(f"bias must be a bool or a dict like {{'q': False, 'k': False}}; got {bias!r}.")


class MultiHeadAttention(nn.Module):
    """Multi-head attention with projections q_proj, k_proj, v_proj, out_proj.

    embed_dim E: query features. kdim/vdim: key/value features (default E). head_dim D: per-head
    width (default E // num_heads; set it when the inner width H*D differs from E, as d2l's
    num_hiddens does). num_kv_heads: fewer key/value heads (GQA/MQA). out_dim: output features
    (default E). bias: True, False, or per projection {"q": False, "k": False} (others True).
    causal=True makes every call causal (a decoder's self-attention, or a converted module whose
    source applied its causal mask inside forward); forward's causal=True adds it per call.
    """

    def __init__(self, embed_dim, num_heads, *, kdim=None, vdim=None, head_dim=None, num_kv_heads=None,
                 out_dim=None, bias=True, dropout=0.0, batch_first=True, causal=False, backend="auto",
                 device=None, dtype=None):
        super().__init__()
        for name, value in (("embed_dim", embed_dim), ("num_heads", num_heads)):
            if not isinstance(value, int) or value <= 0:
                raise AttentionError(f"{name} must be a positive int; got {value!r}.")
        if head_dim is None:
            if embed_dim % num_heads:
                raise AttentionError(
                    f"embed_dim={embed_dim} is not divisible by num_heads={num_heads}; "
                    "choose them so each head gets embed_dim // num_heads features, or pass head_dim."
                )
            head_dim = embed_dim // num_heads
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if not isinstance(num_kv_heads, int) or num_kv_heads <= 0 or num_heads % num_kv_heads:
            raise AttentionError(
                f"num_kv_heads={num_kv_heads!r} must be a positive divisor of num_heads={num_heads}."
            )
        for name, value in (("head_dim", head_dim), ("kdim", kdim), ("vdim", vdim), ("out_dim", out_dim)):
            if value is not None and (not isinstance(value, int) or value <= 0):
                raise AttentionError(f"{name} must be a positive int; got {value!r}.")
        if not (isinstance(dropout, (int, float)) and 0.0 <= dropout < 1.0):
            raise AttentionError(f"dropout must be a probability in [0, 1); got {dropout!r}.")
        for name, flag in (("batch_first", batch_first), ("causal", causal)):
            if not isinstance(flag, bool):
                raise AttentionError(f"{name} must be True or False; got {flag!r}.")
        from multihead.dispatch import backend_names

        if backend != "auto" and backend not in backend_names():
            raise AttentionError(f"backend must be 'auto' or one of {backend_names()}; got {backend!r}.")

        self.embed_dim, self.num_heads, self.num_kv_heads, self.head_dim = embed_dim, num_heads, num_kv_heads, head_dim
        self.kdim, self.vdim = kdim or embed_dim, vdim or embed_dim
        self.out_dim = out_dim or embed_dim
        self.dropout, self.batch_first, self.causal, self.backend = float(dropout), batch_first, causal, backend
        biases = resolve_bias(bias)
        factory = {"device": device, "dtype": dtype}
        self.q_proj = nn.Linear(embed_dim, num_heads * head_dim, bias=biases["q"], **factory)
        self.k_proj = nn.Linear(self.kdim, num_kv_heads * head_dim, bias=biases["k"], **factory)
        self.v_proj = nn.Linear(self.vdim, num_kv_heads * head_dim, bias=biases["v"], **factory)
        self.out_proj = nn.Linear(num_heads * head_dim, self.out_dim, bias=biases["out"], **factory)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform projections and zero biases, as torch.nn.MultiheadAttention starts."""
        for proj in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            nn.init.xavier_uniform_(proj.weight)
            if proj.bias is not None:
                nn.init.zeros_(proj.bias)

    def forward(self, query, key=None, value=None, *, mask=None, causal=False):
        """query (B, Lq, E); key (B, Lk, kdim) and value (B, Lk, vdim) default to query (self-attention).

        Seq-first (L, B, features) when batch_first=False; unbatched (L, features) also works.
        mask: a `Mask` broadcastable to (B, H, Lq, Lk) (e.g. Mask.key_padding(pad), True = padding).
        causal=True adds Mask.causal() (always on when the module was built with causal=True). Returns (B, Lq, out_dim) in the input layout.
        """
        key = query if key is None else key
        value = key if value is None else value
        unbatched = isinstance(query, torch.Tensor) and query.dim() == 2
        query, key, value = self._batch_first_view(query, key, value, unbatched)
        B, Lq, _ = query.shape
        Lk = key.shape[1]
        H, Hkv, D = self.num_heads, self.num_kv_heads, self.head_dim
        q = F.linear(query, self.q_proj.weight, self.q_proj.bias).view(B, Lq, H, D).transpose(1, 2)  # (B, H, Lq, D)
        k = F.linear(key, self.k_proj.weight, self.k_proj.bias).view(B, Lk, Hkv, D).transpose(1, 2)  # (B, Hkv, Lk, D)
        v = F.linear(value, self.v_proj.weight, self.v_proj.bias).view(B, Lk, Hkv, D).transpose(1, 2)  # (B, Hkv, Lk, D)
        out = attention(q, k, v, mask, causal=causal or self.causal, dropout=self.dropout if self.training else 0.0,
                        backend=self.backend)  # (B, H, Lq, D)
        out = out.transpose(1, 2).reshape(B, Lq, H * D)  # merge heads: (B, Lq, H*D)
        out = F.linear(out, self.out_proj.weight, self.out_proj.bias)  # (B, Lq, O)
        if unbatched:
            return out[0]
        return out if self.batch_first else out.transpose(0, 1)

    def _batch_first_view(self, query, key, value, unbatched):
        """Check ranks, features, lengths, dtypes; return (B, L, features) views of the three inputs."""
        names = ("query", "key", "value")
        features = (self.embed_dim, self.kdim, self.vdim)
        layout = "(L, features)" if unbatched else ("(B, L, features)" if self.batch_first else "(L, B, features)")
        param = self.q_proj.weight
        for name, t, width in zip(names, (query, key, value), features):
            if not isinstance(t, torch.Tensor):
                raise AttentionError(f"{name} must be a torch.Tensor; got {type(t).__name__}.")
            if t.dim() != (2 if unbatched else 3):
                raise AttentionError(
                    f"{name} must be {layout} with batch_first={self.batch_first}; got shape {shape_str(t.shape)}."
                )
            if t.shape[-1] != width:
                raise AttentionError(f"{name} must have {width} features (last dim); got shape {shape_str(t.shape)}.")
            if t.dtype != param.dtype or t.device != param.device:
                raise AttentionError(
                    f"{name} is {t.dtype} on {t.device} but the module's parameters are {param.dtype} on "
                    f"{param.device}; convert one of them with .to()."
                )
        if unbatched:
            query, key, value = query[None], key[None], value[None]
        elif not self.batch_first:
            query, key, value = query.transpose(0, 1), key.transpose(0, 1), value.transpose(0, 1)
        if key.shape[:2] != value.shape[:2]:
            raise AttentionError(
                f"key and value must have the same batch and length; got key {shape_str(key.shape)} "
                f"and value {shape_str(value.shape)} (as batch-first)."
            )
        if key.shape[0] != query.shape[0]:
            raise AttentionError(f"query has batch {query.shape[0]} but key/value have batch {key.shape[0]}.")
        return query, key, value

    @classmethod
    def from_module(cls, module: nn.Module, **hints) -> MultiHeadAttention:
        """A MultiHeadAttention with the weights of `module`, giving the same outputs (same layout).

        Recognises torch.nn.MultiheadAttention, the textbook styles and the common naming conventions;
        hints such as num_heads=... help where the module does not say.
        """
        from multihead.convert.registry import from_module

        return from_module(module, **hints)

    def to_torch(self) -> nn.MultiheadAttention:
        """An nn.MultiheadAttention with the same weights and outputs (where torch can express it)."""
        from multihead.convert.to_torch import to_torch

        return to_torch(self)

    def extra_repr(self) -> str:
        extra = f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, head_dim={self.head_dim}"
        if self.num_kv_heads != self.num_heads:
            extra += f", num_kv_heads={self.num_kv_heads}"
        if self.causal:
            extra += ", causal=True"
        return extra + f", batch_first={self.batch_first}, backend={self.backend!r}"

