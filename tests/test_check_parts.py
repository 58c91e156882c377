"""The checker's parts one by one: signature reading, hints, layout/causal/mask detection, role
candidates, error measures, exception matching and the report object."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

import multihead as mh

from helpers import randn64
from multihead import AttentionError, textbook
from multihead.checker.loading.calling import (CallSpec, LearnerError, attention_inputs, first_tensor, invoke, read_signature,
                                     to_layout)
from multihead.checker.compare import agree, compare_with_reference, reference_output, relative_error
from multihead.checker.behaviour.layout import accepts_cross_lengths, causal_buffer, detect_causal, detect_layout
from multihead.checker.bugs.diagnose import closest, exception_signature, match_exception, random_weights, variant_outputs
from multihead.checker.loading.call_hints import Hints, apply_hints, parse_hints
from multihead.checker.loading.learner_file import LoadError
from multihead.checker.behaviour.mask_convention import ENCODINGS, LENGTHS, detect_encoding, probe_pattern, random_pattern
from multihead.checker.bugs.report import CheckReport
from multihead.checker.roles.assign import LinearInputs, candidate_roles, linear_layers
from multihead.checker.bugs.sentences import check_lang, say

TOL = 1e-6


def _x(B=3, L=5, E=16, seed=0):
    return randn64(B, L, E, seed=seed)


def _qkv(B=3, L=5, E=16):
    return _x(B, L, E), _x(B, L, E, seed=1), _x(B, L, E, seed=2)


@pytest.mark.parametrize("signature, inputs, args, mask, kind", [
    ("self, x", "x", ["x"], None, None),
    ("self, hidden_state, attention_mask=None", "x", ["hidden_state"], "attention_mask", "mask"),
    ("self, Q, K, V, mask=None", "qkv", ["Q", "K", "V"], "mask", "mask"),
    ("self, queries, keys, values, valid_lens", "qkv", ["queries", "keys", "values"], "valid_lens", "lengths"),
    ("self, query, key=None, value=None, need_weights=False", "qkv", ["query", "key", "value"], None, None),
    ("self, x, context, attn_bias=None", "q_kv", ["x", "context"], "attn_bias", "mask"),
    ("self, *, query, key, value, mask=None", "qkv", ["query", "key", "value"], "mask", "mask"),
])
def test_read_signature(signature, inputs, args, mask, kind):
    namespace = {}
    exec(f"def forward({signature}):\n    pass\n", namespace)
    spec = read_signature(namespace["forward"])
    assert (spec.inputs, spec.args, spec.mask_param, spec.mask_kind) == (inputs, args, mask, kind)
    assert spec.mask_required == (mask is not None and f"{mask}=" not in signature)


def test_hints_parse_and_apply():
    hints = parse_hints("heads=2, layout=seq, causal=no, inputs=qkv, mask=key_padding")
    assert hints == Hints(heads=2, layout="seq", causal=False, inputs="qkv", mask="key_padding")
    spec = apply_hints(CallSpec(args=["x"], inputs="x", causal=True), hints)
    assert (spec.inputs, spec.layout, spec.causal, spec.mask_claim) == ("qkv", "seq", False, "key_padding")
    assert parse_hints(None) == Hints()
    for bad, words in [("heads=0", "positive"), ("color=red", "unknown"), ("layout", "key=value"),
                       ("mask=ones", "keep, block, additive, lengths, key_padding")]:
        with pytest.raises(LoadError, match=words):
            parse_hints(bad)


def test_layout_and_causality_are_found_by_behaviour():
    seq = textbook.SeqFirstEinsumHeads(4, 16, dropout_prob=0.0).double().eval()
    spec = read_signature(seq.forward)
    assert detect_layout(seq, spec, _qkv(), TOL) == "seq"
    split = textbook.SplitHeads(16, 16, 8, 0.0, 4).double().eval()
    split_spec = read_signature(split.forward)
    assert detect_layout(split, split_spec, _qkv(), TOL) == "batch"
    assert detect_causal(split, split_spec, _qkv(2, 6), TOL)
    classic = textbook.ClassicTransformerHeads(16, 4).double().eval()
    classic_spec = read_signature(classic.forward)
    assert not detect_causal(classic, classic_spec, _qkv(2, 6), TOL)
    assert accepts_cross_lengths(classic, classic_spec, (_x(3, 5), _x(3, 7), _x(3, 7, seed=1)))
    assert causal_buffer(split) == "mask" and causal_buffer(classic) is None


def test_layout_conversion_and_output_unwrapping():
    x = _x()
    assert to_layout(x, "seq").shape == (5, 3, 16) and torch.equal(to_layout(to_layout(x, "seq"), "seq"), x)
    assert first_tensor(((x, None), "weights")) is x
    with pytest.raises(TypeError, match="expected a tensor"):
        first_tensor({"out": x})


def test_attention_inputs_follow_the_forward_signature():
    xq, xk, xv = _qkv()
    assert attention_inputs(CallSpec(args=["x"], inputs="x"), xq, None, None) == (xq, xq, xq)
    assert attention_inputs(CallSpec(args=["x", "ctx"], inputs="q_kv"), xq, xk, None) == (xq, xk, xk)
    assert attention_inputs(CallSpec(args=["q", "k", "v"], inputs="qkv"), xq, xk, xv) == (xq, xk, xv)


def test_invoke_wraps_learner_errors_with_their_line():
    class Broken(nn.Module):
        def forward(self, x):
            return x.view(-1, 7, 3)  # raises: 240 elements do not split into (-1, 7, 3)

    with pytest.raises(LearnerError) as caught:
        invoke(Broken(), CallSpec(args=["x"], inputs="x"), _x())
    assert "test_check_parts.py" in caught.value.where and "x.view(-1, 7, 3)" in caught.value.where


@pytest.mark.parametrize("family", ["full", "shared", "key", "lengths"])
def test_random_patterns_fit_their_family(family):
    keep = random_pattern(family, 3, 4, 6, torch.Generator().manual_seed(0))
    assert keep.shape == (3, 4, 6) and keep.any(-1).all()
    if family in ("shared",):
        assert (keep == keep[:1]).all()
    if family in ("key", "lengths"):
        assert (keep == keep[:, :1]).all()
    if family == "lengths":
        assert torch.equal(keep, keep.cummin(-1).values)  # a prefix of kept keys
    probe = probe_pattern(family, 3, 4, 6)
    assert (~probe).any() and probe.any(-1).all()


@pytest.mark.parametrize("module, kind, shape", [
    (textbook.ReshapeTransposeHeads(16, 4), "block01", "(B, 1, Lq, Lk)"),
    (textbook.ClassicTransformerHeads(16, 4), "keep", "(B, 1, Lq, Lk)"),
    (textbook.SeqFirstEinsumHeads(4, 16, dropout_prob=0.0), "keep", "(Lq, Lk, B)"),
    (textbook.FoldedBatchHeads(16, 16, 16, 16, 4, 0.0), "lengths", "(B,)"),
])
def test_mask_conventions_are_found(module, kind, shape):
    module = module.double().eval()
    spec = read_signature(module.forward)
    spec.layout = detect_layout(module, spec, _qkv(), TOL)
    encoding = detect_encoding(module, spec, (_x(3, 5), _x(3, 5, seed=1), _x(3, 5, seed=2)), TOL)
    assert (encoding.kind, encoding.shape) == (kind, shape)


# How each convention reads back as keep (True = may attend), and where its shape puts (B, Lq, Lk).
_READ_BACK = {"keep": lambda t: t != 0, "block": lambda t: t == 0, "block01": lambda t: t == 0,
              "additive": lambda t: t == 0, "multihead-mask": lambda m: m.materialize(2, 1, 3, 4)[0]}
_TO_B_LQ_LK = {"(B, 1, Lq, Lk)": lambda t: t[:, 0], "(B, Lq, Lk)": lambda t: t, "(Lq, Lk)": lambda t: t[None],
               "(B, 1, 1, Lk)": lambda t: t[:, 0], "(B, 1, Lk)": lambda t: t, "(B, Lk)": lambda t: t[:, None],
               "(Lq, Lk, B)": lambda t: t.permute(2, 0, 1)}


@pytest.mark.parametrize("encoding", ENCODINGS, ids=lambda e: f"{e.kind} {e.shape}")
def test_every_encoding_carries_its_family_of_patterns(encoding):
    keep = random_pattern(encoding.family, 2, 3, 4, torch.Generator().manual_seed(1))  # (B, Lq, Lk)
    encoded = encoding.encode(keep, torch.float64)
    assert isinstance(encoded, mh.Mask) if encoding.kind == "multihead-mask" else encoded.dtype in (torch.bool,
                                                                                                     torch.float64)
    read = _TO_B_LQ_LK[encoding.shape](_READ_BACK[encoding.kind](encoded))
    assert torch.equal(read.expand(2, 3, 4), keep)
    if encoding.kind == "additive":
        assert set(encoded.unique().tolist()) <= {0.0, float("-inf")}


@pytest.mark.parametrize("shape", ["(B,)", "(B, Lq)"])
def test_lengths_encodings_count_the_kept_keys(shape):
    keep = random_pattern("lengths", 2, 3, 4, torch.Generator().manual_seed(1))
    encoding = next(e for e in LENGTHS if e.shape == shape)
    lengths = encoding.encode(keep, torch.float64)
    assert lengths.shape == ((2,) if shape == "(B,)" else (2, 3))
    assert torch.equal(torch.arange(4) < lengths.reshape(2, -1, 1), keep if shape == "(B, Lq)" else keep[:, :1])


def test_role_candidates_for_a_fused_projection():
    class Fused(nn.Module):
        def __init__(self):
            super().__init__()
            self.mix = nn.Linear(16, 48)
            self.back = nn.Linear(16, 16)

        def forward(self, x):
            q, k, v = self.mix(x).chunk(3, -1)
            return self.back(q + k + v)

    module = Fused()
    x = _x().float()
    with LinearInputs(module, {"x": x}) as seen:
        module(x)
    assert seen.seen == {"mix": ["x"], "back": ["mid"]}
    assert list(linear_layers(module)) == ["mix", "back"]
    found = candidate_roles(module, seen.seen, True, 4)
    assert {a.style for a in found} == {"fused", "fused-per-head"}
    assert all(a.describe()["o"] == "back" and a.num_heads == 4 for a in found)
    assert found[0].weights(module).q[0].shape == (16, 16)


def test_role_candidates_for_a_key_and_a_value_linear_on_one_context():
    layers = {name: nn.Linear(16, 16) for name in ("to_q", "to_k", "to_v", "to_out")}
    module = nn.ModuleDict(layers)
    seen = {"to_q": ["q"], "to_k": ["k"], "to_v": ["k"], "to_out": ["mid"]}  # forward(x, context)
    found = candidate_roles(module, seen, False, 4)
    assert {(a.describe()["k"], a.describe()["v"]) for a in found} == {("to_k", "to_v"), ("to_v", "to_k")}
    assert all(a.describe()["q"] == "to_q" and a.describe()["o"] == "to_out" for a in found)


def test_relative_error_treats_nan_positions():
    a = torch.tensor([1.0, float("nan"), 2.0])
    assert agree(a, a.clone(), 1e-6) and not agree(a, torch.tensor([1.0, float("nan"), 2.1]), 1e-6)
    assert relative_error(a, a.clone()) == 0.0
    assert relative_error(a, torch.tensor([1.0, 0.0, 2.0])) == math.inf
    assert relative_error(torch.tensor([1.0, 3.0]), torch.tensor([1.0, 2.0])) == pytest.approx(0.5)
    assert relative_error(torch.zeros(2), torch.zeros(3)) == math.inf


def test_reference_comparison_on_a_textbook_module():
    module = textbook.ClassicTransformerHeads(16, 4).double().eval()
    spec = read_signature(module.forward)
    roles = candidate_roles(module, {"W_q": ["q"], "W_k": ["k"], "W_v": ["v"], "W_o": ["mid"]}, False, 4)[0]
    keep = torch.ones(2, 5, 7, dtype=torch.bool)
    keep[..., 5:] = False
    spec.encoding = ENCODINGS[0]  # keep, (B, 1, Lq, Lk)
    cases = [(_x(2, 5), _x(2, 7, seed=1), _x(2, 7, seed=2), keep)]
    assert reference_output(roles.weights(module), spec, *cases[0]).shape == (2, 5, 16)
    forward_error, grad_error = compare_with_reference(module, spec, roles, cases)
    assert forward_error < 1e-9 and grad_error < 1e-9


def test_closest_variant_names_the_form_behind_the_outputs():
    module = textbook.ClassicTransformerHeads(16, 4).double().eval()
    spec = read_signature(module.forward)
    seen = {"W_q": ["q"], "W_k": ["k"], "W_v": ["v"], "W_o": ["mid"]}
    roles = candidate_roles(module, seen, False, None)  # every head count that divides 16
    cases = [(_x(2, 5), _x(2, 7, seed=1), _x(2, 7, seed=2), None)]
    right = next(r for r in roles if r.num_heads == 4)
    forms = [None, "no-scale", "weights-times-keys"]
    with torch.no_grad():
        for form in forms:
            wanted = variant_outputs(module, spec, right, cases, form, -math.inf)
            match = closest(module, spec, roles, cases, wanted, forms)
            assert (match.form, match.roles.num_heads, match.error) == (form, 4, 0.0)
        assert match.bug_id == "keys-used-as-values"


def test_exceptions_are_matched_by_kind_and_words():
    spec = CallSpec(args=["x"], inputs="x")
    case = (_x(2, 5), None, None, None)
    weights = random_weights((16, 16, 16), 16, 4, torch.float64)
    try:
        torch.zeros(2, 4, 5, 4).transpose(1, 2).view(2, 5, 16)
    except RuntimeError as error:
        assert match_exception(error, weights, spec, case) == "merge-by-view"
        assert exception_signature(error).startswith("RuntimeError: view size is not compatible")
    assert match_exception(KeyError("q"), weights, spec, case) is None


def test_report_object():
    report = CheckReport(target="a.py:A", verdict="fail", bug="missing-scale", error=0.3, lang="zh")
    assert report.exit_code == 1 and not report.passed and report.topic == "scale-sqrt-dk"
    data = report.to_dict()
    assert data["bug"] == "missing-scale" and "sqrt(head_dim)" in data["explanation"]
    assert str(report).startswith("未通过：a.py:A：注意力分数没有缩放（missing-scale）")
    assert CheckReport(target="a", reason="x").exit_code == 2
    assert say("pass", "en", target="t", error=0.0).startswith("PASS")
    assert check_lang("zh") == "zh"
    with pytest.raises(AttentionError, match="en, zh"):
        check_lang("fr")


def test_checker_failures_are_reported_not_raised(monkeypatch):
    from multihead.checker import run, verdict  # (`import multihead.checker.run as run` meets mh.check)

    def broken(*args, **kwargs):
        raise IndexError("unexpected layout")

    monkeypatch.setattr(verdict, "candidate_roles", broken)
    report = run.check(textbook.SplitHeads)
    assert report.exit_code == 2 and "IndexError: unexpected layout" in report.reason


def test_no_input_projection_gives_no_candidates():
    class NoProjections(nn.Module):
        def __init__(self):
            super().__init__()
            self.out = nn.Linear(16, 16)

    assert candidate_roles(NoProjections(), {"out": ["mid"]}, True, 4) == []
    assert candidate_roles(NoProjections(), {}, True, 4) == []


def test_report_pretty_printing_is_the_text_report():
    report = CheckReport(target="a.py:A", verdict="pass", error=0.0, grad_error=0.0)

    class Printer:  # IPython's pretty printer interface, as far as _repr_pretty_ uses it
        def __init__(self):
            self.printed = []

        def text(self, value):
            self.printed.append(value)

    printer = Printer()
    report._repr_pretty_(printer, False)
    assert printer.printed == [str(report)] and str(report).startswith("PASS: a.py:A")


def test_probe_cases_are_fixed_and_sized_apart():
    from multihead.checker.loading.probes import PROBE_BATCH, inputs, masked_cases, plain_cases

    xq, xk, xv = inputs((16, 12, 8), PROBE_BATCH, 5, 7, torch.float64, seed=1)
    assert (xq.shape, xk.shape, xv.shape) == ((3, 5, 16), (3, 7, 12), (3, 7, 8))
    assert torch.equal(xq, inputs((16, 12, 8), PROBE_BATCH, 5, 7, torch.float64, seed=1)[0])
    assert [case[3] for case in plain_cases((16,) * 3, torch.float64, 5, 7)] == [None, None]
    spec = CallSpec(args=["x"], inputs="x", causal=True, encoding=ENCODINGS[0])
    masked = masked_cases(spec, (16,) * 3, torch.float64, 5, 5)
    assert len(masked) == 2 and all(keep[..., 0].all() for *_, keep in masked)
    assert masked_cases(CallSpec(args=["x"], inputs="x"), (16,) * 3, torch.float64, 5, 5) == []
