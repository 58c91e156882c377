"""`multihead check` on the idioms of code people actually wrote: each test is one idiom that used to end
in a crash, exit 2, a false PASS or the wrong name, checked end to end on a zoo module."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from helpers import edited_zoo_file
from multihead.checker import check
from zoo_mutants import MUTANTS, target_path, write_mutant


def _mutant(tmp_path, target: str, bug: str) -> str:
    mutant = next(m for m in MUTANTS if m.target == target and m.bug == bug)
    return write_mutant(tmp_path, mutant)


def test_mask_gaining_its_head_axis_inside_forward_passes():
    """The Annotated Transformer's mask.unsqueeze(1) makes a (B, 1, Lq, Lk) trial mask 5-D: that trial
    returns a wrong shape and is ruled out; the (B, Lq, Lk) convention is found."""
    report = check(target_path("ok_annotated_mask_unsqueeze.py:MultiHeadedAttention"))
    assert report.passed, str(report)
    assert "mask 'mask' (B, Lq, Lk): True/1 = may attend" in report.convention_lines()
    assert report.roles == {"q": "linears.0", "k": "linears.1", "v": "linears.2", "o": "linears.3"}


def test_a_wrong_output_shape_is_a_verdict_not_a_crash(tmp_path):
    learner = edited_zoo_file(tmp_path, "ok_lazy.py", ("return self.po(y)", "return self.po(y)[:, :1]"))
    report = check(f"{learner}:LazyAttention")
    assert report.verdict == "fail" and report.exit_code == 1
    assert "forward returned shape (3, 1, 16) for a query of shape (3, 5, 16)" in report.headline()


def test_a_mask_convention_that_cannot_be_verified_never_passes(tmp_path):
    """A mask read with its keys reversed: no convention the checker knows makes blocked keys inert."""
    learner = edited_zoo_file(tmp_path, "ok_annotated_mask_unsqueeze.py",
                              ("mask = mask.unsqueeze(1)", "mask = mask.flip(-1).unsqueeze(1)"))
    report = check(f"{learner}:MultiHeadedAttention")
    assert report.verdict == "fail" and not report.passed and report.exit_code == 1
    assert "mask argument 'mask' could not be verified" in report.headline()
    assert "(B, 1, Lq, Lk)" in report.headline() and "valid lengths (B,)" in report.headline()


def test_a_mask_that_raises_under_every_convention_leads_with_the_exception(tmp_path):
    """A mask read as (B, Lk, Lq) raises whenever Lq != Lk: the exception and its line lead the report."""
    learner = edited_zoo_file(tmp_path, "ok_annotated_mask_unsqueeze.py",
                              ("mask = mask.unsqueeze(1)", "mask = mask.transpose(-1, -2).unsqueeze(1)"))
    report = check(f"{learner}:MultiHeadedAttention")
    assert report.verdict == "fail" and report.exit_code == 1
    assert "raises RuntimeError: The size of tensor a" in report.headline()
    assert report.where == "ok_annotated_mask_unsqueeze.py:18: scores = scores.masked_fill(mask == 0, -1e9)"


def test_a_mask_applied_to_one_row_for_all_is_not_passed(tmp_path):
    """Every batch row gets its own mask: a module that masks every row with row 0's mask cannot pass."""
    learner = edited_zoo_file(tmp_path, "ok_annotated_mask_unsqueeze.py",
                              ("mask = mask.unsqueeze(1)", "mask = mask[:1].unsqueeze(1)"))
    report = check(f"{learner}:MultiHeadedAttention")
    assert not report.passed and report.exit_code == 1, str(report)


def test_mask_repeated_to_the_wrong_folded_rows_is_named(tmp_path):
    report = check(_mutant(tmp_path, "ok_sd_cross_attention.py:CrossAttention", "mask-wrong-rows"))
    assert report.bug == "mask-wrong-rows" and report.topic == "heads-in-batch"
    assert "repeat_interleave" in report.explanation()


