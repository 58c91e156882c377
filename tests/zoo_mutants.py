"""The check zoo's mutants: each is one correct module (zoo_modules.CORRECT) with one classic bug injected
by textual edits, written next to the test as its own file and checked like a learner's.

``MUTANTS`` lists them (the classic idioms here, then zoo_mutants_2026's), each with the bug id the checker must
name; ``Mutant``, ``write_mutant`` and ``target_path`` come from zoo_mutant_kind.
"""
from __future__ import annotations

from zoo_modules import BUGGY, BUGGY_OPTIONS, CORRECT, ZOO  # noqa: F401 (the zoo's modules, re-exported for the check tests)
from zoo_mutant_kind import Mutant, target_path, write_mutant  # noqa: F401 (re-exported for the check tests)
from zoo_mutant_kind import mutant as _m
from zoo_mutants_2026 import MODERN_MUTANTS

_ANNOTATED = "ok_annotated_mask_unsqueeze.py:MultiHeadedAttention"
_TUTORIAL = "ok_values_keys_query.py:SelfAttention"
_GPT2 = "ok_gpt2_conv1d.py:Attention"
_MINGPT = "ok_mingpt_config.py:CausalSelfAttention"
_NANOGPT = "ok_nanogpt_flash.py:FlashCausalSelfAttention"
_TIMM = "ok_timm_fused_qkv.py:Attention"
_DINO = "ok_dino_returns_attn.py:DinoAttention"
_WHISPER = "ok_whisper_split_scale.py:MultiHeadAttention"
_SD = "ok_sd_cross_attention.py:CrossAttention"
_SEQ2SEQ = "ok_seq2seq_energy.py:MultiHeadAttentionLayer"
_MHA = "ok_nn_mha_wrapper.py:SelfAttentionLayer"
_MHA_CAUSAL = "ok_nn_mha_causal_seq_first.py:CausalMHABlock"
_BERT = "ok_hf_bert_config.py:BertSelfAttention"
_CLIP = "ok_clip_config_bmm.py:CLIPAttention"
_DKDV = "ok_dk_dv_sublayer.py:MultiHeadAttention"
_FORMER = "ok_former_bmm.py:SelfAttention"
_FORMER_CAUSAL = "ok_former_bmm.py:SelfAttention causal"
_SCRATCH = "ok_scale_dot_submodule.py:MultiHeadAttention"
_VIDEO = "ok_video_heads_tril.py:MultiHeadAttention"
_VIT = "ok_vit_chunk_to_qkv.py:ViTAttention"
_FAIRSEQ = "ok_fairseq_bmm_seq_first.py:MultiheadAttention"
_COURSE = "ok_course_interleaved_chunk.py:MultiheadAttention"
_TF = "ok_tf_port_v_k_q.py:TFStyleMultiHeadAttention"
_LISTS = "ok_per_role_head_lists.py:ListHeadsAttention"
_PRENORM = "ok_prenorm_inside.py:PreNormAttention"
_SWITCH = "ok_mask_switches_causal.py:DecoderAttention"
_GPT2_SWITCH = "ok_gpt2_scale_switch.py:GPT2Attention"
_KVQ = "ok_key_value_query_order.py:MultiHeadedAttention"
_REQUIRED = "ok_required_padding_mask.py:PaddedEncoderAttention"
_GQA = "ok_grouped_kv_heads.py:GroupedQueryAttention"
_FUNCTIONAL = "ok_functional_mha_weights.py:FunctionalWeightsAttention"
_LLAMA_CACHE = "ok_rope_kv_cache.py:CachedRoPEAttention"
_GPTJ_CACHE = "ok_gptj_rope_cache_object.py:GPTJAttention"
_MQA_CACHE = "ok_sdpa_mqa_cache.py:MultiQueryAttention"
_MLA = "ok_mla_absorbed.py:LatentAttention"
_MLA_LOW_RANK_Q = "ok_mla_low_rank_queries.py:LowRankQueryMLA"
_HF_MASK = "ok_hf_complete_mask.py:DecoderSelfAttention"
_KEEP_COMMENT = "mask_one_means_keep.py:PaddingAwareAttention as written"

