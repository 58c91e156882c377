"""The checker's new measuring parts one by one: output shapes, argument order, projections (Linear,
Conv1D, nn.MultiheadAttention, shared per head), the measured scale, per-row masks, random weights."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from helpers import randn64
from multihead import textbook
from multihead.checker.loading.calling import CallSpec, LearnerError, WrongOutputShape, invoke, read_signature
from multihead.checker.bugs.catalogue import reference_variant
from multihead.checker.behaviour.mask_convention import ENCODINGS, LENGTHS, detect_encoding, try_encoding
from multihead.checker.behaviour.mask_convention import tried_text as mask_conventions_tried
from multihead.checker.roles.argument_order import find_order, order_by_names
from multihead.checker.loading.probes import randomise_projections
from multihead.checker.roles.projections import Projection, ProjectionInputs, find_projections, shared_across_heads
from multihead.checker.roles.assign import RoleAssignment
from multihead.checker.behaviour.scale import measure_scale

TOL = 1e-6


class Classic(nn.Module):
    """Textbook attention with its arguments in a chosen order: forward(*names) -> roles by name."""

    def __init__(self, order=("query", "key", "value")):
        super().__init__()
        self.inner = textbook.ClassicTransformerHeads(16, 4).double().eval()
        self.order = order

    def forward(self, a, b, c):
        given = dict(zip(self.order, (a, b, c)))
        return self.inner(given["query"], given["key"], given["value"])


def test_invoke_rejects_outputs_of_the_wrong_shape():
    class SwapsAxes(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = textbook.ClassicTransformerHeads(16, 4).double().eval()

        def forward(self, q, k, v):
            return self.inner(q, k, v).transpose(0, 1)

    module = SwapsAxes()
    spec = read_signature(module.forward)
    x = randn64(3, 5, 16, seed=0)
    with pytest.raises(LearnerError) as raised:
        invoke(module, spec, x)
    assert isinstance(raised.value.error, WrongOutputShape)
    assert str(raised.value.error) == ("forward returned shape (5, 3, 16) for a query of shape (3, 5, 16); "
                                       "expected (3, 5, features)")


@pytest.mark.parametrize("order", [("query", "key", "value"), ("value", "key", "query"), ("key", "query", "value"),
                                   ("value", "query", "key")])
def test_argument_order_is_found_by_behaviour(order):
    module = Classic(order)
    spec = read_signature(module.forward)
    found, by_behaviour = find_order(module, spec, (16, 16, 16), torch.float64, TOL)
    roles = {"query": 0, "key": 1, "value": 2}
    assert by_behaviour and found == tuple(roles[name] for name in order)


def test_argument_order_from_names_when_behaviour_cannot_tell():
    assert order_by_names(["values", "keys", "query"]) == (2, 1, 0)
    assert order_by_names(["v", "k", "q"]) == (2, 1, 0)
    assert order_by_names(["context", "x"]) == (1, 0)
    assert order_by_names(["a", "b", "c"]) is None
    spec = CallSpec(args=["v", "k", "q"], inputs="qkv")
    assert find_order(Classic(), spec, (16, 8, 8), torch.float64, TOL) == ((2, 1, 0), False)  # widths differ


def test_projections_of_every_kind():
    class Conv1D(nn.Module):  # GPT-2's layout: weight (in, out), x @ W + b
        def __init__(self, nf, nx):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(nx, nf))
            self.bias = nn.Parameter(torch.randn(nf))

        def forward(self, x):
            return x @ self.weight + self.bias

    class NotAProjection(nn.Module):  # a weight (in, out) that is not used as x @ W + b
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(4, 6))
            self.bias = nn.Parameter(torch.randn(6))

        def forward(self, x):
            return (x @ self.weight).relu()

    module = nn.ModuleDict({"c": Conv1D(6, 4), "lin": nn.Linear(4, 5), "odd": NotAProjection(),
                            "mha": nn.MultiheadAttention(8, 2)})
    found = find_projections(module)
    assert list(found) == ["c", "lin", "mha.in_proj_weight rows 0:8", "mha.in_proj_weight rows 8:16",
                           "mha.in_proj_weight rows 16:24", "mha.out_proj"]
    weight, bias = found["c"].weight_bias()
    assert weight.shape == (6, 4) and torch.equal(weight, module["c"].weight.t())
    weight, bias = found["mha.in_proj_weight rows 8:16"].weight_bias()
    assert torch.equal(weight, module["mha"].in_proj_weight[8:16])
    assert torch.equal(bias, module["mha"].in_proj_bias[8:16])


def test_one_linear_shared_by_all_heads_is_block_diagonal():
    layer = nn.Linear(4, 4)
    shared = shared_across_heads(Projection("values", layer, 4, 4), 16)
    weight, bias = shared.weight_bias()
    x = torch.randn(2, 3, 16)
    per_head = layer(x.view(2, 3, 4, 4)).reshape(2, 3, 16)
    torch.testing.assert_close(x @ weight.T + bias, per_head)
    assert (shared.heads, shared.in_features, shared.name) == (4, 16, "values (shared by 4 heads)")


def test_projection_inputs_see_the_arguments_of_an_inner_torch_attention():
    module = nn.ModuleDict({"attn": nn.MultiheadAttention(8, 2, batch_first=True)})
    q, kv = torch.randn(2, 3, 8), torch.randn(2, 4, 8)
    with ProjectionInputs(module, {"q": q, "k": kv}) as seen:
        module["attn"](q, kv, kv)
    assert seen.seen == {"attn.in_proj_weight rows 0:8": ["q"], "attn.in_proj_weight rows 8:16": ["k"],
                         "attn.in_proj_weight rows 16:24": ["k"]}


def _roles(module: nn.Module, num_heads: int) -> RoleAssignment:
    found = find_projections(module)
    return RoleAssignment({"q": [(found["W_q"], None)], "k": [(found["W_k"], None)], "v": [(found["W_v"], None)],
                           "o": [(found["W_o"], None)]}, num_heads, "separate")


@pytest.mark.parametrize("form, bug", [("no-scale", "missing-scale"), ("scale-halved", "scale-halved"),
                                       ("scale-by-embed", "scale-by-embed-dim"),
                                       ("scale-by-head-dim", "scale-by-head-dim")])
def test_measured_scale_names_the_mistake(form, bug):
    module = textbook.ClassicTransformerHeads(24, 3).double()  # 3 heads of 8: every reading differs
    roles = _roles(module, 3)
    spec = CallSpec(args=["q", "k", "v"], inputs="qkv")
    cases = [(randn64(2, 5, 24, seed=1), randn64(2, 7, 24, seed=2), randn64(2, 7, 24, seed=3), None)]
    with torch.no_grad():
        wanted = [reference_variant(*case[:3], roles.weights(), None, mistake=form) for case in cases]
    match = measure_scale(module, spec, [roles], cases, wanted, TOL, (-math.inf,))
    assert match.bug == bug and match.ambiguous == [] and match.error < TOL
    assert match.right == pytest.approx(8 ** -0.5)


def test_measured_scale_that_no_rule_names_and_one_that_two_rules_name():
    module = textbook.ClassicTransformerHeads(16, 4).double()  # 4 heads of 4: 1/(2 sqrt 4) = 1/sqrt 16 = 1/4
    roles = _roles(module, 4)
    spec = CallSpec(args=["q", "k", "v"], inputs="qkv")
    cases = [(randn64(2, 5, 16, seed=1), randn64(2, 5, 16, seed=2), randn64(2, 5, 16, seed=3), None)]
    for scale, bug, ambiguous in [(0.37, "wrong-scale", []),
                                  (0.25, "scale-by-embed-dim", ["scale-by-embed-dim", "scale-halved",
                                                                "scale-by-head-dim"])]:
        with torch.no_grad():
            wanted = [reference_variant(*case[:3], roles.weights(), None, scale=scale) for case in cases]
        match = measure_scale(module, spec, [roles], cases, wanted, TOL, (-math.inf,))
        assert (match.bug, match.ambiguous) == (bug, ambiguous)
        assert match.scale == pytest.approx(scale, rel=1e-6)


def test_a_module_whose_blocked_keys_move_everything_has_no_scale():
    module = textbook.ClassicTransformerHeads(16, 4).double()
    roles = _roles(module, 4)
    spec = CallSpec(args=["q", "k", "v"], inputs="qkv")
    cases = [(randn64(2, 5, 16, seed=1), randn64(2, 5, 16, seed=2), randn64(2, 5, 16, seed=3), None)]
    with torch.no_grad():
        wanted = [reference_variant(*case[:3], roles.weights(), None, mistake="weights-times-keys") for case in cases]
    assert measure_scale(module, spec, [roles], cases, wanted, TOL, (-math.inf,)) is None


class RowZeroMask(nn.Module):
    """Takes a per-row keep mask but masks every batch row with row 0's."""

    def __init__(self):
        super().__init__()
        self.inner = textbook.ClassicTransformerHeads(16, 4).double().eval()

    def forward(self, q, k, v, mask=None):
        return self.inner(q, k, v, None if mask is None else mask[:1].expand_as(mask))