def test_gpt2_conv1d_projections_are_recognised():
    report = check(target_path("ok_gpt2_conv1d.py:Attention"))
    assert report.passed, str(report)
    assert report.roles == {"q": "c_attn rows 0:16", "k": "c_attn rows 16:32", "v": "c_attn rows 32:48",
                            "o": "c_proj"}
    assert "causal inside the module (it masks future tokens; buffer 'bias')" in report.convention_lines()


def test_transformers_own_conv1d_is_recognised():
    conv1d = pytest.importorskip("transformers.pytorch_utils").Conv1D

    class TinyGPT2Attention(nn.Module):
        def __init__(self, n_embd=16, n_head=4):
            super().__init__()
            self.n_head = n_head
            self.c_attn = conv1d(3 * n_embd, n_embd)
            self.c_proj = conv1d(n_embd, n_embd)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = (t.view(B, T, self.n_head, -1).transpose(1, 2) for t in self.c_attn(x).split(C, dim=2))
            y = torch.nn.functional.scaled_dot_product_attention(q, k, v)
            return self.c_proj(y.transpose(1, 2).reshape(B, T, C))

    report = check(TinyGPT2Attention())
    assert report.passed, str(report)
    assert report.roles["k"] == "c_attn rows 16:32" and report.roles["o"] == "c_proj"


@pytest.mark.parametrize("target", ["ok_mingpt_config.py:CausalSelfAttention", "ok_hf_bert_config.py:BertSelfAttention",
                                    "ok_clip_config_bmm.py:CLIPAttention"])
def test_config_object_constructors_are_built_from_guessed_attributes(target):
    report = check(target_path(target))
    assert report.passed, str(report)
    assert "4 heads of size 4" in report.convention_lines()
    read = next(note for note in report.notes if note.startswith("built with a config object"))
    assert "=16" in read and "=4" in read  # the width and head count it guessed


def test_config_object_from_given_attributes():
    report = check(target_path("ok_nanogpt_flash.py:FlashCausalSelfAttention"),
                   config='{"n_embd": 24, "n_head": 3, "bias": false}')
    assert report.passed, str(report)
    assert "3 heads of size 8" in report.convention_lines()


def test_arguments_in_the_order_values_keys_query_are_found_by_behaviour():
    report = check(target_path("ok_values_keys_query.py:SelfAttention"))
    assert report.passed, str(report)
    assert "arguments told apart by behaviour: query 'query', key 'keys', value 'values'" in report.convention_lines()
    assert report.roles == {"q": "queries (shared by 4 heads)", "k": "keys (shared by 4 heads)",
                            "v": "values (shared by 4 heads)", "o": "fc_out"}


def test_arguments_named_v_k_q_are_found_by_behaviour_with_a_required_mask():
    report = check(target_path("ok_tf_port_v_k_q.py:TFStyleMultiHeadAttention"))
    assert report.passed, str(report)
    assert "arguments told apart by behaviour: query 'q', key 'k', value 'v'" in report.convention_lines()
    assert "mask 'mask' (B, 1, Lq, Lk): 0/1 floats, 1 = blocked" \
        in report.convention_lines()
    assert report.roles == {"q": "wq", "k": "wk", "v": "wv", "o": "dense"}


def test_published_tutorial_scale_is_named(tmp_path):
    """The video tutorial's energy / sqrt(embed_size) with its shared per-head Linears."""
    report = check(_mutant(tmp_path, "ok_values_keys_query.py:SelfAttention", "scale-by-embed-dim"))
    assert report.bug == "scale-by-embed-dim" and report.roles["q"] == "queries (shared by 4 heads)"


def test_causal_mask_applied_after_the_softmax_names_its_buffer(tmp_path):
    report = check(_mutant(tmp_path, "ok_mingpt_config.py:CausalSelfAttention", "mask-after-softmax"))
    assert report.bug == "mask-after-softmax"
    assert "causal through buffer 'mask', applied after the softmax" in report.convention_lines()


