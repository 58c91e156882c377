"""nn.MultiheadAttention's state dict, read by MultiHeadAttention.load_state_dict (part of the core).

torch stores the input projections packed, `in_proj_weight` (3E, E) and `in_proj_bias` (3E,), or,
when kdim/vdim differ from E, as `q_proj_weight`, `k_proj_weight`, `v_proj_weight`. Ours are three
Linears, `q_proj.weight` ... The out projection has the same names in both.
"""
from __future__ import annotations

from multihead.errors import AttentionError, shape_str


def torch_mha_state_to_ours(module, state_dict: dict, prefix: str) -> None:
    """Rewrite, in place, torch's in-projection entries under `prefix` into q_proj/k_proj/v_proj ones."""
    for extra in ("bias_k", "bias_v"):
        if prefix + extra in state_dict:
            raise AttentionError(
                f"the state dict has {prefix + extra} (nn.MultiheadAttention's add_bias_kv=True), which appends "
                "extra keys that MultiHeadAttention does not model. multihead.compat.MultiheadAttention("
                "..., add_bias_kv=True) loads it.")
    packed = state_dict.pop(prefix + "in_proj_weight", None)
    packed_bias = state_dict.pop(prefix + "in_proj_bias", None)
    if packed is not None:
        rows = [module.q_proj.out_features, module.k_proj.out_features, module.v_proj.out_features]
        if packed.shape[0] != sum(rows):
            raise AttentionError(
                f"{prefix}in_proj_weight has shape {shape_str(packed.shape)}; this module expects "
                f"{sum(rows)} rows (q {rows[0]}, k {rows[1]}, v {rows[2]}).")
        for name, w in zip("qkv", packed.split(rows)):
            state_dict[f"{prefix}{name}_proj.weight"] = w
    for name in "qkv":
        separate = state_dict.pop(f"{prefix}{name}_proj_weight", None)
        if separate is not None:
            state_dict[f"{prefix}{name}_proj.weight"] = separate
    if packed_bias is not None:
        rows = [module.q_proj.out_features, module.k_proj.out_features, module.v_proj.out_features]
        for name, b in zip("qkv", packed_bias.split(rows)):
            state_dict[f"{prefix}{name}_proj.bias"] = b
