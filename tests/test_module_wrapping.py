"""The module as the ecosystem wraps it: forward hooks, real peft LoRA, dynamically quantized
projections, and nn.MultiheadAttention state dicts loaded into it."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn

import multihead as mh
from helpers import max_abs_diff, reference_attention

E, H = 16, 4


def split_heads(t: torch.Tensor, heads: int) -> torch.Tensor:
    """(B, L, heads*D) -> (B, heads, L, D)."""
    B, L, _ = t.shape
    return t.view(B, L, heads, -1).transpose(1, 2)


def test_forward_hooks_fire_on_every_projection_and_their_results_are_used():
    torch.manual_seed(0)
    mod = mh.MultiHeadAttention(E, H).eval()
    x = torch.randn(2, 5, E)
    seen = {}

    def record(name):
        def hook(module, args, out):
            seen[name] = out.shape  # returns None: the output stays as it is
        return hook

    for name in ("q_proj", "k_proj", "v_proj", "out_proj"):
        getattr(mod, name).register_forward_hook(record(name))
    mod(x, causal=True)
    assert seen == {name: torch.Size([2, 5, E]) for name in ("q_proj", "k_proj", "v_proj", "out_proj")}
    # A hook's return value replaces the projection's output: zero values leave only out_proj's bias.
    with torch.no_grad():
        mod.out_proj.bias.normal_()
    mod.v_proj.register_forward_hook(lambda m, args, out: torch.zeros_like(out))
    torch.testing.assert_close(mod(x), mod.out_proj.bias.expand(2, 5, E), atol=0, rtol=0)


def test_dynamically_quantized_projections_still_attend_exactly():
    torch.manual_seed(0)
    mod = mh.MultiHeadAttention(E, H).eval()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization announces its move to torchao
        qmod = torch.ao.quantization.quantize_dynamic(mod, {nn.Linear}, dtype=torch.qint8)
    assert isinstance(qmod.q_proj, torch.ao.nn.quantized.dynamic.Linear)
    x = torch.randn(2, 6, E)
    pad = torch.tensor([[False] * 6, [False] * 4 + [True] * 2])
    out = qmod(x, mask=mh.Mask.key_padding(pad))
    # Reference: the quantized projections' own outputs, attention in float64, the quantized out_proj.
    q, k, v = (split_heads(getattr(qmod, f"{n}_proj")(x), H) for n in "qkv")
    heads = reference_attention(q, k, v, keep=~pad[:, None, None, :]).float()  # (B, H, L, D)
    expected = qmod.out_proj(heads.transpose(1, 2).reshape(2, 6, E))
    assert max_abs_diff(out, expected) < 1e-5
    assert max_abs_diff(out, mod(x, mask=mh.Mask.key_padding(pad))) < 0.1  # and near the float module


class _Net(nn.Module):
    """Attention and a linear read-out, the smallest model LoRA can adapt."""

    def __init__(self):
        super().__init__()
        self.attn = mh.MultiHeadAttention(E, H)
        self.head = nn.Linear(E, 1)

    def forward(self, x):
        return self.head(self.attn(x, causal=True)).squeeze(-1)  # (B, L)


@pytest.mark.models
def test_peft_lora_trains_only_its_adapters_and_merges_back_to_equal_outputs():
    peft = pytest.importorskip("peft")
    torch.manual_seed(0)
    model = peft.get_peft_model(_Net(), peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"]))
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    assert trainable and all("lora_" in n for n in trainable)
    assert any(".q_proj." in n for n in trainable) and any(".v_proj." in n for n in trainable)
    x, target = torch.randn(8, 6, E), torch.randn(8, 6)
    optimizer = torch.optim.Adam([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    losses = []
    for _ in range(30):
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), target)
        loss.backward()
        frozen_grads = [n for n, p in model.named_parameters() if not p.requires_grad and p.grad is not None]
        assert frozen_grads == []
        optimizer.step()
        losses.append(loss.item())
    assert losses[-1] < 0.9 * losses[0], losses
    model.eval()
    with torch.no_grad():
        adapted = model(x)
        merged = model.merge_and_unload()
        assert type(merged.attn.q_proj) is nn.Linear and type(merged.attn.v_proj) is nn.Linear
        assert max_abs_diff(merged(x), adapted) < 1e-5


# --- nn.MultiheadAttention state dicts ---------------------------------------------------------------

@pytest.mark.parametrize("bias", [True, False])
def test_load_state_dict_from_torch_packed_in_proj(bias):
    torch.manual_seed(0)
    theirs = nn.MultiheadAttention(E, H, bias=bias, batch_first=True).eval()
    ours = mh.MultiHeadAttention(E, H, bias=bias).eval()
    result = ours.load_state_dict(theirs.state_dict())
    assert not result.missing_keys and not result.unexpected_keys
    x = torch.randn(2, 5, E)
    pad = torch.tensor([[False] * 5, [False] * 3 + [True] * 2])
    expected, _ = theirs(x, x, x, key_padding_mask=pad, need_weights=False)
    assert max_abs_diff(ours(x, mask=mh.Mask.key_padding(pad)), expected) < 1e-6


def test_load_state_dict_from_torch_separate_q_k_v_weights():
    torch.manual_seed(0)
    kdim, vdim = 10, 12
    theirs = nn.MultiheadAttention(E, H, kdim=kdim, vdim=vdim, batch_first=True).eval()
    assert "q_proj_weight" in theirs.state_dict()
    ours = mh.MultiHeadAttention(E, H, kdim=kdim, vdim=vdim).eval()
    result = ours.load_state_dict(theirs.state_dict())
    assert not result.missing_keys and not result.unexpected_keys
    q, k, v = torch.randn(2, 4, E), torch.randn(2, 7, kdim), torch.randn(2, 7, vdim)
    expected, _ = theirs(q, k, v, need_weights=False)
    assert max_abs_diff(ours(q, k, v), expected) < 1e-6


def test_load_state_dict_of_a_model_holding_torch_attention():
    """The pre-hook works under a prefix, as when a whole model's state dict is loaded."""
    torch.manual_seed(0)
    theirs = nn.ModuleDict({"attn": nn.MultiheadAttention(E, H, batch_first=True)}).eval()
    ours = nn.ModuleDict({"attn": mh.MultiHeadAttention(E, H)}).eval()
    ours.load_state_dict(theirs.state_dict())
    x = torch.randn(1, 3, E)
    assert max_abs_diff(ours["attn"](x), theirs["attn"](x, x, x, need_weights=False)[0]) < 1e-6