@pytest.mark.parametrize("target, roles", [
    ("ok_nn_mha_wrapper.py:SelfAttentionLayer",
     {"q": "attn.in_proj_weight rows 0:16", "k": "attn.in_proj_weight rows 16:32",
      "v": "attn.in_proj_weight rows 32:48", "o": "attn.out_proj"}),
    ("ok_nn_mha_causal_seq_first.py:CausalMHABlock",
     {"q": "mha.in_proj_weight rows 0:16", "k": "mha.in_proj_weight rows 16:32",
      "v": "mha.in_proj_weight rows 32:48", "o": "mha.out_proj"}),
])
def test_modules_wrapping_torch_multihead_attention_are_checked(target, roles):
    report = check(target_path(target))
    assert report.passed, str(report)
    assert report.roles == roles


def test_torch_multihead_attention_with_its_own_key_and_value_widths():
    class Memory(nn.Module):
        def __init__(self):
            super().__init__()
            self.attn = nn.MultiheadAttention(16, 2, kdim=8, vdim=12, batch_first=True)

        def forward(self, query, key, value):
            return self.attn(query, key, value)[0]

    module = Memory()
    module.kdim, module.vdim = 8, 12
    report = check(module)
    assert report.passed, str(report)
    assert report.roles["k"] == "attn.k_proj_weight" and "2 heads of size 8" in report.convention_lines()


@pytest.mark.parametrize("heads, init_bug", [(4, None), (3, {"d_model": 12, "num_heads": 3}),
                                             (2, {"d_model": 16, "num_heads": 2})])
def test_halved_scale_is_told_apart_for_any_head_count(heads, init_bug):
    report = check(target_path("scale_halved.py:HalfScaleAttention"), init=init_bug)
    assert report.bug == "scale-halved", str(report)
    assert f"{heads} heads of size 4" in report.convention_lines() or heads == 2


@pytest.mark.parametrize("heads", [2, 3, 4, 8])
def test_scale_by_embed_dim_and_missing_scale_for_any_head_count(tmp_path, heads):
    sizes = {"config": {"n_embd": 8 * heads, "n_head": heads}}
    by_embed = check(_mutant(tmp_path, "ok_mingpt_config.py:CausalSelfAttention", "scale-by-embed-dim"), **sizes)
    assert by_embed.bug == "scale-by-embed-dim", str(by_embed)
    learner = edited_zoo_file(tmp_path, "ok_mingpt_config.py", (" * (1.0 / math.sqrt(k.size(-1)))", ""),
                              name="unscaled.py")
    assert check(f"{learner}:CausalSelfAttention", **sizes).bug == "missing-scale"


def test_an_instance_with_two_scale_readings_says_so():
    """Built by the learner with 4 heads of 4, 1/(2 sqrt(D)) = 1/sqrt(H D) = 1/D: it cannot be rebuilt."""
    from multihead.checker.loading.learner_file import load_class

    module = load_class(target_path("scale_halved.py:HalfScaleAttention"))(16, 4)
    report = check(module)
    assert report.bug in ("scale-by-embed-dim", "scale-halved", "scale-by-head-dim")
    assert any("give the same scale" in note for note in report.notes), report.notes


@pytest.mark.parametrize("target, roles", [
    ("ok_sd_cross_attention.py:CrossAttention", {"q": "to_q", "k": "to_k", "v": "to_v", "o": "to_out.0"}),
    ("ok_fairseq_bmm_seq_first.py:MultiheadAttention", {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "out_proj"}),
    ("ok_clip_config_bmm.py:CLIPAttention", {"q": "q_proj", "k": "k_proj", "v": "v_proj", "o": "out_proj"}),
    ("ok_whisper_split_scale.py:MultiHeadAttention", {"q": "query", "k": "key", "v": "value", "o": "out"}),
    ("ok_former_bmm.py:SelfAttention", {"q": "toqueries", "k": "tokeys", "v": "tovalues", "o": "unifyheads"}),
    ("ok_mingpt_config.py:CausalSelfAttention", {"q": "query", "k": "key", "v": "value", "o": "proj"}),
])
def test_roles_never_swap_query_and_key(target, roles):
    assert check(target_path(target)).roles == roles


