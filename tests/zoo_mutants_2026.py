"""The check zoo's mutants in the idioms of 2026 (QK-norm, windows, rotary variants, sinks, softcap, functions,
fused and raw projections, DeepSeek-style MLA, sparse attention): one correct zoo module each, with one
mistake injected by textual edits. zoo_mutants.MUTANTS lists them after the classic ones."""
from __future__ import annotations

from zoo_mutant_kind import mutant as _m

_QWEN3 = "ok_qwen3_qk_norm.py:Qwen3Attention"
_NANOCHAT = "ok_qk_norm_after_rotary.py:CausalSelfAttention"
_NORM_AFTER = "ok_qk_norm_after_rope_weighted.py:RotaryNormAttention"
_WINDOW = "ok_sliding_window.py:SlidingWindowAttention"
_SPARSE = "ok_sparse_gather.py:sparse_attention"
_SPARSE_MASK = "ok_sparse_dense_mask.py:attend_selected"
_TOPK = "ok_sparse_gather.py:select_top_k"
_TOPK_SORT = "ok_sparse_dense_mask.py:pick_keys"
_NEOX = "ok_partial_rotary.py:GPTNeoXAttention"
_COMPLEX = "ok_complex_rotary.py:Attention"
_SINKS = "ok_attention_sinks.py:SinkAttention"
_SOFTCAP = "ok_softcap.py:Gemma2StyleAttention"
_SDPA_FN = "ok_function_sdpa_style.py:scaled_dot_product_attention"
_ASSIGNMENT_FN = "ok_function_assignment.py:attention"
_FUSED_GQA = "ok_fused_gqa_wqkv.py:FusedGQA"
_PARTIAL_ROTARY = "ok_phi3_partial_rotary.py:PartialRotaryAttention"
_EINSUM_PARAMS = "ok_raw_param_einsum.py:EinsumParamAttention"
_MATMUL_PARAMS = "ok_raw_param_matmul.py:ParamMatrixAttention"
_OWN_LINEAR = "ok_custom_linear_class.py:CustomLinearAttention"
_MLA_OWN_LINEAR = "ok_mla_deepseek_linear.py:MLA"
_MLA_SWITCH = "ok_deepseek_v3_mla.py:MLA"
_ADAPTER = "ok_cs336_adapter.py:run_multihead_self_attention"
_ADAPTER_ROPE = "ok_cs336_adapter.py:run_multihead_self_attention_with_rope"
_QKVO = "ok_modded_nanogpt_qkvo.py:CausalSelfAttention"
_LENS = "ok_transformerlens_attention.py:Attention"
_HF_EAGER = "ok_hf_llama_eager.py:LlamaStyleAttention"
_MLA_COS_SIN = "ok_mla_absorb_default_rotate_half.py:LatentSelfAttention"

