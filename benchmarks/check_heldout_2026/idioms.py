"""How each idiom of the 2026 held-out zoo keeps its weights: one reader per idiom that turns a built case
into a Plan (weights in F.linear orientation, the reference's Spec or LatentSpec, a call style).

Written from the cases' own code for the verification only; never given to `multihead check`. The helpers
(Plan, lin, rows, four) are the older held-out zoo's. Legend: H heads, Hkv kv heads, D head dim.
"""
from __future__ import annotations

from adapters import Plan, four, lin, rows
from reference import LatentSpec, QKNorm, Rotary, Spec, linear, rms_norm


def fused(layer, *sizes) -> list:
    """A fused projection's rows cut in consecutive blocks of the given sizes."""
    edges = [0]
    for size in sizes:
        edges.append(edges[-1] + size)
    return [rows(layer, start, stop) for start, stop in zip(edges, edges[1:])]


def qkv_rows(layer, q: int, kv: int) -> dict:
    """{'q','k','v'} from a fused layer laid out [queries (q rows) | keys (kv) | values (kv)]."""
    return dict(zip("qkv", fused(layer, q, kv, kv)))


def gemma3(m) -> Plan:
    """The manifest sets query_pre_attn_scalar = head_dim: the scale is the usual 1/sqrt(D), not read from the
    module (whose scaling may be the mistake)."""
    norm = QKNorm(1 + m.q_norm.weight, 1 + m.k_norm.weight, m.q_norm.eps)
    spec = Spec(m.num_heads, m.num_kv_heads, causal=True, rotary=Rotary(m.head_dim, m.rope_theta), qk_norm=norm)
    return Plan(four(m, "q_proj", "k_proj", "v_proj", "o_proj"), spec, "x")


def olmo2(m) -> Plan:
    norm = QKNorm(m.q_norm.weight, m.k_norm.weight, m.q_norm.eps, whole_width=True)
    spec = Spec(m.n_heads, m.n_kv_heads, causal=True, rotary=Rotary(m.head_dim, m.theta), qk_norm=norm)
    return Plan(four(m, "q_proj", "k_proj", "v_proj", "o_proj"), spec, "x")


def qwen3_next(m) -> Plan:
    """q_proj rows per head: [its D query rows | its D gate rows]."""
    heads, dim = m.num_heads, m.head_dim
    weight = m.q_proj.weight.view(heads, 2, dim, -1)
    w = four(m, "q_proj", "k_proj", "v_proj", "o_proj")
    w["q"] = (weight[:, 0].reshape(heads * dim, -1), None)
    w["gate"] = (weight[:, 1].reshape(heads * dim, -1), None)
    norm = QKNorm(1 + m.q_norm.weight, 1 + m.k_norm.weight, m.q_norm.eps)
    spec = Spec(heads, m.num_kv_heads, causal=True, rotary=Rotary(m.rotary_dim, m.rope_theta), qk_norm=norm)
    return Plan(w, spec, "x")


def diffusers_cross(m) -> Plan:
    return Plan({"q": lin(m.to_q), "k": lin(m.to_k), "v": lin(m.to_v), "o": lin(m.to_out[0])}, Spec(m.heads), "ctx")


def eva(m) -> Plan:
    """qkv weight (3E, E) with the bias cat(q_bias, zeros, v_bias)."""
    embed = m.proj.weight.shape[0]
    weight = m.qkv.weight
    w = {"q": (weight[:embed], m.q_bias), "k": (weight[embed:2 * embed], None), "v": (weight[2 * embed:], m.v_bias),
         "o": lin(m.proj)}
    return Plan(w, Spec(m.num_heads), "x")


def chatglm(m) -> Plan:
    dim, groups = m.head_dim, m.num_groups
    w = qkv_rows(m.query_key_value, m.num_heads * dim, groups * dim)
    w["o"] = lin(m.dense)
    spec = Spec(m.num_heads, groups, causal=True, rotary=Rotary(m.rot_dim, m.base, interleaved=True))
    return Plan(w, spec, "seq_first_blocked")


def torchtune(m) -> Plan:
    spec = Spec(m.num_heads, m.num_kv_heads, causal=True, rotary=Rotary(m.head_dim, 10000.0, interleaved=True))
    return Plan(four(m, "q_proj", "k_proj", "v_proj", "output_proj"), spec, "x_keep_bll")


def litgpt(m) -> Plan:
    w = qkv_rows(m.qkv, m.n_head * m.head_size, m.n_query_groups * m.head_size)
    w["o"] = lin(m.proj)
    spec = Spec(m.n_head, m.n_query_groups, causal=True, rotary=Rotary(m.rope_n_elem, 10000.0))
    return Plan(w, spec, "x")


def nope_gqa(m) -> Plan:
    """Separate q/k/v/o_proj, grouped kv heads, causal, no positions (Jamba-style)."""
    return Plan(four(m, "q_proj", "k_proj", "v_proj", "o_proj"),
                Spec(m.num_heads, m.num_key_value_heads, causal=True), "x")


def nanovlm_vit(m) -> Plan:
    embed = m.embd_dim
    w = qkv_rows(m.qkv_proj, embed, embed)
    w["o"] = lin(m.out_proj)
    return Plan(w, Spec(m.n_heads), "x")


def hf_mla(m) -> Plan:
    w = {"q_a": lin(m.q_a_proj), "q_norm": m.q_a_layernorm.weight, "q_b": lin(m.q_b_proj),
         "kv_a": lin(m.kv_a_proj_with_mqa), "kv_norm": m.kv_a_layernorm.weight, "kv_b": lin(m.kv_b_proj),
         "o": lin(m.o_proj)}
    spec = LatentSpec(m.num_heads, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim, m.kv_lora_rank,
                      interleaved=True, base=m.rope_theta, eps=m.q_a_layernorm.variance_epsilon)
    return Plan(w, spec, "mla")