MUTANTS = [
    _m(_HF_MASK, "mask-ignored", ("attn_weights = attn_weights + causal_mask", "attn_weights + causal_mask")),
    _m(_HF_MASK, "missing-scale", ("* scaling", "")),

    _m(_KEEP_COMMENT, "mask-filled-with-zero", ("== 1, -1e9)", "== 1, 0.0)")),
    _m(_KEEP_COMMENT, "keys-used-as-values", ("(attn @ v)", "(attn @ k)")),

    _m(_MLA, "mla-absorbed-wuk-transposed", ('"bhtd,hdc->bhtc", q_nope, w_uk', '"bhtd,hcd->bhtc", q_nope, w_uk')),
    _m(_MLA, "mla-absorbed-wuk-transposed", ("w_uk = self.W_UK.weight.view(H, Dn, C)",
                                             "w_uk = self.W_UK.weight.view(H, Dn, C).transpose(1, 2)"),
       note="transposed-view"),

    _m(_MLA_LOW_RANK_Q, "mla-absorbed-wuk-transposed", ('"bshd,hdc->bshc", q_nope', '"bshd,hcd->bshc", q_nope')),
    _m(_MLA_LOW_RANK_Q, "mla-absorbed-wuk-transposed", ("wkv_b[:, :self.qk_nope_head_dim])",
                                                        "wkv_b[:, :self.qk_nope_head_dim].transpose(1, 2))"),
       note="transposed-slice"),

    _m(_MQA_CACHE, "cache-causal-top-left", ("is_causal=layer_past is None", "is_causal=True"),
       note="sdpa-is-causal-in-step"),

    _m(_LLAMA_CACHE, "cache-causal-top-left", (".tril(S - T)", ".tril()")),
    _m(_LLAMA_CACHE, "cache-positions-not-offset",
       ("torch.arange(start, start + T, device=x.device)", "torch.arange(T, device=x.device)")),
    _m(_LLAMA_CACHE, "rope-half-split-on-interleaved",
       ("torch.cat((freqs, freqs), dim=-1)", "freqs.repeat_interleave(2, dim=-1)")),
    _m(_LLAMA_CACHE, "kv-heads-tiled", ("k = k.repeat_interleave(group, dim=1)", "k = k.repeat(1, group, 1, 1)"),
       ("v = v.repeat_interleave(group, dim=1)", "v = v.repeat(1, group, 1, 1)")),
    _m(_LLAMA_CACHE, "missing-scale", (" / math.sqrt(self.head_dim)", "")),

    _m(_GPTJ_CACHE, "rope-interleaved-on-half-split",
       ("sin = sinusoid.sin().repeat_interleave(2, dim=-1)", "sin = torch.cat((sinusoid.sin(),) * 2, dim=-1)"),
       ("cos = sinusoid.cos().repeat_interleave(2, dim=-1)", "cos = torch.cat((sinusoid.cos(),) * 2, dim=-1)")),
    _m(_GPTJ_CACHE, "cache-causal-top-left", ("diagonal=S - L + 1", "diagonal=1")),
    _m(_GPTJ_CACHE, "cache-positions-not-offset",
       ("q, k = self.rotary(q, past), self.rotary(k, past)", "q, k = self.rotary(q, 0), self.rotary(k, 0)")),
    _m(_GPTJ_CACHE, "keys-used-as-values", ("torch.matmul(torch.softmax(w, dim=-1), v)",
                                            "torch.matmul(torch.softmax(w, dim=-1), k)")),

    _m(_GQA, "kv-heads-tiled", ("torch.repeat_interleave(xk, group, dim=2)", "xk.repeat(1, 1, group, 1)"),
       ("torch.repeat_interleave(xv, group, dim=2)", "xv.repeat(1, 1, group, 1)")),

    _m(_REQUIRED, "missing-scale", (" / math.sqrt(c // self.n_heads)", "")),
    _m(_REQUIRED, "softmax-wrong-axis", ("scores.softmax(-1)", "scores.softmax(-2)")),
    _m(_REQUIRED, "merge-without-transpose", ("y.transpose(1, 2).reshape(b, t, c)", "y.reshape(b, t, c)")),
    _m(_REQUIRED, "keys-used-as-values", ("scores.softmax(-1) @ v", "scores.softmax(-1) @ k")),
    _m(_REQUIRED, "mask-filled-with-zero", ('== 0, float("-inf"))', "== 0, 0.0)")),
    _m(_REQUIRED, "mask-ignored", ("scores = scores.masked_fill(", "scores.masked_fill(")),

    _m(_FUNCTIONAL, "no-output-projection", ("self.out_proj.weight, self.out_proj.bias,",
                                             "torch.eye(self.embed_dim), None,")),

    _m(_ANNOTATED, "missing-scale", (" / math.sqrt(d_k)", "")),
    _m(_ANNOTATED, "scale-by-embed-dim", ("/ math.sqrt(d_k)", "/ math.sqrt(d_k * query.size(1))")),
    _m(_ANNOTATED, "softmax-wrong-axis", ("scores.softmax(dim=-1)", "scores.softmax(dim=-2)")),
    _m(_ANNOTATED, "mask-after-softmax",
       ("    if mask is not None:\n        scores = scores.masked_fill(mask == 0, -1e9)\n"
        "    p_attn = scores.softmax(dim=-1)\n",
        "    p_attn = scores.softmax(dim=-1)\n    if mask is not None:\n"
        "        p_attn = p_attn.masked_fill(mask == 0, 0)\n")),
    _m(_ANNOTATED, "mask-ignored", ("scores = scores.masked_fill(", "scores.masked_fill(")),
    _m(_ANNOTATED, "mask-filled-with-zero", ("masked_fill(mask == 0, -1e9)", "masked_fill(mask == 0, 0)")),
    _m(_ANNOTATED, "keys-used-as-values", ("torch.matmul(p_attn, value)", "torch.matmul(p_attn, key)")),
    _m(_ANNOTATED, "merge-without-transpose", ("x = x.transpose(1, 2).contiguous()", "x = x.contiguous()")),
    _m(_ANNOTATED, "view-on-non-contiguous", ("x.transpose(1, 2).contiguous().view(", "x.transpose(1, 2).view(")),
    _m(_ANNOTATED, "reshape-without-transpose",
       ("lin(x).view(nbatches, -1, self.h, self.d_k).transpose(1, 2)", "lin(x).view(nbatches, self.h, -1, self.d_k)")),
    _m(_ANNOTATED, "scores-without-key-transpose", ("torch.matmul(query, key.transpose(-2, -1))",
                                                    "torch.matmul(query, key)")),
    _m(_ANNOTATED, "no-output-projection", ("return self.linears[-1](x)", "return x")),

    _m(_TUTORIAL, "scale-by-embed-dim", ("energy / (self.head_dim ** (1 / 2))", "energy / (self.embed_size ** (1 / 2))"),
       note="as-published"),
    _m(_TUTORIAL, "missing-scale", ("energy / (self.head_dim ** (1 / 2))", "energy")),
    _m(_TUTORIAL, "softmax-wrong-axis", ("dim=3)", "dim=2)")),
    _m(_TUTORIAL, "keys-used-as-values", ("[attention, values]", "[attention, keys]")),
    _m(_TUTORIAL, "merge-without-transpose", ('"nhql,nlhd->nqhd"', '"nhql,nlhd->nhqd"')),
    _m(_TUTORIAL, "mask-after-softmax",
       ('        if mask is not None:\n            energy = energy.masked_fill(mask == 0, float("-1e20"))\n'
        "        attention = torch.softmax(energy / (self.head_dim ** (1 / 2)), dim=3)\n",
        "        attention = torch.softmax(energy / (self.head_dim ** (1 / 2)), dim=3)\n"
        "        if mask is not None:\n            attention = attention.masked_fill(mask == 0, 0.0)\n")),

    _m(_GPT2, "missing-scale", ("w = w / math.sqrt(v.size(-1))", "w = w")),
    _m(_GPT2, "mask-after-softmax", ("        w = w * b - 1e4 * (1 - b)\n        w = nn.Softmax(dim=-1)(w)\n",
                                     "        w = nn.Softmax(dim=-1)(w)\n        w = w * b\n")),
    _m(_GPT2, "causal-off-by-one", ("torch.tril(torch.ones(n_ctx, n_ctx))",
                                    "torch.tril(torch.ones(n_ctx, n_ctx), diagonal=1)")),
    _m(_GPT2, "keys-used-as-values", ("return torch.matmul(w, v)", "return torch.matmul(w, k.transpose(-2, -1))")),
    _m(_GPT2, "no-output-projection", ("a = self.c_proj(a)", "a = a")),
    _m(_GPT2, "softmax-wrong-axis", ("nn.Softmax(dim=-1)", "nn.Softmax(dim=-2)")),

    _m(_MINGPT, "causal-off-by-one", ("torch.tril(torch.ones(size, size))",
                                      "torch.tril(torch.ones(size, size), diagonal=-1)")),
    _m(_MINGPT, "mask-filled-with-zero", ('self.mask[:, :, :T, :T] == 0, float("-inf"))', "self.mask[:, :, :T, :T] == 0, 0.0)")),
    _m(_MINGPT, "scale-by-embed-dim", ("(1.0 / math.sqrt(k.size(-1)))", "(1.0 / math.sqrt(C))")),
    _m(_MINGPT, "merge-without-transpose", ("y = y.transpose(1, 2).contiguous()", "y = y.contiguous()")),
    _m(_MINGPT, "reshape-without-transpose", (".view(B, T, self.n_head, C // self.n_head).transpose(1, 2)",
                                              ".view(B, self.n_head, T, C // self.n_head)")),
    _m(_MINGPT, "mask-after-softmax",
       ('        att = att.masked_fill(self.mask[:, :, :T, :T] == 0, float("-inf"))\n'
        "        att = F.softmax(att, dim=-1)\n",
        "        att = F.softmax(att, dim=-1)\n        att = att.masked_fill(self.mask[:, :, :T, :T] == 0, 0.0)\n")),

    _m(_NANOGPT, "missing-scale", ("is_causal=True)", "is_causal=True, scale=1.0)")),
    _m(_NANOGPT, "scale-by-embed-dim", ("is_causal=True)", "is_causal=True, scale=1.0 / math.sqrt(C))")),
    _m(_NANOGPT, "merge-without-transpose", ("y = y.transpose(1, 2).contiguous()", "y = y.contiguous()")),
    _m(_NANOGPT, "no-output-projection", ("self.resid_dropout(self.c_proj(y))", "self.resid_dropout(y)")),
    _m(_NANOGPT, "keys-used-as-values", ("scaled_dot_product_attention(q, k, v,", "scaled_dot_product_attention(q, k, k,")),

    _m(_TIMM, "missing-scale", ("q = q * self.scale", "q = q")),
    _m(_TIMM, "scale-by-embed-dim", ("self.scale = self.head_dim ** -0.5", "self.scale = dim ** -0.5")),
    _m(_TIMM, "softmax-wrong-axis", ("attn.softmax(dim=-1)", "attn.softmax(dim=-2)")),
    _m(_TIMM, "keys-used-as-values", ("x = attn @ v", "x = attn @ k")),
    _m(_TIMM, "merge-without-transpose", ("x = x.transpose(1, 2).reshape(B, N, C)", "x = x.reshape(B, N, C)")),
    _m(_TIMM, "no-output-projection", ("x = self.proj(x)", "x = x")),

    _m(_DINO, "scale-halved", ("qk_scale or head_dim ** -0.5", "qk_scale or 0.5 * head_dim ** -0.5")),
    _m(_DINO, "missing-scale", ("attn = (q @ k.transpose(-2, -1)) * self.scale", "attn = q @ k.transpose(-2, -1)")),
    _m(_DINO, "scale-after-softmax",
       ("        attn = (q @ k.transpose(-2, -1)) * self.scale\n        attn = attn.softmax(dim=-1)\n",
        "        attn = (q @ k.transpose(-2, -1)).softmax(dim=-1) * self.scale\n")),
    _m(_DINO, "merge-without-transpose", ("(attn @ v).transpose(1, 2).reshape(B, N, C)", "(attn @ v).reshape(B, N, C)")),

    _m(_WHISPER, "scale-by-head-dim", ("** -0.25", "** -0.5"), note="sqrt-on-both"),
    _m(_WHISPER, "missing-scale", ("scale = (n_state // self.n_head) ** -0.25", "scale = 1.0")),
    _m(_WHISPER, "scale-by-embed-dim", ("scale = (n_state // self.n_head) ** -0.25", "scale = n_state ** -0.25")),
    _m(_WHISPER, "mask-ignored", ("qk = qk + mask[:n_ctx, :n_ctx]", "qk.add(mask[:n_ctx, :n_ctx])")),

    _m(_SD, "mask-wrong-rows", ("mask[:, None, :].repeat_interleave(h, dim=0)", "mask[:, None, :].repeat(h, 1, 1)")),
    _m(_SD, "scale-by-embed-dim", ("self.scale = dim_head ** -0.5", "self.scale = inner_dim ** -0.5")),
    _m(_SD, "softmax-wrong-axis", ("attn = sim.softmax(dim=-1)", "attn = sim.softmax(dim=-2)")),
    _m(_SD, "keys-used-as-values", ('"b i j, b j d -> b i d", attn, v)', '"b i j, b j d -> b i d", attn, k)')),
    _m(_SD, "mask-ignored", ("sim.masked_fill_(~mask, max_neg_value)", "sim.masked_fill(~mask, max_neg_value)")),
    _m(_SD, "no-output-projection", ("return self.to_out(unfold_heads(out, h))", "return unfold_heads(out, h)")),

    _m(_SEQ2SEQ, "missing-scale", ("K.permute(0, 1, 3, 2)) / self.scale", "K.permute(0, 1, 3, 2))")),
    _m(_SEQ2SEQ, "scores-without-key-transpose", ("torch.matmul(Q, K.permute(0, 1, 3, 2))", "torch.matmul(Q, K)")),
    _m(_SEQ2SEQ, "mask-after-softmax",
       ("        if mask is not None:\n            energy = energy.masked_fill(mask == 0, -1e10)\n"
        "        attention = torch.softmax(energy, dim=-1)\n",
        "        attention = torch.softmax(energy, dim=-1)\n        if mask is not None:\n"
        "            attention = attention.masked_fill(mask == 0, 0)\n")),
    _m(_SEQ2SEQ, "merge-without-transpose", ("x = x.permute(0, 2, 1, 3).contiguous()", "x = x.contiguous()")),
    _m(_SEQ2SEQ, "view-on-non-contiguous", ("x = x.permute(0, 2, 1, 3).contiguous()", "x = x.permute(0, 2, 1, 3)")),
    _m(_SEQ2SEQ, "scale-by-embed-dim", ("torch.FloatTensor([self.head_dim])", "torch.FloatTensor([hid_dim])")),

    _m(_MHA, "mask-ignored", ("key_padding_mask=key_padding_mask", "key_padding_mask=None")),

    _m(_MHA_CAUSAL, "causal-off-by-one", ("diagonal=1)", "diagonal=2)"), note="sees-next"),
    _m(_MHA_CAUSAL, "causal-off-by-one", ("diagonal=1)", "diagonal=0)"), note="blocks-itself"),

    _m(_BERT, "missing-scale", ("attention_scores = attention_scores / math.sqrt(self.attention_head_size)", "")),
    _m(_BERT, "scale-by-embed-dim", ("math.sqrt(self.attention_head_size)", "math.sqrt(self.all_head_size)")),
    _m(_BERT, "softmax-wrong-axis", ("softmax(attention_scores, dim=-1)", "softmax(attention_scores, dim=1)")),
    _m(_BERT, "keys-used-as-values", ("torch.matmul(attention_probs, value_layer)",
                                      "torch.matmul(attention_probs, key_layer)")),
    _m(_BERT, "mask-ignored", ("attention_scores = attention_scores + attention_mask",
                               "attention_scores + attention_mask")),

    _m(_CLIP, "missing-scale", ("self.q_proj(hidden_states) * self.scale", "self.q_proj(hidden_states)")),
    _m(_CLIP, "mask-ignored", ("for extra in (causal_attention_mask, attention_mask):",
                               "for extra in (causal_attention_mask,):")),
    _m(_CLIP, "softmax-wrong-axis", ("softmax(attn_weights, dim=-1)", "softmax(attn_weights, dim=1)")),
    _m(_CLIP, "merge-without-transpose", ("tgt_len, self.head_dim).transpose(1, 2)", "tgt_len, self.head_dim)")),
    _m(_CLIP, "scale-halved", ("self.scale = self.head_dim ** -0.5", "self.scale = self.head_dim ** -0.5 / 2")),

    _m(_DKDV, "scale-by-embed-dim", ("temperature=d_k ** 0.5", "temperature=d_model ** 0.5")),
    _m(_DKDV, "missing-scale", ("temperature=d_k ** 0.5", "temperature=1.0")),
    _m(_DKDV, "scale-by-head-dim", ("temperature=d_k ** 0.5", "temperature=d_k")),
    _m(_DKDV, "mask-after-softmax",
       ("        if mask is not None:\n            attn = attn.masked_fill(mask == 0, -1e9)\n"
        "        attn = self.dropout(F.softmax(attn, dim=-1))\n",
        "        attn = self.dropout(F.softmax(attn, dim=-1))\n        if mask is not None:\n"
        "            attn = attn.masked_fill(mask == 0, 0.0)\n")),
    _m(_DKDV, "keys-used-as-values", ("return torch.matmul(attn, v), attn", "return torch.matmul(attn, k), attn")),
    _m(_DKDV, "no-output-projection", ("return self.dropout(self.fc(q)), attn", "return self.dropout(q), attn")),

    _m(_FORMER_CAUSAL, "causal-off-by-one", ("mask_diagonal=False)", "mask_diagonal=True)")),

    _m(_FORMER, "scale-by-embed-dim", ("(s ** (1 / 4))", "(e ** (1 / 4))")),
    _m(_FORMER, "softmax-wrong-axis", ("F.softmax(dot, dim=2)", "F.softmax(dot, dim=1)")),
    _m(_FORMER, "merge-without-transpose", ("out = out.transpose(1, 2).contiguous()", "out = out.contiguous()")),

    _m(_SCRATCH, "missing-scale", ("score = (q @ k_t) / math.sqrt(d_tensor)", "score = q @ k_t")),
    _m(_SCRATCH, "softmax-wrong-axis", ("nn.Softmax(dim=-1)", "nn.Softmax(dim=-2)")),
    _m(_SCRATCH, "mask-ignored", ("score = score.masked_fill(mask == 0, -10000)", "score.masked_fill(mask == 0, -10000)")),
    _m(_SCRATCH, "keys-used-as-values", ("return score @ v, score", "return score @ k, score")),
    _m(_SCRATCH, "view-on-non-contiguous", ("tensor.transpose(1, 2).contiguous().view(", "tensor.transpose(1, 2).view(")),
    _m(_SCRATCH, "reshape-without-transpose", ("tensor.view(batch_size, length, self.n_head, d_tensor).transpose(1, 2)",
                                               "tensor.view(batch_size, self.n_head, length, d_tensor)")),

    _m(_VIDEO, "scale-by-embed-dim", ("k.shape[-1] ** -0.5", "C ** -0.5"), note="as-first-shown"),
    _m(_VIDEO, "causal-off-by-one", ("torch.tril(torch.ones(block_size, block_size))",
                                     "torch.tril(torch.ones(block_size, block_size), diagonal=1)")),
    _m(_VIDEO, "mask-after-softmax",
       ('        wei = wei.masked_fill(self.tril[:T, :T] == 0, float("-inf"))\n        wei = F.softmax(wei, dim=-1)\n',
        "        wei = F.softmax(wei, dim=-1)\n        wei = wei.masked_fill(self.tril[:T, :T] == 0, 0.0)\n")),
    _m(_VIDEO, "no-output-projection", ("return self.dropout(self.proj(out))", "return self.dropout(out)")),
    _m(_VIDEO, "keys-used-as-values", ("return wei @ v", "return wei @ k")),

    _m(_VIT, "missing-scale", ("k.transpose(-1, -2)) * self.scale", "k.transpose(-1, -2))")),
    _m(_VIT, "softmax-wrong-axis", ("nn.Softmax(dim=-1)", "nn.Softmax(dim=1)")),
    _m(_VIT, "merge-without-transpose", ("out = out.permute(0, 2, 1, 3).reshape(b, n, h * d)", "out = out.reshape(b, n, h * d)")),
    _m(_VIT, "reshape-without-transpose", ("t.reshape(b, n, heads, hd // heads).permute(0, 2, 1, 3)",
                                           "t.reshape(b, heads, n, hd // heads)")),
    _m(_VIT, "scale-by-head-dim", ("self.scale = dim_head ** -0.5", "self.scale = dim_head ** -1")),

    _m(_FAIRSEQ, "mask-wrong-rows",
       ("attn_weights.view(bsz, self.num_heads, tgt_len, src_len)\n            attn_weights = attn_weights.masked_fill("
        "key_padding_mask.unsqueeze(1)",
        "attn_weights.view(self.num_heads, bsz, tgt_len, src_len)\n            attn_weights = attn_weights.masked_fill("
        "key_padding_mask.unsqueeze(0)")),
    _m(_FAIRSEQ, "missing-scale", ("q = self.q_proj(query) * self.scaling", "q = self.q_proj(query)")),
    _m(_FAIRSEQ, "mask-ignored", ("attn_weights = attn_weights.masked_fill(", "attn_weights.masked_fill(")),
    _m(_FAIRSEQ, "keys-used-as-values", ("attn = torch.bmm(attn_probs, v)", "attn = torch.bmm(attn_probs, k)")),
    _m(_FAIRSEQ, "softmax-wrong-axis", ("F.softmax(attn_weights, dim=-1)", "F.softmax(attn_weights, dim=1)")),
    _m(_FAIRSEQ, "scale-by-embed-dim", ("self.scaling = self.head_dim ** -0.5", "self.scaling = embed_dim ** -0.5")),

    _m(_COURSE, "missing-scale", ("attn_logits = attn_logits / math.sqrt(d_k)", "attn_logits = attn_logits")),
    _m(_COURSE, "mask-after-softmax",
       ("    if mask is not None:\n        attn_logits = attn_logits.masked_fill(mask == 0, -9e15)\n"
        "    attention = F.softmax(attn_logits, dim=-1)\n",
        "    attention = F.softmax(attn_logits, dim=-1)\n    if mask is not None:\n"
        "        attention = attention.masked_fill(mask == 0, 0)\n")),
    _m(_COURSE, "merge-without-transpose", ("values = values.permute(0, 2, 1, 3)", "values = values")),
    _m(_COURSE, "keys-used-as-values", ("return torch.matmul(attention, v), attention",
                                        "return torch.matmul(attention, k), attention")),
    _m(_COURSE, "softmax-wrong-axis", ("F.softmax(attn_logits, dim=-1)", "F.softmax(attn_logits, dim=-2)")),

    _m(_TF, "missing-scale", ("scaled_attention_logits = matmul_qk / math.sqrt(dk)", "scaled_attention_logits = matmul_qk")),
    _m(_TF, "mask-ignored", ("scaled_attention_logits += mask * -1e9", "scaled_attention_logits + mask * -1e9")),
    _m(_TF, "keys-used-as-values", ("return torch.matmul(attention_weights, v)", "return torch.matmul(attention_weights, k)")),
    _m(_TF, "merge-without-transpose", ("scaled_attention = scaled_attention.permute(0, 2, 1, 3)",
                                       "scaled_attention = scaled_attention")),
    _m(_TF, "softmax-wrong-axis", ("torch.softmax(scaled_attention_logits, dim=-1)",
                                   "torch.softmax(scaled_attention_logits, dim=-2)")),

    _m(_LISTS, "missing-scale", (" / math.sqrt(q.shape[-1])", "")),
    _m(_LISTS, "mask-after-softmax",
       ('            if mask is not None:\n                scores = scores.masked_fill(~mask, float("-inf"))\n'
        '            outputs.append(torch.einsum("bqk,bkd->bqd", scores.softmax(-1), v))\n',
        "            weights = scores.softmax(-1)\n            if mask is not None:\n"
        "                weights = weights.masked_fill(~mask, 0.0)\n"
        '            outputs.append(torch.einsum("bqk,bkd->bqd", weights, v))\n')),
    _m(_LISTS, "mask-filled-with-zero", ('scores.masked_fill(~mask, float("-inf"))', "scores * mask")),
    _m(_LISTS, "keys-used-as-values", ("scores.softmax(-1), v))", "scores.softmax(-1), k))")),
    _m(_LISTS, "no-output-projection", ("return self.out(torch.cat(outputs, dim=-1))", "return torch.cat(outputs, dim=-1)")),

    _m(_PRENORM, "missing-scale", ("q @ k.transpose(-1, -2) * self.scale", "q @ k.transpose(-1, -2)")),
    _m(_PRENORM, "softmax-wrong-axis", (".softmax(dim=-1)", ".softmax(dim=-2)")),
    _m(_PRENORM, "merge-without-transpose", ("(attn @ v).transpose(1, 2).reshape(b, n, -1)", "(attn @ v).reshape(b, n, -1)")),

    _m(_SWITCH, "keys-used-as-values", ("scaled_dot_product_attention(q, k, v,", "scaled_dot_product_attention(q, k, k,")),
    _m(_SWITCH, "missing-scale", ("q.shape[2] > 1)", "q.shape[2] > 1, scale=1.0)")),
    _m(_SWITCH, "no-output-projection", ("return self.out(a.permute(0, 2, 1, 3).flatten(start_dim=2))",
                                         "return a.permute(0, 2, 1, 3).flatten(start_dim=2)")),

    _m(_GPT2_SWITCH, "softmax-wrong-axis", ("softmax(w, dim=-1)", "softmax(w, dim=-2)")),
    _m(_GPT2_SWITCH, "causal-off-by-one", ("torch.tril(torch.ones(n_ctx, n_ctx))",
                                           "torch.tril(torch.ones(n_ctx, n_ctx), diagonal=1)")),
    _m(_GPT2_SWITCH, "mask-ignored", ("w = w + attention_mask", "w + attention_mask")),

    _m(_KVQ, "scale-by-embed-dim", ("/ math.sqrt(self.dim_per_head)", "/ math.sqrt(self.head_count * self.dim_per_head)")),
    _m(_KVQ, "keys-used-as-values", ("torch.matmul(self.dropout(attn), value)", "torch.matmul(self.dropout(attn), key)")),
    _m(_KVQ, "mask-after-softmax",
       ("        if mask is not None:\n            scores = scores.masked_fill(mask.unsqueeze(1), -1e18)\n"
        "        attn = self.softmax(scores).to(query.dtype)\n",
        "        attn = self.softmax(scores).to(query.dtype)\n        if mask is not None:\n"
        "            attn = attn.masked_fill(mask.unsqueeze(1), 0.0)\n")),
    _m(_KVQ, "merge-without-transpose", ("return x.transpose(1, 2).contiguous().view(", "return x.contiguous().view(")),
] + MODERN_MUTANTS
