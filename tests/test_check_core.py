"""The core judged on the learner's own tensors (checker/core/): the first stage that differs, with its numbers
and explain topic; a module whose core is right and whose periphery is recognised passes; the frictions of
issue 35 (each with its zoo module)."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

from multihead.checker import check
from multihead.checker.core.stages import STAGES, judge_stages, trace_core
from multihead.checker.loading.calling import read_signature
from multihead.checker.loading.learner_file import load_target

ZOO = Path(__file__).parent / "check_zoo"


def _core(target: str, causal: bool, **init):
    module = load_target(str(ZOO / target))(16, 4, **init).double().eval()
    spec = read_signature(module.forward)
    spec.layout, spec.causal = "batch", causal
    x = torch.randn(2, 5, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    return trace_core(module, spec, (x, x, x)), spec


def test_the_core_is_found_in_a_manual_forward_and_in_sdpa():
    manual, _ = _core("ok_qk_norm_after_rotary.py:CausalSelfAttention", True)
    fused, _ = _core("ok_qwen3_qk_norm.py:Qwen3Attention", True)
    for core in (manual, fused):
        assert core is not None and core.q.shape == (2, 4, 5, 4) and core.merged.shape == (2, 5, 16)
    assert fused.sdpa is not None


def test_a_correct_core_has_no_stage_that_differs():
    core, spec = _core("ok_sliding_window.py:SlidingWindowAttention", True)
    finding = judge_stages(core, spec)
    assert finding.stage is None and finding.bug is None
    assert [s for s in STAGES if s in finding.judged] == finding.judged  # stages named in the maths' order


@pytest.mark.parametrize("target, stage, bug", [
    ("causal_triu_keeps_future.py:MyCausalAttention", "masked-scores", "causal-mask-reversed"),
    ("sliding_merge_no_transpose.py:WindowedAttention", "merged-heads", "merge-without-transpose"),
])
def test_the_first_stage_that_differs_names_the_bug(target, stage, bug):
    core, spec = _core(target, "sliding" in target)
    finding = judge_stages(core, spec)
    assert (finding.stage, finding.bug) == (stage, bug)
    assert finding.got and len(finding.got) == len(finding.want) and finding.where[0] == ("batch", 0)
    assert finding.got != finding.want  # the numbers shown start at the first column that differs


@pytest.mark.parametrize("lang, words", [("en", ("first stage that differs", "masked scores", "yours:", "expected:",
                                                 "batch 0, head 0, query")),
                                         ("zh", ("第一个出错的步骤", "掩码后的分数", "你的结果", "应得结果",
                                                 "第 0 个样本、第 0 个头"))])
def test_a_triu_causal_mask_is_named_with_its_stage_and_topic(lang, words):
    report = check(str(ZOO / "causal_triu_keeps_future.py:MyCausalAttention"), lang=lang)
    text = str(report)
    assert report.bug == "causal-mask-reversed" and report.topic == "masked-fill"
    assert "multihead explain masked-fill" in text and all(w in text for w in words), text


def test_causal_yes_names_the_slices_split_reads_and_invents_no_window():
    report = check(str(ZOO / "causal_triu_keeps_future.py:MyCausalAttention"), call="causal=yes")
    assert report.bug == "causal-mask-reversed"
    assert report.roles == {"q": "qkv rows 0:16", "k": "qkv rows 16:32", "v": "qkv rows 32:48", "o": "out"}
    assert not any(key == "window" for key, _ in report.conventions), str(report)


def test_an_unknown_difference_comes_with_its_stage():
    report = check(str(ZOO / "qwen3_next_gate_after_out.py:LateGateAttention"))
    assert report.verdict == "fail" and report.bug is None and report.stage is not None
    assert "the attention core is right" in str(report) and report.to_dict()["stage"] is None


def test_an_output_gate_before_the_output_projection_passes_and_says_what_was_not_compared():
    report = check(str(ZOO / "ok_qwen3_next_output_gate.py:GatedAttention"))
    assert report.passed and report.kind == "core", str(report)
    assert "output gate" in str(report) and "4 heads of size 4" in str(report)
    zh = str(check(str(ZOO / "ok_qwen3_next_output_gate.py:GatedAttention"), lang="zh"))
    assert "输出门控" in zh and "4 个头，每个头 4 维" in zh


def test_fused_qkv_through_f_linear_with_a_q_zeros_v_bias_is_judged_on_its_core():
    report = check(str(ZOO / "ok_eva_linear_qv_bias.py:EvaAttention"))
    assert report.passed and report.exit_code == 0, str(report)


@pytest.mark.parametrize("target", ["ok_gemma_qk_norm_one_plus.py:Gemma3Attention",
                                    "ok_olmo2_qk_norm_whole_width.py:Olmo2Attention",
                                    "ok_diffusers_cross_width.py:CrossAttnProcessorStyle",
                                    "ok_roformer_sinusoidal_passed_in.py:RoFormerSelfAttention",
                                    "ok_chatglm_fused_query_key_value.py:SelfAttention",
                                    "ok_dict_kv_cache.py:CachedDecoderAttention",
                                    "ok_functional_rmsnorm_before_rotary.py:NormedCausalSelfAttention",
                                    "ok_mla_tutorial_separate_ups.py:TutorialMLA",
                                    "ok_mla_hf_reference_style.py:DeepseekV2Attention"])
def test_the_2025_26_idioms_pass(target):
    report = check(str(ZOO / target))
    assert report.passed, str(report)


def test_a_weightless_norm_over_the_whole_width_is_still_named():
    assert check(str(ZOO / "qk_norm_over_width.py:NormedQKAttention")).bug == "qk-norm-wrong-axis"


def test_a_dict_cache_with_a_keep_mask_is_not_said_to_switch_causal_on():
    report = check(str(ZOO / "ok_dict_kv_cache.py:CachedDecoderAttention"))
    assert "mask:causal" not in dict(report.conventions) and "1 (True) = may attend" in str(report)


def test_cross_attention_reads_the_context_width_from_its_constructor():
    report = check(str(ZOO / "ok_diffusers_cross_width.py:CrossAttnProcessorStyle"))
    assert report.passed and "inputs:q_kv" in dict(report.conventions)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_masked_fill_with_a_positive_fill_gets_advice_about_its_fill(lang):
    report = check(str(ZOO / "mask_fill_positive.py:PaddedAttention"), lang=lang)
    advice = report.explanation()
    assert report.bug == "mask-sign-flipped" and "1e+09" in advice and "masked_fill" in advice
    assert "* 1e9" not in advice and "或者直接用 masked_fill" not in advice


def test_tiled_kv_heads_next_to_sinks_are_named():
    assert check(str(ZOO / "sinks_kv_tiled.py:SinkGQAttention")).bug == "kv-heads-tiled"


@pytest.mark.parametrize("target", ["ok_fused_causal.py:Block", "ok_interleaved_qkv.py:InterleavedAttention",
                                    "ok_stacked_heads.py:ManyHeads"])
def test_chinese_role_lines_have_no_english_fragments(target):
    lines = check(str(ZOO / target), lang="zh").role_lines()
    assert not any(word in line for line in lines for word in ("rows", "viewed as", "per-head", ", then")), lines


def test_weights_that_are_not_a_softmax_over_the_keys_are_the_first_stage(tmp_path):
    learner = tmp_path / "log_weights.py"
    learner.write_text(
        "import torch\nfrom torch import nn\n\n\nclass LogWeights(nn.Module):\n"
        "    def __init__(self, d_model, n_heads):\n        super().__init__()\n"
        "        self.h, self.d = n_heads, d_model // n_heads\n"
        "        self.qkv = nn.Linear(d_model, 3 * d_model)\n        self.proj = nn.Linear(d_model, d_model)\n\n"
        "    def forward(self, x):\n        B, L, E = x.shape\n"
        "        q, k, v = self.qkv(x).view(B, L, 3, self.h, self.d).permute(2, 0, 3, 1, 4)\n"
        "        w = torch.log_softmax(q @ k.transpose(-2, -1) / self.d ** 0.5, dim=-1)\n"
        "        return self.proj((w @ v).transpose(1, 2).reshape(B, L, E))\n")
    report = check(f"{learner}:LogWeights", lang="zh")
    assert report.verdict == "fail" and report.stage.stage == "weights" and report.stage.topic == "softmax-axis"
    assert "注意力权重" in str(report) and "multihead explain softmax-axis" in str(report)


def test_a_dict_cache_filled_in_place_is_driven_step_by_step():
    correct = check(str(ZOO / "ok_dict_kv_cache.py:CachedDecoderAttention"))
    assert correct.passed and "cache" in dict(correct.conventions), str(correct)
    buggy = check(str(ZOO / "dict_cache_causal_every_step.py:StepCausalAttention"))
    assert buggy.bug == "cache-causal-top-left", str(buggy)