def hunyuan(m) -> Plan:
    norm = QKNorm(m.query_layernorm.weight, m.key_layernorm.weight, m.query_layernorm.variance_epsilon,
                  after_rope=True)
    spec = Spec(m.num_heads, m.num_key_value_heads, causal=True, rotary=Rotary(m.head_dim, m.rope_theta),
                qk_norm=norm)
    return Plan(four(m, "q_proj", "k_proj", "v_proj", "o_proj"), spec, "x")


def ling(m) -> Plan:
    w = qkv_rows(m.query_key_value, m.num_heads * m.head_dim, m.num_kv_heads * m.head_dim)
    w["o"] = lin(m.dense)
    norm = QKNorm(m.query_layernorm.weight, m.key_layernorm.weight, m.query_layernorm.eps)
    spec = Spec(m.num_heads, m.num_kv_heads, causal=True, rotary=Rotary(m.rotary_dim, m.rope_theta), qk_norm=norm)
    return Plan(w, spec, "x")


def internvit(m) -> Plan:
    w = qkv_rows(m.qkv, m.embed_dim, m.embed_dim)
    w["o"] = lin(m.proj)
    norm = QKNorm(m.q_norm.weight, m.k_norm.weight, m.q_norm.variance_epsilon, whole_width=True)
    return Plan(w, Spec(m.num_heads, qk_norm=norm), "x")


def flux(m) -> Plan:
    embed = m.proj.weight.shape[0]
    w = qkv_rows(m.qkv, embed, embed)
    w["o"] = lin(m.proj)
    norm = QKNorm(m.norm.query_norm.scale, m.norm.key_norm.scale, 1e-6)
    spec = Spec(m.num_heads, rotary=Rotary(embed // m.num_heads, m.theta, interleaved=True), qk_norm=norm)
    return Plan(w, spec, "x")


def modernbert(m) -> Plan:
    w = qkv_rows(m.Wqkv, m.all_head_size, m.all_head_size)
    w["o"] = lin(m.Wo)
    local = None if m.local_attention == (-1, -1) else m.local_attention[0]
    spec = Spec(m.num_heads, local=local, rotary=Rotary(m.head_dim, m.rope_theta))
    return Plan(w, spec, "x_keep_bl")


def flex_window(m) -> Plan:
    return Plan(four(m, "wq", "wk", "wv", "wo"), Spec(m.n_heads, causal=True, window=m.window_size), "x")


def zh_gqa(m) -> Plan:
    return Plan(four(m, "q_proj", "k_proj", "v_proj", "o_proj"), Spec(m.nums_head, m.nums_key_value_head, causal=True),
                "x_keep_bl")


def zh_kvcache(m) -> Plan:
    spec = Spec(m.n_heads, m.n_kv_heads, causal=True, rotary=Rotary(m.head_dim, m.rope_base))
    return Plan(four(m, "wq", "wk", "wv", "wo"), spec, "x_keep_bl_cached")


def llama4(m) -> Plan:
    theta = float(m.freqs_cis[1, 1].angle()) ** (-m.head_dim / 2)  # second frequency = theta^(-2/D)
    norm = None if m.qk_norm is None else QKNorm(None, None, m.qk_norm.eps, after_rope=True)
    spec = Spec(m.n_heads, m.n_kv_heads, causal=True, rotary=Rotary(m.head_dim, theta, interleaved=True),
                qk_norm=norm)
    return Plan(four(m, "wq", "wk", "wv", "wo"), spec, "x")


def step_mfa(m) -> Plan:
    """Low-rank queries: wq(inter_norm(q_proj(x))); one key/value head."""
    down, norm, up = lin(m.q_proj), m.inter_norm, lin(m.wq)
    w = {"q": lambda x: linear(rms_norm(linear(x, down), norm.weight, norm.eps), up),
         "k": lin(m.k_proj), "v": lin(m.v_proj), "o": lin(m.o_proj)}
    return Plan(w, Spec(m.num_heads, 1, causal=True, rotary=Rotary(m.head_dim, m.rope_theta)), "x")


def cohere2(m) -> Plan:
    rotary = Rotary(m.head_dim, m.rope_theta, interleaved=True) if m.sliding_window is not None else None
    spec = Spec(m.num_heads, m.num_key_value_heads, causal=True, window=m.sliding_window, rotary=rotary)
    return Plan(four(m, "q_proj", "k_proj", "v_proj", "o_proj"), spec, "x")


def smollm3(m) -> Plan:
    rotary = Rotary(m.head_dim, m.rope_theta) if m.use_rope else None
    spec = Spec(m.num_heads, m.num_key_value_heads, causal=True, rotary=rotary)
    return Plan(four(m, "q_proj", "k_proj", "v_proj", "o_proj"), spec, "x")


def phi4_mini(m) -> Plan:
    w = qkv_rows(m.qkv_proj, m.num_heads * m.head_dim, m.num_key_value_heads * m.head_dim)
    w["o"] = lin(m.o_proj)
    spec = Spec(m.num_heads, m.num_key_value_heads, causal=True, rotary=Rotary(m.rotary_dim, m.rope_theta))
    return Plan(w, spec, "x")


READERS = {name: fn for name, fn in globals().items()
           if callable(fn) and getattr(fn, "__module__", None) == __name__ and name not in {"fused", "qkv_rows"}}