MODERN_MUTANTS = [
    _m(_MLA_SWITCH, "mla-absorbed-wuk-transposed", ('"bshd,hdc->bshc", q_nope', '"bshd,hcd->bshc", q_nope')),
    _m(_MLA_SWITCH, "wrong-scale", ("self.softmax_scale = self.qk_head_dim ** -0.5",
                                    "self.softmax_scale = self.qk_nope_head_dim ** -0.5"), note="nope-only"),

    _m(_MLA_COS_SIN, "mla-absorbed-wuk-transposed", ('"bhtd,hdc->bhtc", q_nope, up[:, :self.nope]',
                                                     '"bhtd,hcd->bhtc", q_nope, up[:, :self.nope]')),
    _m(_MLA_COS_SIN, "missing-scale", ("scores = scores * scale", "scores = scores * 1.0")),

    _m(_ADAPTER, "merge-without-transpose", ("t.transpose(-3, -2).reshape(*lead, seq, heads * d)",
                                             "t.reshape(*lead, seq, heads * d)")),
    _m(_ADAPTER, "causal-mask-unused", ("out = scaled_dot_product_attention(q, k, v, causal)\n    return linear(merge",
                                        "out = scaled_dot_product_attention(q, k, v)\n    return linear(merge")),

    _m(_ADAPTER_ROPE, "softmax-wrong-axis", ("return softmax(scores, dim=-1) @ V", "return softmax(scores, dim=-2) @ V")),

    _m(_QKVO, "missing-scale", ("is_causal=True)", "is_causal=True, scale=1.0)")),
    _m(_QKVO, "keys-used-as-values", ("v.transpose(1, 2), is_causal", "k.transpose(1, 2), is_causal")),

    _m(_LENS, "softmax-wrong-axis", ("attn_scores.softmax(-1)", "attn_scores.softmax(-2)")),
    _m(_LENS, "scale-by-embed-dim", ("/ self.d_head ** 0.5", "/ normalized_resid_pre.shape[-1] ** 0.5")),

    _m(_HF_EAGER, "mask-after-softmax",
       ("        attn_weights = attn_weights + attention_mask[:, :, :, : key_states.shape[-2]]\n"
        "    attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)\n",
        "        attn_weights = attn_weights.softmax(dim=-1) * (attention_mask[:, :, :, : key_states.shape[-2]] == 0)\n"
        "    else:\n"
        "        attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query.dtype)\n")),
    _m(_HF_EAGER, "kv-heads-tiled", ("hidden_states[:, :, None, :, :].expand(batch, num_key_value_heads, n_rep, slen, head_dim)",
                                     "hidden_states[:, None, :, :, :].expand(batch, n_rep, num_key_value_heads, slen, head_dim)")),

    _m(_SDPA_FN, "softmax-wrong-axis", ("torch.softmax(attn_weight, dim=-1)", "torch.softmax(attn_weight, dim=-2)")),
    _m(_SDPA_FN, "missing-scale", ("attn_weight = query @ key.transpose(-2, -1) * scale_factor",
                                   "attn_weight = query @ key.transpose(-2, -1)")),
    _m(_SDPA_FN, "mask-after-softmax",
       ("    attn_weight = attn_weight + attn_bias\n    attn_weight = torch.softmax(attn_weight, dim=-1)\n",
        "    attn_weight = torch.softmax(attn_weight, dim=-1)\n    attn_weight = attn_weight * (attn_bias == 0)\n")),

    _m(_ASSIGNMENT_FN, "scale-by-head-dim", ("/ np.sqrt(d_k)", "/ d_k")),
    _m(_ASSIGNMENT_FN, "keys-used-as-values", ("torch.matmul(p_attn, V)", "torch.matmul(p_attn, K)")),

    _m(_QWEN3, "missing-scale", ("is_causal=True)", "is_causal=True, scale=1.0)")),
    _m(_QWEN3, "kv-heads-tiled", ("k = k.repeat_interleave(self.num_heads // self.num_kv_heads, dim=1)",
                                  "k = k.repeat(1, self.num_heads // self.num_kv_heads, 1, 1)"),
       ("v = v.repeat_interleave(self.num_heads // self.num_kv_heads, dim=1)",
        "v = v.repeat(1, self.num_heads // self.num_kv_heads, 1, 1)")),

    _m(_NANOCHAT, "merge-without-transpose", ("y.transpose(1, 2).contiguous().view(B, T, -1)", "y.contiguous().view(B, T, -1)")),

    _m(_NORM_AFTER, "causal-off-by-one", ("torch.ones(t, t, dtype=torch.bool, device=x.device), 1)",
                                           "torch.ones(t, t, dtype=torch.bool, device=x.device), 2)")),
    _m(_NORM_AFTER, "scale-by-embed-dim", ("/ self.dh ** 0.5", "/ (self.h * self.dh) ** 0.5")),

    _m(_WINDOW, "window-off-by-one", ("i - j < self.window_size", "i - j <= self.window_size")),
    _m(_WINDOW, "scale-by-embed-dim", ("/ math.sqrt(self.head_dim)", "/ math.sqrt(self.n_heads * self.head_dim)")),

    _m(_NEOX, "rope-partial-wrong-features", ("self.rotary_ndims = int(self.head_size * rotary_pct)",
                                               "self.rotary_ndims = self.head_size"), note="all-features"),
    _m(_NEOX, "merge-without-transpose", ("out = torch.matmul(attn, value).permute(0, 2, 1, 3).reshape(b, t, -1)",
                                           "out = torch.matmul(attn, value).reshape(b, t, -1)")),

    _m(_COMPLEX, "missing-scale", (" / math.sqrt(self.head_dim)", "")),

    _m(_SINKS, "keys-used-as-values", ("torch.matmul(scores, v)", "torch.matmul(scores, k)")),

    _m(_SOFTCAP, "causal-off-by-one", ("device=q.device).triu(1)", "device=q.device).triu(2)")),

    # the idioms the dataflow reads: uneven fused GQA, partial rotary, raw parameters, a Linear of one's own
    _m(_FUSED_GQA, "kv-heads-tiled",
       ("k = k.repeat_interleave(self.n_head // self.n_local_heads, dim=1)",
        "k = k.repeat(1, self.n_head // self.n_local_heads, 1, 1)"),
       ("v = v.repeat_interleave(self.n_head // self.n_local_heads, dim=1)",
        "v = v.repeat(1, self.n_head // self.n_local_heads, 1, 1)")),
    _m(_FUSED_GQA, "missing-scale", ("is_causal=True)", "is_causal=True, scale=1.0)")),

    _m(_PARTIAL_ROTARY, "rope-interleaved-on-half-split",
       ("    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]\n    return torch.cat((-x2, x1), dim=-1)",
        "    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)")),
    _m(_PARTIAL_ROTARY, "missing-scale", (" * self.head_dim ** -0.5", "")),

    _m(_EINSUM_PARAMS, "softmax-wrong-axis", ("scores.softmax(dim=-1)", "scores.softmax(dim=-2)")),
    _m(_EINSUM_PARAMS, "keys-used-as-values", ('"bhqk,bkhe->bqhe", pattern, v)', '"bhqk,bkhe->bqhe", pattern, k)')),

    _m(_MATMUL_PARAMS, "scale-by-embed-dim", ("/ keys.shape[-1] ** 0.5", "/ (self.num_heads * keys.shape[-1]) ** 0.5")),
    _m(_MATMUL_PARAMS, "merge-without-transpose", ("(attn_weights @ values).transpose(1, 2).reshape(b, t, -1)",
                                                   "(attn_weights @ values).reshape(b, t, -1)")),

    _m(_OWN_LINEAR, "mask-ignored", ("scores = scores + mask.unsqueeze(1)", "scores + mask.unsqueeze(1)")),
    _m(_OWN_LINEAR, "softmax-wrong-axis", ("scores.softmax(dim=-1), v)", "scores.softmax(dim=2), v)")),

    _m(_MLA_OWN_LINEAR, "mla-absorbed-wuk-transposed", ('"bshd,hdc->bshc", q_nope', '"bshd,hcd->bshc", q_nope')),

    _m(_SPARSE, "sparse-none-unmasked", ("    scores = scores.masked_fill(free[:, None], float(\"-inf\"))\n", ""),
       note="clamped"),

    _m(_SPARSE_MASK, "sparse-none-unmasked", ("torch.where(topk_indices >= 0, topk_indices, Lk)",
                                              "topk_indices.clamp(min=0)"), note="clamped"),

    _m(_TOPK, "topk-wrong-axis", ("topk(top_k, dim=-1)", "topk(top_k, dim=1)")),

    _m(_TOPK_SORT, "topk-wrong-axis", ("dim=-1", "dim=1"), ("order[..., :3]", "order[:, :3]")),
]
