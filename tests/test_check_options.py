"""Modern attention's options in the checker: its plain maths with QK-norm, a window, sinks and a softcap is
multihead.MultiHeadAttention's, and each option is found by behaviour (a window from which outputs a token
moves, QK-norm from outputs that scaled projections do not move, RoPE from positions that matter)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from torch.func import functional_call

from multihead.checker.loading.calling import read_signature
from multihead.checker.bugs.catalogue import reference_variant
from multihead.checker.compare import reference_parameters
from multihead.checker.loading.learner_file import load_class
from multihead.checker.behaviour.find_options import find_window, intended, normalised, turned_by_position
from multihead.checker.behaviour.options import Options, QKNorm
from multihead.checker.loading.probes import plain_cases
from multihead.checker.roles.projections import ProjectionInputs
from multihead.checker.roles.assign import Weights, candidate_roles
from multihead.checker.behaviour.rotary import Rotary

ZOO = Path(__file__).parent / "check_zoo"
TOL = 1e-6


def _module(target: str, **init) -> nn.Module:
    module = load_class(str(ZOO / target))(16, 4, **init).double().eval()
    return module


def _spec(module, causal=True):
    spec = read_signature(module.forward)
    spec.causal = causal
    return spec


@pytest.mark.parametrize("after_rope, whole_width", [(False, False), (True, False), (False, True)])
def test_the_plain_maths_with_options_is_the_reference_modules(after_rope, whole_width):
    """catalogue.reference_variant and the MultiHeadAttention that compare.py builds for the same options give
    the same outputs: QK-norm (before RoPE, after it, over the whole width), partial RoPE, a window, sinks, a
    softcap."""
    gen = torch.Generator().manual_seed(0)
    make = lambda *shape: torch.randn(*shape, generator=gen, dtype=torch.float64)  # noqa: E731
    pairs = [(make(32, 32) / 6, make(32)) for _ in range(4)]
    norm_size = 32 if whole_width else 8
    norm = QKNorm(("qn", 1 + make(norm_size) / 3), ("kn", 1 + make(norm_size) / 3), 1e-5, after_rope, whole_width)
    options = Options(window=3, qk_norm=norm, sinks=("sinks", make(4)), softcap=5.0)
    weights = Weights(*pairs, num_heads=4, rope=Rotary(10000.0, False, False, False, rotary_dim=4))
    x = make(2, 7, 32)
    reference, params = reference_parameters(weights, options)
    want = functional_call(reference, params, (x,), {"causal": True})
    got = reference_variant(x, x, x, weights, None, causal=True, options=options)
    torch.testing.assert_close(got, want, atol=1e-12, rtol=1e-12)
    plain = reference_variant(x, x, x, weights, None, causal=True)
    assert not torch.allclose(plain, want, atol=1e-3)  # the options change the outputs


def test_a_window_is_read_from_the_outputs_a_token_moves():
    module = _module("ok_sliding_window.py:SlidingWindowAttention")
    assert find_window(module, _spec(module), (16, 16, 16), torch.float64, TOL) == 4
    assert find_window(module, _spec(module, causal=False), (16, 16, 16), torch.float64, TOL) is None
    causal = _module("ok_softcap.py:Gemma2StyleAttention")
    assert find_window(causal, _spec(causal), (16, 16, 16), torch.float64, TOL) is None


def _assignments(module):
    case = plain_cases((16, 16, 16), torch.float64, 5, 5)[0]
    spec = _spec(module)
    with ProjectionInputs(module, {"x": case[0]}) as seen:
        module(case[0])
    return spec, candidate_roles(module, seen.seen, True, 4), case


@pytest.mark.parametrize("target, kind", [("ok_qwen3_qk_norm.py:Qwen3Attention", "head"),
                                          ("qk_norm_over_width.py:NormedQKAttention", "width"),
                                          ("ok_softcap.py:Gemma2StyleAttention", None)])
def test_qk_norm_is_read_from_outputs_that_scaled_projections_do_not_move(target, kind):
    module = _module(target)
    spec, assignments, case = _assignments(module)
    before = {name: p.detach().clone() for name, p in module.named_parameters()}
    found, kept = normalised(module, spec, assignments, case)
    assert found == kind
    assert all(torch.equal(before[name], p) for name, p in module.named_parameters())  # scaled back exactly
    if kind:
        assert {kept[0].describe()["q"], kept[0].describe()["k"]} <= {"q_proj", "k_proj", "to_q", "to_k"}


def test_positions_matter_only_with_rope():
    for target, turned in (("ok_complex_rotary.py:Attention", True), ("ok_softcap.py:Gemma2StyleAttention", False)):
        module = _module(target)
        spec, _, case = _assignments(module)
        assert turned_by_position(module, spec, case) == turned


def test_the_constructor_says_what_was_meant_before_an_attribute():
    module = _module("ok_partial_rotary.py:GPTNeoXAttention")
    module.rotary_ndims = 4  # an attribute computed wrongly from rotary_pct=0.5
    meant = intended(module, {"rotary_pct": 0.5, "rotary_emb_base": 10000})
    assert meant["rotary_fraction"] == 0.5 and meant["rotary_dim"] is None
    assert intended(_module("window_off_by_one.py:LocalAttention"), {"window": 4})["window"] == 4


def test_rotations_the_other_way_and_on_the_last_features():
    t = torch.randn(1, 2, 3, 8, dtype=torch.float64)
    at = torch.arange(3)
    forward, backward = Rotary(100.0, False, False, False), Rotary(100.0, False, False, False, reverse=True)
    torch.testing.assert_close(backward.turn(forward.turn(t, at), at), t)  # turning back undoes the turn
    last = Rotary(100.0, False, False, False, rotary_dim=4, trailing=True).turn(t, at)
    first = Rotary(100.0, False, False, False, rotary_dim=4).turn(t.flip(-1), at).flip(-1)
    assert torch.equal(last[..., :4], t[..., :4]) and not torch.equal(last[..., 4:], t[..., 4:])
    assert first.shape == last.shape
    with pytest.raises(RuntimeError, match="cannot turn"):
        Rotary(100.0, False, False, False, rotary_dim=10).turn(t, at)