def test_load_state_dict_rejects_add_bias_kv_state():
    theirs = nn.MultiheadAttention(E, H, add_bias_kv=True, batch_first=True)
    ours = mh.MultiHeadAttention(E, H)
    before = {n: t.clone() for n, t in ours.state_dict().items()}
    with pytest.raises(mh.AttentionError, match="add_bias_kv"):
        ours.load_state_dict(theirs.state_dict())
    assert all(torch.equal(before[n], t) for n, t in ours.state_dict().items())


def test_a_dynamically_quantized_key_projection_gets_a_float_cache_that_matches_the_full_pass():
    torch.manual_seed(0)
    m = mh.MultiHeadAttention(32, 4, causal=True).eval()
    float_k = m.k_proj
    quantized = torch.ao.quantization.quantize_dynamic(torch.nn.Sequential(float_k), {torch.nn.Linear},
                                                       dtype=torch.qint8)[0]
    assert isinstance(quantized, torch.ao.nn.quantized.dynamic.Linear)
    m.k_proj = quantized
    cache = m.new_cache(1, 8)
    assert cache.keys.dtype == torch.float32
    x = torch.randn(1, 5, 32)
    with torch.no_grad():
        steps = torch.cat([m(x[:, :3], cache=cache), m(x[:, 3:4], cache=cache), m(x[:, 4:], cache=cache)], 1)
        full = m(x)
        # Dynamic quantization picks each call's int8 activation scale from that call's inputs, so
        # the cached steps and the full pass quantize the same tokens with different scales: their
        # keys may differ by about one quantization step of the activations times |W| row sums.
        step = x.abs().max() / 127  # the largest per-call activation step (the full pass's)
        key_error = step * float_k.weight.abs().sum(1).max()
        assert (m.k_proj(x) - float_k(x)).abs().max() <= key_error  # the bound holds for the keys
        torch.testing.assert_close(steps, full, atol=float(key_error), rtol=0)