def test_a_shared_mask_is_refused_when_per_row_masks_run():
    module = RowZeroMask()
    spec = read_signature(module.forward)
    probe = tuple(randn64(3, 5, 16, seed=s) for s in range(3))
    assert try_encoding(module, spec, ENCODINGS[0], probe, TOL) == "moved"  # (B, 1, Lq, Lk) runs, not inert
    shared = next(e for e in ENCODINGS if e.shape == "(Lq, Lk)" and e.kind == "keep")
    assert try_encoding(module, spec, shared, probe, TOL) == "inert"
    assert detect_encoding(module, spec, probe, TOL) is None
    assert "(B, 1, Lq, Lk)" in mask_conventions_tried() and "valid lengths" in mask_conventions_tried()


def test_random_projection_weights_replace_zeros():
    module = nn.ModuleDict({"q": nn.Linear(4, 4), "o": nn.Linear(4, 4)})
    nn.init.zeros_(module["o"].weight)
    randomise_projections(find_projections(module))
    assert module["o"].weight.abs().min() > 0 and module["o"].weight.std() > 0.1


def test_a_mask_whose_presence_alone_makes_it_causal():
    class Switch(nn.Module):
        def __init__(self, honour_values: bool):
            super().__init__()
            self.inner = textbook.ClassicTransformerHeads(16, 4).double().eval()
            self.honour_values = honour_values

        def forward(self, x, mask=None):
            L = x.shape[1]
            causal = torch.ones(L, L, dtype=torch.bool).tril().expand(x.shape[0], 1, L, L)
            if mask is None:
                return self.inner(x, x, x)
            return self.inner(x, x, x, (mask & causal) if self.honour_values else causal)

    from multihead.checker.behaviour.mask_convention import causal_switch

    probe = tuple(randn64(3, 5, 16, seed=s) for s in range(3))
    spec = read_signature(Switch(False).forward)
    found = causal_switch(Switch(False), spec, probe, TOL)
    assert (found.kind, found.family) == ("causal-switch", "causal")
    assert causal_switch(Switch(True), spec, probe, TOL) is None  # it reads the mask's values


