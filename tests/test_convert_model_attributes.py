"""model_attribute: what a module or config says about itself, read under each spelling its families use.

Every spelling of every fact is found; a fact under none of them raises AttentionError naming the
module's class, the fact and the spellings tried (never AttributeError); reading changes nothing. On a
real transformers Llama 4 text layer, the weightless q/k norm's epsilon converts under its 5.25 name
(`variance_epsilon`) and its older one (`eps`), and under neither the conversion fails cleanly.
"""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

import multihead as mh
from multihead.convert.model_attributes import SPELLINGS, model_attribute, spellings


def _holding(**attributes) -> nn.Module:
    module = nn.Module()
    for name, value in attributes.items():
        setattr(module, name, value)
    return module


@pytest.mark.parametrize("fact, name", [(fact, name) for fact, names in SPELLINGS.items() for name in names])
def test_every_spelling_of_every_fact_is_found(fact, name):
    assert model_attribute(_holding(**{name: 7.5}), fact) == 7.5


def test_a_fact_without_spellings_is_read_under_its_own_name_and_the_first_spelling_wins():
    assert spellings("lambda_init") == ("lambda_init",)
    assert model_attribute(_holding(lambda_init=0.2), "lambda_init") == 0.2
    first, second = SPELLINGS["eps"][:2]
    assert model_attribute(_holding(**{second: 1e-5, first: 1e-6}), "eps") == 1e-6


def test_a_present_none_counts_as_said_and_a_default_stands_in_for_a_missing_fact():
    assert model_attribute(_holding(sliding_window=None), "sliding_window", 9) is None  # full layers say None
    assert model_attribute(_holding(), "sliding_window", 9) == 9
    assert model_attribute(None, "model_type", None) is None


def test_types_pass_over_values_of_other_types_and_bool_is_not_an_int():
    module = _holding(num_heads=True, n_head=nn.Linear(2, 2), n_heads=4)
    assert model_attribute(module, "num_heads", types=(int,)) == 4
    assert model_attribute(_holding(flag=True), "flag", types=(bool,)) is True


def test_a_missing_fact_raises_attention_error_naming_the_class_the_fact_and_the_spellings():
    class Llama4TextWeightlessRMSNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.epsilon_of_tomorrow = 1e-5

    norm = Llama4TextWeightlessRMSNorm()
    before = dict(vars(norm))
    with pytest.raises(mh.AttentionError) as raised:
        model_attribute(norm, "eps")
    assert not isinstance(raised.value, AttributeError)
    message = str(raised.value)
    assert "Llama4TextWeightlessRMSNorm" in message and "eps" in message
    assert all(repr(name) in message for name in SPELLINGS["eps"])
    assert dict(vars(norm)) == before  # reading left the module as it was


def test_a_fact_held_only_in_the_wrong_type_says_what_was_found():
    with pytest.raises(mh.AttentionError, match=r"num_heads \(int\).*found only num_heads=bool"):
        model_attribute(_holding(num_heads=True), "num_heads", types=(int,))


@pytest.mark.models
@pytest.mark.parametrize("spelling", ["variance_epsilon", "eps"])  # transformers 5.25's name, and the earlier one
def test_llama4_qk_norm_epsilon_converts_under_either_spelling(spelling):
    layer = _llama4_rope_layer()
    norm = layer.qk_norm
    eps = norm.__dict__.pop("variance_epsilon", None) or norm.__dict__.pop("eps")
    norm.__dict__[spelling] = eps
    x = torch.randn(2, 7, 32, generator=torch.Generator().manual_seed(1))
    ours = mh.MultiHeadAttention.from_module(layer)
    assert ours.q_norm.eps == ours.k_norm.eps == eps == 1e-5  # the config's rms_norm_eps
    # the other spelling converts to the same module: the same outputs, bit for bit
    norm.__dict__[{"eps": "variance_epsilon", "variance_epsilon": "eps"}[spelling]] = norm.__dict__.pop(spelling)
    with torch.no_grad():
        assert torch.equal(ours(x), mh.MultiHeadAttention.from_module(layer)(x))


@pytest.mark.models
def test_llama4_qk_norm_without_any_epsilon_fails_cleanly_and_leaves_the_layer_unchanged():
    layer = _llama4_rope_layer()
    norm = layer.qk_norm
    norm.__dict__.pop("variance_epsilon", None)
    norm.__dict__.pop("eps", None)
    state = copy.deepcopy(layer.state_dict())
    attributes = {name: dict(vars(m)) for name, m in layer.named_modules()}
    with pytest.raises(mh.AttentionError, match=r"Llama4TextWeightlessRMSNorm does not say its eps.*'variance_epsilon'"):
        mh.MultiHeadAttention.from_module(layer)
    assert {name: dict(vars(m)) for name, m in layer.named_modules()} == attributes
    assert all(torch.equal(state[name], t) for name, t in layer.state_dict().items())


def _llama4_rope_layer() -> nn.Module:
    """Layer 0 of a tiny Llama 4 text model: interleaved RoPE and the weightless q/k norm."""
    transformers = pytest.importorskip("transformers")
    config = transformers.Llama4TextConfig(
        hidden_size=32, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2, head_dim=8, vocab_size=50,
        intermediate_size=64, intermediate_size_mlp=64, num_local_experts=2, no_rope_layers=[1], use_qk_norm=True,
        attention_chunk_size=5, rms_norm_eps=1e-5, rope_parameters={"rope_type": "default", "rope_theta": 10000.0})
    torch.manual_seed(0)
    model = transformers.AutoModel.from_config(config, attn_implementation="eager").eval()
    layer = model.layers[0].self_attn
    assert layer.qk_norm is not None
    return layer
