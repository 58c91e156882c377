"""The check zoo's modules: ``CORRECT`` lists every correct zoo module (file:Class) with the constructor
options the check needs (none: names are guessed); ``BUGGY`` the zoo's buggy modules with the bug id each
must get. Their mutants are in zoo_mutants.py.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

ZOO = Path(__file__).parent / "check_zoo"

# file:Class -> check() keyword arguments (init / config) for every correct zoo module
CORRECT = {
    "ok_seq_first_einsum.py:TimeMajorAttention": {},
    "ok_fused_causal.py:Block": {},
    "ok_folded_valid_lens.py:FoldMHA": {},
    "ok_stacked_heads.py:ManyHeads": {},
    "ok_lazy.py:LazyAttention": {},
    "ok_to_q_to_kv.py:XAttn": {},
    "ok_key_padding_returns_weights.py:PadAwareAttention": {},
    "ok_interleaved_qkv.py:InterleavedAttention": {},
    "ok_memory_kdim_vdim.py:MemoryAttention": {},
    "ok_causal_with_bias.py:DecoderSelfAttention": {},
    "ok_grouped_kv_heads.py:GroupedQueryAttention": {},
    "ok_annotated_mask_unsqueeze.py:MultiHeadedAttention": {},
    "ok_values_keys_query.py:SelfAttention": {},
    "ok_gpt2_conv1d.py:Attention": {},
    "ok_mingpt_config.py:CausalSelfAttention": {},
    "ok_nanogpt_flash.py:FlashCausalSelfAttention": {"config": {"n_embd": 24, "n_head": 3, "bias": False}},
    "ok_timm_fused_qkv.py:Attention": {},
    "ok_dino_returns_attn.py:DinoAttention": {},
    "ok_whisper_split_scale.py:MultiHeadAttention": {},
    "ok_sd_cross_attention.py:CrossAttention": {},
    "ok_seq2seq_energy.py:MultiHeadAttentionLayer": {},
    "ok_nn_mha_wrapper.py:SelfAttentionLayer": {},
    "ok_nn_mha_causal_seq_first.py:CausalMHABlock": {},
    "ok_hf_bert_config.py:BertSelfAttention": {},
    "ok_clip_config_bmm.py:CLIPAttention": {},
    "ok_dk_dv_sublayer.py:MultiHeadAttention": {},
    "ok_former_bmm.py:SelfAttention": {},
    "ok_former_bmm.py:SelfAttention causal": {"init": {"mask": True, "heads": 4}},
    "ok_scale_dot_submodule.py:MultiHeadAttention": {},
    "ok_video_heads_tril.py:MultiHeadAttention": {},
    "ok_vit_chunk_to_qkv.py:ViTAttention": {},
    "ok_fairseq_bmm_seq_first.py:MultiheadAttention": {},
    "ok_course_interleaved_chunk.py:MultiheadAttention": {},
    "ok_tf_port_v_k_q.py:TFStyleMultiHeadAttention": {},
    "ok_per_role_head_lists.py:ListHeadsAttention": {},
    "ok_prenorm_inside.py:PreNormAttention": {},
    "ok_mask_switches_causal.py:DecoderAttention": {},
    "ok_gpt2_scale_switch.py:GPT2Attention": {},
    "ok_key_value_query_order.py:MultiHeadedAttention": {},
    "ok_required_padding_mask.py:PaddedEncoderAttention": {},
    "ok_functional_mha_weights.py:FunctionalWeightsAttention": {},
    "ok_rope_kv_cache.py:CachedRoPEAttention": {},
    "ok_gptj_rope_cache_object.py:GPTJAttention": {},
    "ok_sdpa_mqa_cache.py:MultiQueryAttention": {},
    "ok_mla_absorbed.py:LatentAttention": {},
    "ok_mla_low_rank_queries.py:LowRankQueryMLA": {},
    "ok_hf_complete_mask.py:DecoderSelfAttention": {},
    "mask_one_means_keep.py:PaddingAwareAttention as written": {},  # valid for a caller passing 1 = blocked
    "ok_qwen3_qk_norm.py:Qwen3Attention": {},
    "ok_qk_norm_after_rotary.py:CausalSelfAttention": {},
    "ok_qk_norm_after_rope_weighted.py:RotaryNormAttention": {},
    "ok_qk_norm_after_rope_weighted.py:RotaryNormAttention without weights": {"init": {"norm_weight": False}},
    "ok_sliding_window.py:SlidingWindowAttention": {},
    "ok_partial_rotary.py:GPTNeoXAttention": {},
    "ok_complex_rotary.py:Attention": {},
    "ok_attention_sinks.py:SinkAttention": {},
    "ok_softcap.py:Gemma2StyleAttention": {},
    "ok_function_sdpa_style.py:scaled_dot_product_attention": {},
    "ok_function_assignment.py:attention": {},
}

# Correct modules whose roles only the dataflow role finder reads (raw weight arguments multiplied with @):
# checked as correct where multihead.convert.dataflow exists.
NEEDS_DATAFLOW = {
    "ok_function_weights.py:multi_head_attention": {},
}
if importlib.util.find_spec("multihead.convert.dataflow") is not None:
    CORRECT.update(NEEDS_DATAFLOW)


# file:Class -> the bug id the check must name for every buggy zoo module; "" = it must fail without a
# catalogue id (an exception under a mask, an approximation exact only on short inputs)
BUGGY = {
    "split_by_reshape.py:TinyAttn": "reshape-without-transpose",
    "merge_by_reshape.py:CrossAttention": "merge-without-transpose",
    "softmax_over_heads.py:MyMHA": "softmax-wrong-axis",
    "einsum_softmax_queries.py:SeqAttention": "softmax-wrong-axis",
    "einsum_softmax_batch.py:LabmlLike": "softmax-wrong-axis",
    "fused_no_scale.py:FusedSelfAttention": "missing-scale",
    "folded_scale_by_embed.py:FoldedAttention": "scale-by-embed-dim",
    "per_head_scale_after.py:PerHeadAttention": "scale-after-softmax",
    "padding_mask_after_softmax.py:BertishSelfAttention": "mask-after-softmax",
    "lazy_forgot_output.py:LazyHeads": "no-output-projection",
    "causal_sees_next.py:CausalSelfAttention": "causal-off-by-one",
    "causal_blocks_self.py:MaskedHeads": "causal-off-by-one",
    "weights_times_keys.py:Attention": "keys-used-as-values",
    "context_keys_as_values.py:ContextAttention": "keys-used-as-values",
    "scores_q_times_k.py:ScoresNoT": "scores-without-key-transpose",
    "view_after_transpose.py:ViewMHA": "view-on-non-contiguous",
    "capital_forward.py:SelfAttentionBlock": "forward-misspelled",
    "masked_fill_discarded.py:SelfAttn": "mask-ignored",
    "scale_halved.py:HalfScaleAttention": "scale-halved",
    "scale_twice_split.py:SplitScaleTwice": "scale-by-head-dim",
    "scale_by_model_width.py:WidthScaledAttention": "wrong-scale",
    "mask_rows_repeated.py:FoldedCrossAttention": "mask-wrong-rows",
    "scores_times_mask.py:MaskedProduct": "mask-filled-with-zero",
    "mask_sign_flipped.py:FlippedSignAttention": "mask-sign-flipped",
    "gqa_kv_tiled.py:SharedKVAttention": "kv-heads-tiled",
    "rope_half_split_on_interleaved.py:RotarySelfAttention": "rope-half-split-on-interleaved",
    "rope_interleaved_on_half_split.py:PairwiseRotaryAttention": "rope-interleaved-on-half-split",
    "kv_cache_positions_from_zero.py:StatefulRoPEAttention": "cache-positions-not-offset",
    "kv_cache_causal_top_left.py:CachedCausalSelfAttention": "cache-causal-top-left",
    "mla_wuk_transposed.py:CompressedKVAttention": "mla-absorbed-wuk-transposed",
    "raises_mask_fill_typo.py:TypoMaskAttention": "",
    "short_range_only.py:LocalWhenLongAttention": "",
    "mask_keep_sign_flipped.py:PaddedSelfAttention": "mask-sign-flipped",
    "mask_one_means_keep.py:PaddingAwareAttention": "mask-inverted",
    "qk_norm_over_width.py:NormedQKAttention": "qk-norm-wrong-axis",
    "window_off_by_one.py:LocalAttention": "window-off-by-one",
    "rope_partial_last_features.py:PartialRotaryAttention": "rope-partial-wrong-features",
}

# file:Class -> check() keyword arguments for the buggy zoo modules that need them (a caller's claim)
BUGGY_OPTIONS = {
    "mask_one_means_keep.py:PaddingAwareAttention": {"call": "mask=keep"},
}
