"""MultiHeadAttention: project -> split heads -> (norm, positions) -> attend -> merge heads -> project.

Shape legend: B batch, Lq/Lk lengths, E embed_dim (query features), H heads, Hkv kv heads,
D head_dim, O out_dim. With batch_first=False the inputs and output are (L, B, features).

The module calls its projection modules (`self.q_proj(x)`), so forward hooks fire and wrappers that
replace a projection (LoRA, quantized Linears) work. Decoder options: rope (an `mh.RoPE`), window
(sliding window size), alibi, softcap, sinks (learned per-head sink logits), qk_norm (per-head
RMSNorm of q and k); `new_cache()` gives a KV cache that `forward(..., cache=cache)` appends to.
"""
from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from multihead.attention import attention
from multihead.caches.base import as_cache
from multihead.caches.codec import KV_DTYPES
from multihead.caches.kv import KVCache
from multihead.caches.new import new_cache
from multihead.caches.pages import materialized
from multihead.backends.dispatch import backend_names
from multihead.errors import AttentionError, check_flag, check_number, shape_str, torch_keyword_error
from multihead.masks import Mask
from multihead.layers.padding_check import warn_if_all_keys_padded
from multihead.positions import QueryTemperature, alibi_slopes
from multihead.services import service
from multihead.layers.torch_state import torch_mha_state_to_ours

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
    scale: the factor on q·k (default 1/sqrt(D); Gemma 2 uses query_pre_attn_scalar ** -0.5).
    Decoder options: rope (an mh.RoPE applied to q and k), window (keys within the last `window`
    positions), alibi (ALiBi biases with mh.alibi_slopes), softcap (Gemma 2), sinks (learned (H,) sink
    logits, gpt-oss), qk_norm (RMSNorm of each head's q and k over D, Qwen3), chunk_size (keys in the
    query's own chunk of positions, Llama 4), temperature (an mh.positions.QueryTemperature scaling
    queries by position, Llama 4's NoPE layers).
    """

    def __init__(self, embed_dim: int, num_heads: int, *, kdim: int | None = None, vdim: int | None = None,
                 head_dim: int | None = None, num_kv_heads: int | None = None, out_dim: int | None = None,
                 bias: bool | Mapping[str, bool] = True, dropout: float = 0.0, batch_first: bool = True,
                 causal: bool = False, backend: str = "auto", rope: nn.Module | None = None,
                 window: int | None = None, alibi: bool = False, softcap: float | None = None, sinks: bool = False,
                 qk_norm: bool = False, scale: float | None = None, chunk_size: int | None = None,
                 temperature: nn.Module | None = None, device: torch.device | str | None = None,
                 dtype: torch.dtype | None = None) -> None:
        super().__init__()
        for name, value in (("embed_dim", embed_dim), ("num_heads", num_heads)):
            if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
                raise AttentionError(f"{name} must be a positive int; got {value!r}.")
        if head_dim is None:
            if embed_dim % num_heads:
                raise AttentionError(
                    f"embed_dim={embed_dim} is not divisible by num_heads={num_heads}; "
                    "choose them so each head gets embed_dim // num_heads features, or pass head_dim."
                )
            head_dim = embed_dim // num_heads
        num_kv_heads = num_heads if num_kv_heads is None else num_kv_heads
        if isinstance(num_kv_heads, bool) or not isinstance(num_kv_heads, int) or num_kv_heads <= 0 \
                or num_heads % num_kv_heads:
            raise AttentionError(
                f"num_kv_heads={num_kv_heads!r} must be a positive divisor of num_heads={num_heads}."
            )
        for name, value in (("head_dim", head_dim), ("kdim", kdim), ("vdim", vdim), ("out_dim", out_dim),
                            ("window", window), ("chunk_size", chunk_size)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
                raise AttentionError(f"{name} must be a positive int; got {value!r}.")
        check_number(dropout, "dropout", "a probability in [0, 1)", lambda x: 0.0 <= x < 1.0)
        for name, number in (("softcap", softcap), ("scale", scale)):
            if number is not None:
                check_number(number, name, "a positive finite number or None", lambda x: 0 < x < float("inf"))
        for name, flag in (("batch_first", batch_first), ("causal", causal), ("alibi", alibi),
                           ("sinks", sinks), ("qk_norm", qk_norm)):
            check_flag(flag, name)
        if rope is not None and not (isinstance(rope, nn.Module) and hasattr(rope, "cos_sin")):
            raise AttentionError(f"rope must be an mh.RoPE or None; got {type(rope).__name__}.")
        if temperature is not None and not isinstance(temperature, QueryTemperature):
            raise AttentionError(f"temperature must be an mh.positions.QueryTemperature or None; got "
                                 f"{type(temperature).__name__}.")
        if rope is not None and alibi:
            raise AttentionError("rope and alibi are two ways to encode positions; choose one.")
        if backend != "auto" and backend not in backend_names():
            raise AttentionError(f"backend must be 'auto' or one of {backend_names()}; got {backend!r}.")

        self.embed_dim, self.num_heads, self.num_kv_heads, self.head_dim = embed_dim, num_heads, num_kv_heads, head_dim
        self.kdim, self.vdim = kdim or embed_dim, vdim or embed_dim
        self.out_dim = out_dim or embed_dim
        self.dropout, self.batch_first, self.causal, self.backend = float(dropout), batch_first, causal, backend
        self.window, self.chunk_size, self.softcap = window, chunk_size, None if softcap is None else float(softcap)
        self.scale = None if scale is None else float(scale)  # None: 1/sqrt(head_dim)
        biases = resolve_bias(bias)
        factory = {"device": device, "dtype": dtype}
        self.q_proj = nn.Linear(embed_dim, num_heads * head_dim, bias=biases["q"], **factory)
        self.k_proj = nn.Linear(self.kdim, num_kv_heads * head_dim, bias=biases["k"], **factory)
        self.v_proj = nn.Linear(self.vdim, num_kv_heads * head_dim, bias=biases["v"], **factory)
        self.out_proj = nn.Linear(num_heads * head_dim, self.out_dim, bias=biases["out"], **factory)
        self.rope, self.temperature = rope, temperature
        self.q_norm = nn.RMSNorm(head_dim, eps=1e-6, **factory) if qk_norm else None
        self.k_norm = nn.RMSNorm(head_dim, eps=1e-6, **factory) if qk_norm else None
        self.sinks = nn.Parameter(torch.zeros(num_heads, **factory)) if sinks else None
        if alibi:
            self.register_buffer("alibi_slopes", alibi_slopes(num_heads).to(device=device), persistent=False)
        else:
            self.alibi_slopes = None
        self.register_load_state_dict_pre_hook(_accept_torch_state)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Xavier-uniform projections and zero biases, as torch.nn.MultiheadAttention starts."""
        for proj in (self.q_proj, self.k_proj, self.v_proj, self.out_proj):
            nn.init.xavier_uniform_(proj.weight)
            if proj.bias is not None:
                nn.init.zeros_(proj.bias)

    def forward(self, query: torch.Tensor, key: torch.Tensor | None = None, value: torch.Tensor | None = None, *,
                mask: Mask | None = None, causal: bool = False, cache: KVCache | None = None,
                positions: torch.Tensor | None = None, **unexpected: object) -> torch.Tensor:
        """query (B, Lq, E); key (B, Lk, kdim) and value (B, Lk, vdim) default to query (self-attention).

        Seq-first (L, B, features) when batch_first=False; unbatched (L, features) also works.
        mask: a `Mask` broadcastable to (B, H, Lq, Lk) (e.g. Mask.key_padding(pad), True = padding).
        causal=True adds Mask.causal() (always on when the module was built with causal=True).
        cache: a KVCache from new_cache(); this call's keys and values are appended to it and the
        queries attend to everything cached, bottom-right aligned per sequence. With a cache, mask may
        only be Mask.lengths(lens, query_lens=lens) for a right-padded prompt.
        positions: (Lq,) or (B, Lq) integer positions for rope (default: arange, after the cache).
        Returns (B, Lq, out_dim) in the input layout.
        torch's attn_mask= / key_padding_mask= raise KeywordError (a TypeError) saying which Mask to use.
        """
        if unexpected:
            raise torch_keyword_error("MultiHeadAttention.forward", list(unexpected))
        key = query if key is None else key
        value = key if value is None else value
        unbatched = isinstance(query, torch.Tensor) and query.dim() == 2
        query, key, value = self._batch_first_view(query, key, value, unbatched)
        B, Lq, _ = query.shape
        Lk = key.shape[1]
        H, Hkv, D = self.num_heads, self.num_kv_heads, self.head_dim
        causal = check_flag(causal, "causal") or self.causal
        new_tokens = None if cache is None else as_cache(cache, KVCache).check_call(
            mask, B, self.num_kv_heads, self.head_dim, key is query)
        warn_if_all_keys_padded(self, mask)  # a 1 = token mask passed as padding (CPU eager only, once)
        q = self.q_proj(query).view(B, Lq, H, D).transpose(1, 2)  # (B, H, Lq, D)
        k = self.k_proj(key).view(B, Lk, Hkv, D).transpose(1, 2)  # (B, Hkv, Lk, D)
        v = self.v_proj(value).view(B, Lk, Hkv, D).transpose(1, 2)  # (B, Hkv, Lk, D)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)  # RMSNorm over each head's D features
        if positions is None and (self.rope is not None or self.temperature is not None):
            positions = cache.positions(Lq) if cache is not None else torch.arange(Lq, device=q.device)
        if self.rope is not None:
            q, k = self.rope(q, k, positions)
        if self.temperature is not None:
            q = self.temperature(q, positions)  # (B, H, Lq, D), each query scaled by its position's factor
        align = "top_left"
        if cache is not None:  # keys: everything cached; mask: causal within each sequence's length
            k, v, mask = cache.append(k, v, new_tokens)  # (B, Hkv, Lc, D), or a paged cache's reads
            if type(self).attend is not MultiHeadAttention.attend:  # a variant reads tensors
                k, v = materialized(k), materialized(v)
            causal, align = False, "bottom_right"
        mask = self._variant_masks(mask, align)
        out = self.attend(q, k, v, mask, causal)  # (B, H, Lq, D)
        out = out.transpose(1, 2).reshape(B, Lq, H * D)  # merge heads: (B, Lq, H*D)
        out = self.gate_heads(out, query)  # (B, Lq, H*D); the identity here
        out = self.out_proj(out)  # (B, Lq, O)
        if unbatched:
            return out[0]
        return out if self.batch_first else out.transpose(0, 1)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: Mask | None, causal: bool) -> torch.Tensor:
        """Attention over the heads: q (B, H, Lq, D), k and v (B, Hkv, Lk, D) -> (B, H, Lq, D).

        Variants that combine the heads' attention differently (mh.DifferentialAttention) override this.
        k and v are a quantized cache's codes and scales (its kv form) when the cache is quantized.
        """
        return attention(q, k, v, mask, causal=causal, scale=self.scale, softcap=self.softcap, sinks=self.sinks,
                         dropout=self.dropout if self.training else 0.0, backend=self.backend)

    def gate_heads(self, merged: torch.Tensor, query: torch.Tensor) -> torch.Tensor:
        """The merged heads (B, Lq, H*D) on their way to out_proj, given the query (B, Lq, E): unchanged.

        Variants that gate the heads' output (mh.GatedMultiHeadAttention, Qwen3-Next) override this.
        """
        return merged

    def new_cache(self, batch_size: int, max_len: int, *, dtype: torch.dtype | None = None,
                  kv_dtype: torch.dtype | None = None, page_size: int | None = None,
                  num_pages: int | None = None) -> KVCache:
        """An empty KVCache for this module: keys/values (batch_size, Hkv, max_len, D), lengths (B,).

        dtype defaults to the key projection's (float32 when it is quantized). kv_dtype=torch.int8 or
        torch.float8_e4m3fn: codes with one fp32 scale per token and kv head (keys and values still come in
        `dtype`); a float kv_dtype is the cache's dtype. page_size: pages of that many tokens in a pool of
        num_pages (see caches/pages.py).
        """
        if kv_dtype in KV_DTYPES and type(self).attend is not MultiHeadAttention.attend:
            raise AttentionError(f"a quantized cache serves layers that attend per head; {type(self).__name__} "
                                 "combines the heads' attention its own way: use a float cache (kv_dtype=None).")
        return new_cache(KVCache, self.k_proj.weight, batch_size, max_len, num_kv_heads=self.num_kv_heads,
                         head_dim=self.head_dim, dtype=dtype, kv_dtype=kv_dtype, page_size=page_size,
                         num_pages=num_pages)

    def _variant_masks(self, mask, align: str):
        """The caller's mask & this module's sliding window, chunk and ALiBi parts (None when neither)."""
        own = self._own_mask(align)
        if own is None or mask is None:
            return mask if own is None else own
        return mask & own

    def _own_mask(self, align: str) -> Mask | None:
        """This module's window, chunk and ALiBi parts as one Mask, made once per alignment and setting (eager):
        the plan cache then finds every forward's mask at once. Under torch.compile it is made afresh."""
        slopes, setting = self.alibi_slopes, (self.window, self.chunk_size)
        compiling = torch.compiler.is_compiling()  # nothing remembered is read there (no guards on it)
        kept = None if compiling else self.__dict__.setdefault("_own_masks", {}).get(align)
        if kept is not None and kept[0] == setting and kept[1] is slopes:
            return kept[2]
        parts = ([Mask.window(self.window, align)] if self.window is not None else []) + (
            [Mask.chunks(self.chunk_size, align)] if self.chunk_size is not None else []) + (
            [Mask.alibi(slopes, align)] if slopes is not None else [])
        own = Mask(tuple(p for m in parts for p in m.parts)) if parts else None
        if not compiling:
            self.__dict__["_own_masks"][align] = (setting, slopes, own)
        return own

    def _batch_first_view(self, query, key, value, unbatched):
        """Check ranks, features, lengths, dtypes; return (B, L, features) views of the three inputs."""
        names = ("query", "key", "value")
        features = (self.embed_dim, self.kdim, self.vdim)
        layout = "(L, features)" if unbatched else ("(B, L, features)" if self.batch_first else "(L, B, features)")
        param = self.q_proj.weight  # a method, not a tensor, on a dynamically quantized Linear: no check then
        param = param if isinstance(param, torch.Tensor) else None
        for name, t, width in zip(names, (query, key, value), features):
            if not isinstance(t, torch.Tensor):
                raise AttentionError(f"{name} must be a torch.Tensor; got {type(t).__name__}.")
            if t.dim() != (2 if unbatched else 3):
                raise AttentionError(
                    f"{name} must be {layout} with batch_first={self.batch_first}; got shape {shape_str(t.shape)}."
                )
            if t.shape[-1] != width:
                raise AttentionError(f"{name} must have {width} features (last dim); got shape {shape_str(t.shape)}.")
            if param is not None and (t.dtype != param.dtype or t.device != param.device):
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
        hints such as num_heads=... help where the module does not say. (The convert tool's work.)
        """
        return service("from_module")(module, **hints)

    def to_torch(self) -> nn.MultiheadAttention:
        """An nn.MultiheadAttention with the same weights and outputs, where torch can express this module."""
        return service("to_torch")(self)

    def extra_repr(self) -> str:
        extra = f"embed_dim={self.embed_dim}, num_heads={self.num_heads}, head_dim={self.head_dim}"
        if self.num_kv_heads != self.num_heads:
            extra += f", num_kv_heads={self.num_kv_heads}"
        if self.causal:
            extra += ", causal=True"
        for name in ("window", "chunk_size", "softcap", "scale"):
            if getattr(self, name) is not None:
                extra += f", {name}={getattr(self, name)}"
        for name, on in (("rope", self.rope is not None), ("temperature", self.temperature is not None),
                         ("alibi", self.alibi_slopes is not None),
                         ("sinks", self.sinks is not None), ("qk_norm", self.q_norm is not None)):
            extra += f", {name}=True" if on else ""
        return extra + f", batch_first={self.batch_first}, backend={self.backend!r}"



def _accept_torch_state(module, state_dict, prefix, *args) -> None:
    """load_state_dict pre-hook: nn.MultiheadAttention's in_proj_weight / q,k,v_proj_weight forms."""
    torch_mha_state_to_ours(module, state_dict, prefix)
