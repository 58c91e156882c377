"""MultiHeadAttention(scale=...): a custom factor on q·k (Gemma 2's query_pre_attn_scalar, GPT-2's options)."""
from __future__ import annotations

import pytest
import torch

import multihead as mh
from helpers import max_abs_diff, reference_attention


def _float64_reference(mod: mh.MultiHeadAttention, x: torch.Tensor, scale: float | None, causal: bool):
    """The module's function in float64 from its own weights, with `scale` on q·k (None: 1/sqrt(D))."""
    B, L, _ = x.shape
    H, Hkv, D = mod.num_heads, mod.num_kv_heads, mod.head_dim

    def project(proj, heads):
        y = x.double() @ proj.weight.double().T + proj.bias.double()
        return y.view(B, L, heads, D).transpose(1, 2)  # (B, heads, L, D)

    keep = torch.ones(L, L, dtype=torch.bool).tril() if causal else None
    out = reference_attention(project(mod.q_proj, H), project(mod.k_proj, Hkv), project(mod.v_proj, Hkv), keep,
                              scale=scale)
    out = out.transpose(1, 2).reshape(B, L, H * D)
    return out @ mod.out_proj.weight.double().T + mod.out_proj.bias.double()


@pytest.mark.parametrize("scale", [None, 0.05, 1.0, 2.5])
@pytest.mark.parametrize("causal", [False, True])
def test_custom_scale_multiplies_the_scores(scale, causal):
    torch.manual_seed(0)
    mod = mh.MultiHeadAttention(16, 4, num_kv_heads=2, scale=scale, causal=causal).double()
    for proj in (mod.q_proj, mod.k_proj, mod.v_proj, mod.out_proj):
        torch.nn.init.normal_(proj.bias)  # nonzero biases: every term is checked
    x = torch.randn(2, 5, 16, dtype=torch.float64)
    assert max_abs_diff(mod(x), _float64_reference(mod, x, scale, causal)) < 1e-12


def test_default_scale_is_one_over_sqrt_head_dim():
    torch.manual_seed(0)
    default = mh.MultiHeadAttention(12, 3).double()
    torch.manual_seed(0)  # the same initial weights
    explicit = mh.MultiHeadAttention(12, 3, scale=4 ** -0.5).double()
    x = torch.randn(2, 4, 12, dtype=torch.float64)
    assert torch.equal(default(x), explicit(x))
    assert default.scale is None and "scale=0.5" in repr(explicit)


@pytest.mark.parametrize("bad", [0, -1.0, float("inf"), float("nan"), True, "0.5", torch.tensor(0.5)])
def test_bad_scale_is_refused(bad):
    with pytest.raises(mh.AttentionError, match="scale must be a positive finite number"):
        mh.MultiHeadAttention(8, 2, scale=bad)