def test_the_input_of_a_layer_before_the_projections_is_found():
    class PreNorm(nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = nn.LayerNorm(8)
            self.qkv = nn.Linear(8, 24)

        def forward(self, x):
            return self.qkv(self.norm(x))

    module, x = PreNorm(), torch.randn(2, 3, 8)
    with ProjectionInputs(module, {"x": x}) as seen:
        module(x)
    assert seen.seen == {"qkv": ["mid"]} and seen.transformed_inputs() == {"x": "norm"}


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("encoding", [e for e in ENCODINGS if e.kind == "keep"] + LENGTHS[:1],
                         ids=lambda e: f"{e.kind} {e.shape}")
def test_masked_probes_give_every_batch_row_its_own_mask(encoding, causal):
    from multihead.checker.loading.probes import masked_cases

    spec = CallSpec(args=["x"], inputs="x", encoding=encoding, causal=causal)
    for L, Lk in ((5, 5), (5, 7), (4, 4), (8, 8)):
        for *_, keep in masked_cases(spec, (16,) * 3, torch.float64, L, Lk):
            assert keep.any(-1).all() and (not causal or keep[..., 0].all())
            rows = [keep[b] for b in range(keep.shape[0])]
            alike = [(a, b) for a in range(len(rows)) for b in range(a + 1, len(rows)) if torch.equal(rows[a], rows[b])]
            assert alike == [] or encoding.family == "shared", (L, Lk, alike)


def test_what_each_projection_read_is_described():
    from multihead.checker.roles.projections import describe_seen

    module = nn.ModuleDict({"c_attn": nn.Linear(16, 48), "c_proj": nn.Linear(16, 16), "spare": nn.Linear(8, 8)})
    found = find_projections(module)
    assert describe_seen(found, {"c_attn": ["x"], "c_proj": ["mid", "mid"]}) == \
        "c_attn (16 -> 48) <- x; c_proj (16 -> 16) <- mid; spare (8 -> 8) <- -"
    assert describe_seen({}, {}) == "-"