def test_a_layer_norm_before_the_projections_is_part_of_the_input():
    report = check(target_path("ok_prenorm_inside.py:PreNormAttention"))
    assert report.passed, str(report)
    assert ("its projections read the output of 'norm' (LayerNorm, inside the module): the attention is checked "
            "on that") in report.convention_lines()


def test_a_mask_that_only_switches_causality_on_is_checked_with_the_causal_pattern():
    report = check(target_path("ok_mask_switches_causal.py:DecoderAttention"))
    assert report.passed, str(report)
    assert ("mask 'mask': any mask switches causal masking on (its values are not read); checked with the causal "
            "pattern") in report.convention_lines()


def test_a_scale_switch_that_defaults_to_off_is_turned_on_and_said():
    report = check(target_path("ok_gpt2_scale_switch.py:GPT2Attention"))
    assert report.passed, str(report)
    assert report.notes[0].startswith("built with scale=True: its default is False")
    assert check(target_path("ok_gpt2_scale_switch.py:GPT2Attention"), init={"scale": False}).bug == "missing-scale"


def test_two_mistakes_a_form_and_a_wrong_scale(tmp_path):
    learner = edited_zoo_file(tmp_path, "ok_values_keys_query.py", ("[attention, values]", "[attention, keys]"),
                              ("energy / (self.head_dim ** (1 / 2))", "energy / (self.embed_size ** (1 / 2))"))
    report = check(f"{learner}:SelfAttention")
    assert report.bug == "keys-used-as-values", str(report)
    assert any(note.startswith("and a second mistake, scaled by the model width, not the head size "
                               "(scale-by-embed-dim): the scores are scaled by 0.25") for note in report.notes)


def test_a_causal_fill_and_a_mask_fill_that_differ_are_named_without_the_mask(tmp_path):
    """GPT-2 fills causal scores with -1e4 but adds the padding mask as -inf: an off-by-one causal buffer
    blocks a whole row for the first and not for the second, so it is named from unmasked outputs."""
    learner = edited_zoo_file(tmp_path, "ok_gpt2_scale_switch.py", ("torch.tril(torch.ones(n_ctx, n_ctx))",
                                                                    "torch.tril(torch.ones(n_ctx, n_ctx), diagonal=-1)"))
    report = check(f"{learner}:GPT2Attention", init={"scale": True})
    assert report.bug == "causal-off-by-one", str(report)
    assert any(note.startswith("named from the outputs without a mask") for note in report.notes)


def test_roles_of_a_module_no_variant_explains_follow_the_names(tmp_path):
    """Self-attention with symmetrised scores fits no variant, and swapping q and k changes nothing:
    behaviour cannot order them (the key projection is even defined first), so their names do."""
    learner = tmp_path / "squashed.py"
    learner.write_text(
        "import math\n\nfrom torch import nn\n\n\nclass Squashed(nn.Module):\n"
        "    def __init__(self, d_model, num_heads):\n        super().__init__()\n        self.h = num_heads\n"
        "        self.w_k = nn.Linear(d_model, d_model)\n        self.w_q = nn.Linear(d_model, d_model)\n"
        "        self.w_v = nn.Linear(d_model, d_model)\n        self.w_o = nn.Linear(d_model, d_model)\n\n"
        "    def forward(self, x):\n        B, L, E = x.shape\n"
        "        q, k, v = (f(x).view(B, L, self.h, -1).transpose(1, 2) for f in (self.w_q, self.w_k, self.w_v))\n"
        "        s = (q @ k.transpose(-2, -1) + k @ q.transpose(-2, -1)) / math.sqrt(E // self.h)\n"
        "        return self.w_o((s.softmax(-1) @ v).transpose(1, 2).reshape(B, L, E))\n")
    report = check(f"{learner}:Squashed")
    assert report.verdict == "fail" and report.bug is None and "catalogue does not know" in report.headline()
    assert report.roles == {"q": "w_q", "k": "w_k", "v": "w_v", "o": "w_o"}
