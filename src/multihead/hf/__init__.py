"""multihead inside Hugging Face transformers: `attn_implementation="multihead"`.

    import multihead.hf                      # registers "multihead" (the import is enough)
    model = AutoModelForCausalLM.from_pretrained(path, attn_implementation="multihead")
    model.set_attn_implementation("multihead")   # or switch a loaded model

The name is registered twice, as transformers needs: in AttentionInterface (the attention function,
hf/attention.py) and in AttentionMaskInterface (the mask function, hf/masks.py). The mask function
hands the attention function one multihead Mask built from HF's causal / sliding-window / padding
description, so that structure reaches mh.attention instead of a dense tensor; the module's scaling,
softcap and sink logits come along. `register()` is idempotent and can add other names.

Continuous batching (generate_batch) runs on multihead under the name PAGED (hf/paged.py):
`multihead.hf.use_paged(model)`. Any decoder's generate keeps int8 or fp8 keys and values with
`multihead.hf.use_quantized_cache(model, kv_dtype=torch.int8)` (hf/quantized.py).

Needs the optional extra and transformers >= 5.4: pip install -e ".[hf]" (transformers alone) in the root of a clone.
"""
from __future__ import annotations

try:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface
except ImportError as exc:  # pragma: no cover - depends on the environment
    raise ImportError(f"multihead.hf needs transformers >= 5.4 ({exc}); install it with pip install -e '.[hf]' "
                      "in the root of a multihead clone") from exc

from multihead.errors import AttentionError
from multihead.hf.attention import NAME, hf_attention
from multihead.hf.latent import use_latent_cache
from multihead.hf.masks import hf_mask
from multihead.hf.paged import PAGED, paged_attention, use_paged
from multihead.hf.quantized import use_quantized_cache

__all__ = ["NAME", "PAGED", "hf_attention", "hf_mask", "paged_attention", "register", "use_latent_cache", "use_paged",
           "use_quantized_cache"]


def register(name: str = NAME) -> None:
    """Register the attention function and its mask function under `name` (again: no effect)."""
    if not isinstance(name, str) or not name:
        raise AttentionError(f"name must be a non-empty string; got {name!r}.")
    AttentionInterface.register(name, paged_attention if name == PAGED else hf_attention)
    AttentionMaskInterface.register(name, hf_mask)


register()
register(PAGED)
