"""How each idiom of the held-out zoo keeps its weights and how it is called: one reader per idiom that
turns a built case into (weights in F.linear orientation, a reference Spec, a call style).

These readers are the verification's knowledge of each case, written from the cases' own code; they are
never given to `multihead check`. Legend: B batch, H heads, Hkv kv heads, L length, D head dim, E embed.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from reference import LatentSpec, QKNorm, Rotary, Spec


@dataclass
class Plan:
    """weights: {'q','k','v','o'} -> (weight (out, in), bias) (or MLA's names); spec: Spec or LatentSpec;
    call: how the case is called (see verify.CALLS)."""
    weights: dict
    spec: object
    call: str


def lin(layer) -> tuple:
    """(weight, bias) of anything holding .weight (out, in) and .bias: nn.Linear or a home-made Linear."""
    return layer.weight, getattr(layer, "bias", None)


def rows(layer, start: int, stop: int) -> tuple:
    weight, bias = lin(layer)
    return weight[start:stop], None if bias is None else bias[start:stop]


def table_base(sin: torch.Tensor, cos: torch.Tensor) -> float:
    """The RoPE base behind (positions, D) half-split tables: position 1's second frequency is base^(-2/D)."""
    angle = float(torch.atan2(sin[1, 1], cos[1, 1]))
    return angle ** (-sin.shape[-1] / 2)


def four(m, q: str, k: str, v: str, o: str | None) -> dict:
    """Separate projections named q, k, v, o (o None: no output projection)."""
    return {"q": lin(getattr(m, q)), "k": lin(getattr(m, k)), "v": lin(getattr(m, v)),
            "o": None if o is None else lin(getattr(m, o))}


def arena(m) -> Plan:
    """W_Q (H, E, D) used as x @ W_Q[h]; W_O (H, D, E)."""
    heads, embed, dim = m.W_Q.shape
    def per_head(w, b):
        return w.permute(0, 2, 1).reshape(heads * dim, embed), b.reshape(heads * dim)
    w = {"q": per_head(m.W_Q, m.b_Q), "k": per_head(m.W_K, m.b_K), "v": per_head(m.W_V, m.b_V),
         "o": (m.W_O.reshape(heads * dim, embed).T, m.b_O)}
    return Plan(w, Spec(heads, causal=True), "x")


def raschka_params(m) -> Plan:
    """W_query (E, E) used as x @ W; out_proj a Linear; causal buffer."""
    w = {"q": (m.W_query.T, None), "k": (m.W_key.T, None), "v": (m.W_value.T, None), "o": lin(m.out_proj)}
    return Plan(w, Spec(m.num_heads, causal=True), "x")


def causal_params(m) -> Plan:
    """W_q (E, E) used as x @ W; out_proj a Linear; causal buffer."""
    w = {"q": (m.W_q.T, None), "k": (m.W_k.T, None), "v": (m.W_v.T, None), "o": lin(m.out_proj)}
    return Plan(w, Spec(m.num_heads, causal=True), "x")


def deepseek_linear(m) -> Plan:
    return Plan(four(m, "wq", "wk", "wv", "wo"), Spec(m.n_heads), "x_additive_shared")


def deepseek_gqa(m) -> Plan:
    return Plan(four(m, "wq", "wk", "wv", "wo"), Spec(m.n_heads, m.n_kv_heads, causal=True), "x")


def mla_lowrank(m) -> Plan:
    w = {"q_a": lin(m.wq_a), "q_norm": m.q_norm.weight, "q_b": lin(m.wq_b), "kv_a": lin(m.wkv_a),
         "kv_norm": m.kv_norm.weight, "kv_b": lin(m.wkv_b), "o": lin(m.wo)}
    spec = LatentSpec(m.n_heads, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim, m.kv_lora_rank,
                      interleaved=True, base=m.rope_theta, eps=m.q_norm.eps)
    return Plan(w, spec, "mla")


def mla_flag(m) -> Plan:
    """An MLA whose forward takes absorb=True: both forms are compared."""
    plan = mla_absorb(m)
    plan.call = "mla_absorb_flag"
    return plan


def mla_absorb(m) -> Plan:
    w = {"q": lin(m.wq), "kv_a": lin(m.wkv_a), "kv_norm": m.kv_norm.weight, "kv_b": lin(m.wkv_b), "o": lin(m.wo)}
    spec = LatentSpec(m.n_heads, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim, m.kv_lora_rank,
                      interleaved=False, base=m.rope_theta, eps=m.kv_norm.eps)
    return Plan(w, spec, "mla")


def phi3(m) -> Plan:
    """qkv_proj rows: [H*D queries | Hkv*D keys | Hkv*D values]."""
    q_end = m.num_heads * m.head_dim
    k_end = q_end + m.num_key_value_heads * m.head_dim
    w = {"q": rows(m.qkv_proj, 0, q_end), "k": rows(m.qkv_proj, q_end, k_end),
         "v": rows(m.qkv_proj, k_end, None), "o": lin(m.o_proj)}
    spec = Spec(m.num_heads, m.num_key_value_heads, causal=True, rotary=Rotary(m.head_dim, m.rope_theta))
    return Plan(w, spec, "x")


def internlm2(m) -> Plan:
    """wqkv rows grouped per kv head: (Hkv, n_rep + 2, D) = [n_rep queries | key | value]."""
    groups, rep, dim = m.num_key_value_heads, m.num_key_value_groups, m.head_dim
    weight, bias = lin(m.wqkv)
    shaped = weight.view(groups, rep + 2, dim, -1)
    bias_shaped = None if bias is None else bias.view(groups, rep + 2, dim)
    def part(sl):
        b = None if bias_shaped is None else bias_shaped[:, sl].reshape(-1)
        return shaped[:, sl].reshape(-1, weight.shape[1]), b
    w = {"q": part(slice(0, rep)), "k": part(slice(rep, rep + 1)), "v": part(slice(rep + 1, rep + 2)),
         "o": lin(m.wo)}
    spec = Spec(m.num_heads, groups, causal=True, rotary=Rotary(dim, m.rope_theta))
    return Plan(w, spec, "x")


def qwen3(m) -> Plan:
    norm = QKNorm(m.q_norm.scale, m.k_norm.scale, m.q_norm.eps) if m.q_norm else None
    spec = Spec(m.num_heads, m.num_kv_groups, causal=True, rotary=Rotary(m.head_dim, table_base(m.sin, m.cos)),
                qk_norm=norm)
    return Plan(four(m, "W_query", "W_key", "W_value", "out_proj"), spec, "x")


def minimind(m) -> Plan:
    spec = Spec(m.n_local_heads, m.n_local_kv_heads, causal=True,
                rotary=Rotary(m.head_dim, table_base(m.freqs_sin, m.freqs_cos)),
                qk_norm=QKNorm(m.q_norm.weight, m.k_norm.weight, m.q_norm.eps))
    return Plan(four(m, "q_proj", "k_proj", "v_proj", "o_proj"), spec, "x_keep_bl_cached")


def nanochat(m) -> Plan:
    eps = torch.finfo(torch.float64).eps  # F.rms_norm's default eps for float64 inputs
    spec = Spec(m.n_head, m.n_kv_head, causal=True, rotary=Rotary(m.head_dim, 10000.0, sign=-1.0),
                qk_norm=QKNorm(None, None, eps, after_rope=True))
    return Plan(four(m, "c_q", "c_k", "c_v", "c_proj"), spec, "x")


def speedrun(m) -> Plan:
    hdim = m.num_heads * m.head_dim
    packed = m.qkvo_w
    w = {"q": (packed[0], None), "k": (packed[1], None), "v": (packed[2], None), "o": (packed[3], None)}
    assert packed.shape[1] == hdim
    spec = Spec(m.num_heads, causal=True, rotary=Rotary(m.head_dim), qk_norm=QKNorm(None, None, 1e-6))
    return Plan(w, spec, "x")


def window(m) -> Plan:
    spec = Spec(m.num_heads, causal=True, window=m.sliding_window)
    return Plan(four(m, "q_proj", "k_proj", "v_proj", "o_proj"), spec, "x")


def neox(m) -> Plan:
    """query_key_value rows per head: (H, 3, D) = [q | k | v]."""
    heads, dim = m.num_attention_heads, m.head_size
    weight, bias = lin(m.query_key_value)
    shaped, bias_shaped = weight.view(heads, 3, dim, -1), bias.view(heads, 3, dim)
    def part(i):
        return shaped[:, i].reshape(heads * dim, -1), bias_shaped[:, i].reshape(-1)
    w = {"q": part(0), "k": part(1), "v": part(2), "o": lin(m.dense)}
    spec = Spec(heads, causal=True, rotary=Rotary(m.rotary_ndims, m.rotary_emb_base))
    return Plan(w, spec, "x")


def gptj(m) -> Plan:
    spec = Spec(m.num_attention_heads, causal=True,
                rotary=Rotary(m.rotary_dim or m.head_dim, 10000.0, interleaved=True))
    return Plan(four(m, "q_proj", "k_proj", "v_proj", "out_proj"), spec, "x")


def llama_meta(m) -> Plan:
    base = float(m.freqs_cis[1, 0].angle())  # position 1, first frequency: 1 rad at any theta
    assert abs(base - 1.0) < 1e-12
    theta = float(m.freqs_cis[1, 1].angle()) ** (-m.head_dim / 2)  # second frequency = theta^(-2/D)
    spec = Spec(m.n_local_heads, m.n_local_kv_heads, causal=True, rotary=Rotary(m.head_dim, theta, interleaved=True))
    return Plan(four(m, "wq", "wk", "wv", "wo"), spec, "x")


def hf_eager(m) -> Plan:
    spec = Spec(m.config.num_attention_heads, m.config.num_key_value_heads, rotary=Rotary(m.head_dim, m.rope_theta))
    return Plan(four(m, "q_proj", "k_proj", "v_proj", "o_proj"), spec, "x_additive4d")


def fn_sdpa(_) -> Plan:
    return Plan({}, Spec(1), "fn_qkv_mask")


def fn_course(_) -> Plan:
    return Plan({}, Spec(1, causal=True), "fn_course")


def d2l(m) -> Plan:
    return Plan(four(m, "W_q", "W_k", "W_v", "W_o"), Spec(m.num_heads), "qkv_valid_lens")


def annotated(m) -> Plan:
    lq, lk, lv, lo = m.linears
    w = {"q": lin(lq), "k": lin(lk), "v": lin(lv), "o": lin(lo)}
    return Plan(w, Spec(m.h), "qkv_mask3")


def karpathy(m) -> Plan:
    heads = m.heads
    w = {role: (torch.cat([getattr(h, name).weight for h in heads]), None)
         for role, name in (("q", "query"), ("k", "key"), ("v", "value"))}
    w["o"] = lin(m.proj)
    return Plan(w, Spec(len(heads), causal=True), "x")


def zh_blog(m) -> Plan:
    return Plan(four(m, "q_proj", "k_proj", "v_proj", "o_proj"), Spec(m.head_num), "x_mask4_keep")


def sdpa_padding(m) -> Plan:
    embed = m.proj.weight.shape[0]
    w = {"q": rows(m.qkv, 0, embed), "k": rows(m.qkv, embed, 2 * embed), "v": rows(m.qkv, 2 * embed, None),
         "o": lin(m.proj)}
    return Plan(w, Spec(m.num_heads), "x_keep_bl")


def gemma2(m) -> Plan:
    spec = Spec(m.num_heads, m.num_key_value_heads, causal=True, rotary=Rotary(m.head_dim, m.rope_theta),
                softcap=m.attn_logit_softcapping, scale=m.scaling)
    return Plan(four(m, "q_proj", "k_proj", "v_proj", "o_proj"), spec, "x")


def gpt_oss(m) -> Plan:
    spec = Spec(m.num_attention_heads, m.num_key_value_heads, causal=True, rotary=Rotary(m.head_dim, m.rope_theta),
                sinks=m.sinks)
    return Plan(four(m, "q_proj", "k_proj", "v_proj", "o_proj"), spec, "x")


def gpt2_cache(m) -> Plan:
    embed = m.c_proj.weight.shape[0]
    w = {"q": rows(m.c_attn, 0, embed), "k": rows(m.c_attn, embed, 2 * embed),
         "v": rows(m.c_attn, 2 * embed, None), "o": lin(m.c_proj)}
    return Plan(w, Spec(m.n_head, causal=True), "x_cached_layer_past")


def typed(m) -> Plan:
    return Plan(four(m, "q_proj", "k_proj", "v_proj", "out_proj"), Spec(m.n_heads), "x_kpm")


def folded_heads(m) -> Plan:
    return Plan(four(m, "to_q", "to_k", "to_v", "to_out"), Spec(m.heads), "x_context_keep")


ADAPTERS = {name: fn for name, fn in globals().items()
            if callable(fn) and getattr(fn, "__module__", None) == __name__
            and name not in {"lin", "rows", "four", "table_base", "Plan", "dataclass"}}
