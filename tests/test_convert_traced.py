"""from_module's reach through the dataflow: modules whose names no converter knows (raw parameters with einsum
or @, a Linear class of their own, a fused qkv cut unevenly for grouped-query attention, partial rotary), and
Phi-3's fused qkv_proj inside a real Phi3ForCausalLM: full sequences and cached steps equal HF's layer."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn

import multihead as mh
from multihead.checker.loading.learner_file import load_class

ZOO = Path(__file__).parent / "check_zoo"
TOLERANCE = 1e-5  # fp32, relative to the largest output (ParamMatrixAttention's reach 40: 1e-5 absolute is 2.5e-7)

# zoo module -> (constructor arguments, what the converted module must carry: heads, kv heads, causal, rotary dim)
MODULES = {
    "ok_raw_param_einsum.py:EinsumParamAttention": (dict(d_model=16, n_heads=4), (4, 4, False, None)),
    "ok_raw_param_matmul.py:ParamMatrixAttention": (dict(d_in=16, d_out=16, num_heads=4), (4, 4, False, None)),
    "ok_custom_linear_class.py:CustomLinearAttention": (dict(dim=16, n_heads=4), (4, 4, False, None)),
    "ok_fused_gqa_wqkv.py:FusedGQA": (dict(dim=16, n_head=4), (4, 2, True, None)),
    "ok_phi3_partial_rotary.py:PartialRotaryAttention": (dict(hidden_size=16, num_attention_heads=4), (4, 2, True, 4)),
}


def _output(module, x):
    out = module(x)
    return out[0] if isinstance(out, tuple) else out


def _error(got: torch.Tensor, want: torch.Tensor) -> float:
    """max |got - want| relative to max |want| (at least 1)."""
    return float((got - want).abs().max() / want.abs().max().clamp(min=1.0))


@pytest.mark.parametrize("target", MODULES)
def test_modules_read_from_their_dataflow_convert_to_equal_outputs(target):
    torch.manual_seed(0)
    arguments, (heads, kv_heads, causal, rotary) = MODULES[target]
    source = load_class(str(ZOO / target))(**arguments)
    ours = mh.MultiHeadAttention.from_module(source)
    assert (ours.num_heads, ours.num_kv_heads, ours.causal) == (heads, kv_heads, causal)
    assert (ours.rope.rotary_dim if ours.rope is not None else None) == rotary
    x = torch.randn(3, 9, 16)
    with torch.no_grad():
        assert _error(ours(x), _output(source, x)) <= TOLERANCE
    with torch.no_grad():  # the weights are copies: changing ours leaves the source alone, and moves ours
        ours.q_proj.weight.add_(1.0)
        assert _error(ours(x), _output(source, x)) > 1e-2


def test_a_converted_module_decodes_with_its_cache_like_its_full_forward():
    source = load_class(str(ZOO / "ok_fused_gqa_wqkv.py:FusedGQA"))(dim=16, n_head=4)
    ours = mh.MultiHeadAttention.from_module(source)
    x = torch.randn(2, 8, 16)
    cache = ours.new_cache(2, 8)
    with torch.no_grad():
        steps = [ours(x[:, :5], cache=cache)] + [ours(x[:, t:t + 1], cache=cache) for t in range(5, 8)]
        assert _error(torch.cat(steps, dim=1), _output(source, x)) <= TOLERANCE


def test_what_the_dataflow_reads_but_behaviour_contradicts_is_refused():
    class ScaledTwice(nn.Module):  # attention, but scores divided by D instead of sqrt(D)
        def __init__(self):
            super().__init__()
            self.W = nn.Parameter(torch.randn(16, 48) / 4)

        def forward(self, x):
            q, k, v = (x @ self.W).chunk(3, dim=-1)
            return (q @ k.transpose(-2, -1) / 16).softmax(-1) @ v

    with pytest.raises(mh.AttentionError, match="dataflow reads as attention .* but no head count"):
        mh.MultiHeadAttention.from_module(ScaledTwice())


def test_a_module_that_is_not_attention_is_still_not_recognised():
    with pytest.raises(mh.AttentionError, match="cannot recognise Sequential"):
        mh.MultiHeadAttention.from_module(nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 8)))


# --- Phi-3 inside Phi3ForCausalLM -------------------------------------------------------------------

transformers = pytest.importorskip("transformers")
E, H, HKV, D, PROMPT, STEPS = 64, 4, 2, 16, 12, 10
LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "long_factor": [1.0 + 0.5 * i for i in range(D // 4)],
            "short_factor": [1.0 + 0.1 * i for i in range(D // 4)]}


def _phi3():
    """A two-layer Phi3ForCausalLM with LongRoPE (past 16 positions the long factors) on half of each head."""
    torch.manual_seed(0)
    config = transformers.Phi3Config(
        hidden_size=E, num_attention_heads=H, num_key_value_heads=HKV, num_hidden_layers=2, intermediate_size=2 * E,
        vocab_size=100, max_position_embeddings=128, original_max_position_embeddings=16, partial_rotary_factor=0.5,
        rope_parameters=LONGROPE, pad_token_id=0, bos_token_id=1, eos_token_id=2)
    model = transformers.Phi3ForCausalLM._from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.qkv_proj.weight.normal_(0.0, 0.2)  # HF's std 0.02 leaves every score near 0
    return model


def _captured(model, calls):
    """Per layer, (hidden states in, attention output) of every call, run with one DynamicCache."""
    seen = [[] for _ in model.model.layers]
    hooks = [layer.self_attn.register_forward_hook(
        lambda m, args, kwargs, out, i=i: seen[i].append((kwargs.get("hidden_states", args[0] if args else None),
                                                          out[0])), with_kwargs=True)
             for i, layer in enumerate(model.model.layers)]
    cache = transformers.DynamicCache(config=model.config)
    try:
        with torch.no_grad():
            for call in calls:
                model(input_ids=call, cache=cache, use_cache=True)
    finally:
        for hook in hooks:
            hook.remove()
    return seen


def test_phi3_layers_equal_hf_in_the_model_over_the_sequence_and_step_by_step():
    model = _phi3()
    ids = torch.randint(3, 100, (2, PROMPT + STEPS), generator=torch.Generator().manual_seed(1))
    whole = [calls[0] for calls in _captured(model, [ids])]
    steps = _captured(model, [ids[:, :PROMPT]] + [ids[:, t:t + 1] for t in range(PROMPT, PROMPT + STEPS)])
    for index, layer in enumerate(model.model.layers):
        ours = mh.MultiHeadAttention.from_module(layer.self_attn)
        assert ours.rope.rotary_dim == D // 2 and ours.rope.scaling.kind == "longrope" and ours.num_kv_heads == HKV
        hidden, output = whole[index]
        with torch.no_grad():
            assert (ours(hidden) - output).abs().max() <= TOLERANCE
            cache = ours.new_cache(2, PROMPT + STEPS)
            for hidden, output in steps[index]:  # prefill, then one token at a time
                assert (ours(hidden, cache=cache) - output).abs().max() <= TOLERANCE
