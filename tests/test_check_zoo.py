"""`multihead check` on the zoo: learner modules in varied styles, each buggy one named by its id,
each correct one (the idioms of well-known public code, and unusual styles) passing."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from helpers import edited_zoo_file
from multihead.checker import BUGS, check
from zoo_mutants import BUGGY, BUGGY_OPTIONS, CORRECT, target_path
from multihead.checker.loading.learner_file import load_class

ZOO = Path(__file__).parent / "check_zoo"

# file:Class -> the bug id it has (None = correct)
EXPECTED = {**{target: bug for target, bug in BUGGY.items() if bug},
            **{target: None for target in CORRECT if " " not in target}}


@pytest.mark.parametrize("target", sorted(EXPECTED))
def test_zoo_module_gets_its_verdict(target):
    report = check(str(ZOO / target), **CORRECT.get(target, BUGGY_OPTIONS.get(target, {})))
    expected = EXPECTED[target]
    assert report.bug == expected, str(report)
    assert report.verdict == ("pass" if expected is None else "fail"), str(report)
    assert report.exit_code == (0 if expected is None else 1)


@pytest.mark.parametrize("target", [target for target, bug in BUGGY.items() if not bug])
def test_zoo_module_without_a_catalogue_id_fails(target):
    report = check(str(ZOO / target), **BUGGY_OPTIONS.get(target, {}))
    assert report.verdict == "fail" and report.bug is None and report.exit_code == 1, str(report)


@pytest.mark.parametrize("target", [target for target in CORRECT if " " in target])
def test_zoo_module_built_another_way_passes(target):
    assert check(target_path(target), **CORRECT[target]).passed


def test_every_catalogue_id_has_a_buggy_zoo_module():
    assert {bug.id for bug in BUGS} <= set(EXPECTED.values())


def test_zoo_modules_are_written_in_varied_styles():
    """No two zoo files share a class name, constructor and forward signature (or a function name and
    signature): they are not copies of one module."""
    seen = set()
    for target in EXPECTED:
        file_name, name = target.split(":")
        tree = ast.parse((ZOO / file_name).read_text())
        node = next(node for node in tree.body if isinstance(node, (ast.ClassDef, ast.FunctionDef)) and node.name == name)
        if isinstance(node, ast.FunctionDef):  # an attention function
            key = (name, None, ast.unparse(node.args))
        else:
            methods = {n.name.lower(): ast.unparse(n.args) for n in node.body if isinstance(n, ast.FunctionDef)}
            key = (name, methods.get("__init__"), next(a for n, a in methods.items() if "forward" in n))
        assert key not in seen, target
        seen.add(key)


@pytest.mark.parametrize("target, roles", [
    ("ok_fused_causal.py:Block", {"q": "c_attn rows 0:16", "k": "c_attn rows 16:32", "v": "c_attn rows 32:48",
                                  "o": "c_proj"}),
    ("ok_to_q_to_kv.py:XAttn", {"q": "to_q", "k": "to_kv rows 0:16", "v": "to_kv rows 16:32", "o": "to_out"}),
    ("ok_folded_valid_lens.py:FoldMHA", {"q": "a", "k": "b", "v": "c", "o": "d"}),
    ("context_keys_as_values.py:ContextAttention", {"q": "from_x", "k": "ctx_a", "v": "ctx_b", "o": "merge"}),
    ("lazy_forgot_output.py:LazyHeads", {"q": "q_lin", "k": "k_lin", "v": "v_lin", "o": "o_lin"}),
    ("ok_interleaved_qkv.py:InterleavedAttention",
     {role: f"query_key_value rows viewed as (H=4, 3, D)[:, {i}]" for i, role in enumerate("qkv")} | {"o": "dense"}),
])
def test_roles_are_found_by_behaviour(target, roles):
    assert check(str(ZOO / target)).roles == roles


def test_per_head_linears_are_stacked_in_head_order():
    report = check(str(ZOO / "ok_stacked_heads.py:ManyHeads"))
    assert report.roles["q"].startswith("4 per-head Linears: heads.0.query")
    assert report.roles["o"] == "proj"


@pytest.mark.parametrize("target, wanted", [
    ("ok_seq_first_einsum.py:TimeMajorAttention", ["sequence first (L, B, E)", "(Lq, Lk, B): True/1 = may attend"]),
    ("ok_fused_causal.py:Block", ["causal inside the module", "buffer 'bias'"]),
    ("ok_folded_valid_lens.py:FoldMHA", ["valid lengths 'valid_lens' (B,)", "Lq != Lk accepted"]),
    ("ok_to_q_to_kv.py:XAttn", ["query, and one tensor for keys and values", "added to the scores, -inf"]),
    ("ok_lazy.py:LazyAttention", ["forward(x, mask)", "True/1 = may attend"]),
    ("padding_mask_after_softmax.py:BertishSelfAttention", ["'attention_mask' (B, Lk)"]),
    ("ok_key_padding_returns_weights.py:PadAwareAttention", ["'key_padding_mask' (B, Lk): True/1 = blocked"]),
    ("masked_fill_discarded.py:SelfAttn", ["'mask': has no effect on the outputs"]),
    ("causal_sees_next.py:CausalSelfAttention", ["causal inside the module", "buffer 'allowed'"]),
    ("causal_blocks_self.py:MaskedHeads", ["buffer 'mask'"]),
    ("ok_grouped_kv_heads.py:GroupedQueryAttention", ["4 heads of size 4", "key/value heads: 2"]),
    ("ok_causal_with_bias.py:DecoderSelfAttention", ["causal inside the module",
                                                     "'attn_bias' (B, 1, Lq, Lk): added to the scores"]),
])
def test_conventions_are_reported(target, wanted):
    text = "\n".join(check(str(ZOO / target)).convention_lines())
    for piece in wanted:
        assert piece in text, text


def test_keys_and_values_of_their_own_widths_are_probed_with_those_widths():
    target = str(ZOO / "ok_memory_kdim_vdim.py:MemoryAttention")
    sizes = {"embed_dim": 16, "num_heads": 2, "kdim": 8, "vdim": 12}
    assert check(target, init=sizes).passed  # from the constructor arguments
    module = load_class(target)(**sizes)
    module.kdim, module.vdim = 8, 12
    assert check(module).passed  # from the attributes of an instance


def test_input_width_is_not_taken_from_a_context_length(tmp_path):
    learner = edited_zoo_file(tmp_path, "ok_fused_causal.py", ("n_embd", "channels"))
    report = check(f"{learner}:Block", init={"channels": 8, "n_head": 2, "block_size": 16})
    assert report.passed, str(report)


def test_exceptions_are_diagnosed_with_the_learner_line():
    report = check(str(ZOO / "view_after_transpose.py:ViewMHA"))
    assert report.exception.startswith("RuntimeError: view size is not compatible")
    assert report.where.startswith("view_after_transpose.py:27: ")
    assert "Traceback" not in str(report)


def test_typo_report_also_checks_the_misspelled_method():
    report = check(str(ZOO / "capital_forward.py:SelfAttentionBlock"))
    assert report.bug_values == {"method": "Forward"}
    assert "'Forward'" in report.explanation()
    assert "with 'Forward' renamed to forward, it matches the reference" in report.notes
    assert report.roles["q"] == "in_proj rows 0:16"


def test_matching_outputs_with_wrong_gradients_fail(tmp_path):
    learner = edited_zoo_file(tmp_path, "ok_lazy.py", ("q @ k.transpose(-2, -1)", "q @ k.detach().transpose(-2, -1)"))
    report = check(f"{learner}:LazyAttention")
    assert report.verdict == "fail" and report.bug is None
    assert report.error < 1e-6 < report.grad_error
    assert "gradients differ" in report.headline()


def test_dropout_left_on_in_eval_mode_is_reported(tmp_path):
    learner = edited_zoo_file(tmp_path, "ok_lazy.py", ("s.softmax(-1)", "nn.functional.dropout(s.softmax(-1), 0.5)"))
    report = check(f"{learner}:LazyAttention")
    assert report.verdict == "fail" and "training=True" in report.headline()


def test_module_without_linear_layers_cannot_be_checked(tmp_path):
    learner = tmp_path / "raw.py"
    learner.write_text("import torch\nfrom torch import nn\n\n\nclass Raw(nn.Module):\n"
                       "    def __init__(self, d_model, num_heads):\n        super().__init__()\n"
                       "        self.w = nn.Parameter(torch.randn(d_model, d_model))\n\n"
                       "    def forward(self, x):\n        return x @ self.w\n")
    report = check(f"{learner}:Raw")
    assert report.exit_code == 2 and "Linear" in report.reason


def test_missing_key_transpose_is_named_with_the_line_that_raised():
    report = check(str(ZOO / "scores_q_times_k.py:ScoresNoT"))
    assert report.bug == "scores-without-key-transpose"
    assert report.where.startswith("scores_q_times_k.py:21: scores = torch.matmul(q, k)")


def test_forward_that_cuts_the_graph_fails_on_gradients(tmp_path):
    learner = edited_zoo_file(tmp_path, "ok_lazy.py", ("return self.po(y)", "return self.po(y).detach()"))
    report = check(f"{learner}:LazyAttention")
    assert report.verdict == "fail" and report.grad_error == float("inf") and report.error < 1e-6


def test_a_required_mask_that_cannot_be_none_is_explained(tmp_path):
    """No convention's all-keep mask runs either (it raises on any mask): the report says None must mean no mask."""
    learner = edited_zoo_file(tmp_path, "ok_lazy.py", ("mask=None", "mask"), ("if mask is not None:", "if True:"),
                              ("s.masked_fill(", "s.masked_fil("))
    report = check(f"{learner}:LazyAttention")
    assert report.verdict == "fail" and report.exception.startswith("AttributeError")
    assert any("called without a mask (mask=None)" in note for note in report.notes), report.notes


def test_a_required_mask_is_given_an_all_keep_mask_in_its_own_convention(tmp_path):
    learner = edited_zoo_file(tmp_path, "ok_lazy.py", ("mask=None", "mask"), ("if mask is not None:", "if True:"))
    report = check(f"{learner}:LazyAttention")
    assert report.passed, str(report)
    assert any("is required (it raises on None)" in note for note in report.notes), report.notes


def test_other_exceptions_are_reported_with_their_line(tmp_path):
    learner = edited_zoo_file(tmp_path, "ok_lazy.py", ("self.po(y)", "self.p0(y)"), name="typo_attr.py")
    line = learner.read_text().splitlines().index("        return self.p0(y)") + 1
    report = check(f"{learner}:LazyAttention")
    assert report.verdict == "fail" and report.exit_code == 1 and report.bug is None
    assert report.exception.startswith("AttributeError")
    assert report.where == f"typo_attr.py:{line}: return self.p0(y)"
    assert "raises AttributeError" in report.headline()
