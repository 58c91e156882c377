"""check on multi-head latent attention (MLA): a learner's module with an absorbed path is judged by its naive
forward against MLA on its own weights (forward and gradients), then by its absorbed path against its naive
forward; W_UK transposed in the absorption is named with its evidence, and only there."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from hypothesis import given, settings
from hypothesis import strategies as st

import multihead as mh
from helpers import edited_zoo_file
from multihead.checker import check
from multihead.checker.targets.latent import find_absorbed
from multihead.checker.roles.latent import WUK_TRANSPOSED, find_latent_roles, latent_variant
from multihead.checker.roles.projections import find_projections
from multihead.checker.behaviour.rotary import Rotary

ZOO = Path(__file__).parent / "check_zoo"
CORRECT = str(ZOO / "ok_mla_absorbed.py:LatentAttention")
FUSED = str(ZOO / "mla_wuk_transposed.py:CompressedKVAttention")
LOW_RANK_Q = str(ZOO / "ok_mla_low_rank_queries.py:LowRankQueryMLA")
TRANSPOSE = ('"bhtd,hdc->bhtc", q_nope, w_uk', '"bhtd,hcd->bhtc", q_nope, w_uk')  # the mistake, in the einsum


def _load(name: str, cls: str):
    namespace: dict = {}
    exec(compile((ZOO / name).read_text(), name, "exec"), namespace)
    return namespace[cls]


def test_find_absorbed_knows_a_forward_flag_and_a_method_and_plain_modules_have_none():
    flag = find_absorbed(_load("ok_mla_absorbed.py", "LatentAttention")(16, 4))
    method = find_absorbed(_load("mla_wuk_transposed.py", "CompressedKVAttention")(16, 4))
    assert (flag.flag, flag.name) == ("absorb", "forward(x, absorb=True)")
    assert (method.method, method.name) == ("forward_absorbed", "forward_absorbed(x)")
    assert find_absorbed(_load("ok_rope_kv_cache.py", "CachedRoPEAttention")(16, 4)) is None
    assert find_absorbed(torch.nn.Linear(2, 2)) is None


@pytest.mark.parametrize("target, roles", [
    (CORRECT, {"q": "W_Q", "latent": "W_DKV", "rope-key": "W_KR", "k": "W_UK", "v": "W_UV", "o": "W_O"}),
    (FUSED, {"q": "q_proj", "latent": "kv_a_proj_with_mqa rows 0:6, then kv_a_layernorm", "rope-key": "kv_a_proj_with_mqa rows 6:10",
             "k": "kv_b_proj rows viewed as (H=4, Dn + Dv, C)[:, :6]",
             "v": "kv_b_proj rows viewed as (H=4, Dn + Dv, C)[:, 6:]", "o": "o_proj"}),
    (LOW_RANK_Q, {"q": "wq_a, then q_norm, then wq_b", "latent": "wkv_a rows 0:8, then kv_norm",
                  "rope-key": "wkv_a rows 8:12", "k": "wkv_b rows viewed as (H=4, Dn + Dv, C)[:, :8]",
                  "v": "wkv_b rows viewed as (H=4, Dn + Dv, C)[:, 8:]", "o": "wo"}),
])
def test_mla_roles_are_found_by_behaviour_separate_or_fused(target, roles):
    report = check(target)
    assert report.roles == roles, str(report)
    assert any(line.startswith("multi-head latent attention: 4 heads") for line in report.convention_lines())


@settings(max_examples=12, deadline=None)
@given(heads=st.integers(1, 3), latent=st.integers(2, 6), nope=st.integers(1, 6), square=st.booleans(),
       half_rope=st.integers(1, 3), length=st.integers(1, 6))
def test_plain_mla_is_the_learners_mla_and_absorbed_equals_naive(heads, latent, nope, square, half_rope, length):
    """latent_variant on the roles found in the zoo's MLA gives its naive and absorbed outputs; the two are
    equal, and the W_UK-transposed variant (where it runs: Dn == C) is the absorbed form on each head's W_UKᵀ."""
    nope = latent if square else nope
    module = _load("ok_mla_absorbed.py", "LatentAttention")(12, heads, latent, nope, 2 * half_rope).double()
    x = torch.randn(2, length, 12, dtype=torch.float64, generator=torch.Generator().manual_seed(length))
    found = find_latent_roles(module, find_projections(module), module, x, heads)
    assert found
    roles, rope = found[0], Rotary(10000.0, True, True, float32=False)
    with torch.no_grad():
        naive = latent_variant(roles, x, rope, causal=True)
        torch.testing.assert_close(naive, module(x), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(latent_variant(roles, x, rope, True, absorbed=True), naive, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(module(x, absorb=True), naive, rtol=1e-12, atol=1e-12)
        if nope == latent:
            wrong = latent_variant(roles, x, rope, True, absorbed=True, mistake=WUK_TRANSPOSED)
            weight = module.W_UK.weight
            weight.copy_(weight.clone().view(heads, nope, latent).transpose(1, 2).reshape(heads * nope, latent))
            torch.testing.assert_close(wrong, latent_variant(roles, x, rope, True, absorbed=True), rtol=1e-12,
                                       atol=1e-12)


@pytest.mark.parametrize("sizes, runs", [
    ({"kv_rank": 8, "nope_dim": 8}, True),
    ({"kv_rank": 4, "nope_dim": 4, "rope_dim": 2}, True),
    ({"kv_rank": 6, "nope_dim": 8}, False),  # Dn != C: the transposed einsum raises
])
def test_wuk_transposed_is_named_only_where_the_dims_let_it_run(tmp_path, sizes, runs):
    init = {"d_model": 16, "n_heads": 4, **sizes}
    assert check(CORRECT, init=init).passed
    report = check(f"{edited_zoo_file(tmp_path, 'ok_mla_absorbed.py', TRANSPOSE)}:LatentAttention", init=init)
    assert report.verdict == "fail" and report.exit_code == 1, str(report)
    if runs:
        assert report.bug == WUK_TRANSPOSED and report.topic == "mla", str(report)
        assert "q_nope @ W_UK_h" in report.explanation()
        evidence = next(note for note in report.notes if note.startswith("evidence: "))
        assert "transposed back" in evidence and float(evidence.rsplit("max error ", 1)[1][:-1]) < 1e-9
    else:
        assert report.bug is None and report.exception.startswith("RuntimeError: einsum()"), str(report)
        assert 'torch.einsum("bhtd,hcd->bhtc"' in report.where
        assert any("absorbed path forward(x, absorb=True) raises" in note for note in report.notes)


def test_the_report_speaks_chinese():
    report = check(FUSED, lang="zh")
    assert report.bug == WUK_TRANSPOSED
    assert "把 W_UK 吸收进查询时用成了它的转置" in report.headline()
    assert "q_nope @ W_UK_h" in report.explanation() and "。" in report.explanation()
    assert any(note.startswith("依据：") for note in report.notes)
    assert any(line.startswith("多头潜在注意力：") for line in report.convention_lines())


@pytest.mark.parametrize("edit, reason", [
    (("k_rope.expand(B, H, T, R)", "-k_rope.expand(B, H, T, R)"), "its naive forward differs"),
    (("weights @ c[:, None], w_uv)", "weights @ c[:, None] * 2, w_uv)"), "gives other outputs"),
])
def test_differences_the_catalogue_does_not_know_fail_without_an_id(tmp_path, edit, reason):
    report = check(f"{edited_zoo_file(tmp_path, 'ok_mla_absorbed.py', edit)}:LatentAttention")
    assert report.verdict == "fail" and report.bug is None and reason in report.headline(), str(report)


def test_a_norm_on_the_latent_is_the_modules_own_layer(tmp_path):
    norm = (("c = self.W_DKV(x)", "c = self.norm(self.W_DKV(x))"),
            ("        self.W_O =", "        self.norm = nn.LayerNorm(kv_rank)\n        self.W_O ="))
    report = check(f"{edited_zoo_file(tmp_path, 'ok_mla_absorbed.py', *norm)}:LatentAttention")
    assert report.passed and report.roles["latent"] == "W_DKV, then norm", str(report)
    forgotten = ("weights @ c[:, None], w_uv)", "weights @ self.W_DKV(x)[:, None], w_uv)")  # values not normed
    learner = edited_zoo_file(tmp_path, "ok_mla_absorbed.py", *norm, forgotten, name="norm_forgotten.py")
    assert check(f"{learner}:LatentAttention").verdict == "fail"


def test_naive_outputs_right_with_gradients_cut_fail(tmp_path):
    learner = edited_zoo_file(tmp_path, "ok_mla_absorbed.py", ("c = self.W_DKV(x)", "c = self.W_DKV(x).detach()"))
    report = check(f"{learner}:LatentAttention")
    assert report.verdict == "fail" and report.error < 1e-9 and report.grad_error > 1e-3
    assert "gradients differ" in report.headline()


def test_a_plain_module_with_an_absorb_flag_is_checked_as_plain_attention(tmp_path):
    learner = edited_zoo_file(tmp_path, "ok_rope_kv_cache.py", ("use_cache=False)", "use_cache=False, absorb=False)"))
    report = check(f"{learner}:CachedRoPEAttention")
    assert report.passed and report.kind == "attention" and "latent" not in report.roles, str(report)


# --- low-rank queries (DeepSeek-V3: q_a_proj, q_a_layernorm, q_b_proj) --------------------------------------

def test_low_rank_queries_pass_and_the_report_names_the_query_latent():
    report = check(LOW_RANK_Q)
    assert report.passed and report.kind == "latent", str(report)
    assert "low-rank queries: x is first pressed into a query latent of 12 features" in "\n".join(
        report.convention_lines())
    zh = check(LOW_RANK_Q, lang="zh")
    assert zh.passed and "低秩查询：x 先被压缩成 12 维的查询潜向量" in "\n".join(zh.convention_lines())
    assert "检测到的约定：" in str(zh) and "各线性层的角色：" in str(zh)  # full-width colons in Chinese


@settings(max_examples=8, deadline=None)
@given(heads=st.integers(1, 3), q_rank=st.integers(2, 7), latent=st.integers(2, 6), half_rope=st.integers(1, 2),
       length=st.integers(1, 5))
def test_plain_mla_with_low_rank_queries_is_the_learners_naive_and_absorbed_forward(heads, q_rank, latent,
                                                                                     half_rope, length):
    """One assignment only (the query chain is fixed by what reads what); latent_variant on it, with the
    module's own norms, gives the module's naive and absorbed outputs."""
    module = _load("ok_mla_low_rank_queries.py", "LowRankQueryMLA")(10, heads, q_rank, latent, 3, 2 * half_rope,
                                                                    5).double()
    with torch.no_grad():
        for norm in (module.q_norm, module.kv_norm):
            norm.weight.uniform_(0.5, 1.5)
    x = torch.randn(2, length, 10, dtype=torch.float64, generator=torch.Generator().manual_seed(length))
    found = find_latent_roles(module, find_projections(module), module, x, heads)
    assert len(found) == 1 and found[0].q_down.name == "wq_a" and found[0].q_norm[0] == "q_norm"
    rope = Rotary(10000.0, True, True, float32=False)
    with torch.no_grad():
        naive = latent_variant(found[0], x, rope, causal=True)
        torch.testing.assert_close(naive, module(x), rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(module(x, absorbed=True), naive, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(latent_variant(found[0], x, rope, True, absorbed=True), naive, rtol=1e-12,
                                   atol=1e-12)


def test_query_latent_norm_skipped_in_the_absorbed_path_fails_without_an_id(tmp_path):
    skipped = ("        if absorbed:\n", "        if absorbed:\n            q_nope = self.wq_b(self.wq_a(x)).view("
               "bsz, seqlen, self.n_heads, -1)[..., :self.qk_nope_head_dim]  # q_norm forgotten\n")
    report = check(f"{edited_zoo_file(tmp_path, 'ok_mla_low_rank_queries.py', skipped)}:LowRankQueryMLA")
    assert report.verdict == "fail" and report.bug is None, str(report)
    assert "absorbed path forward(x, absorbed=True) gives other outputs" in report.headline()


def test_low_rank_queries_without_a_norm_are_found_too(tmp_path):
    learner = edited_zoo_file(tmp_path, "ok_mla_low_rank_queries.py",
                              ("self.wq_b(self.q_norm(self.wq_a(x)))", "self.wq_b(self.wq_a(x))"))
    report = check(f"{learner}:LowRankQueryMLA")
    assert report.passed and report.roles["q"] == "wq_a, then wq_b", str(report)


_SPLIT_QUERY = "q = self.W_Q(x).view(B, T, H, Dn + R).transpose(1, 2)  # (B, H, T, Dn + R)\n" \
    "        q_nope, q_rope = q.split([Dn, R], dim=-1)"
_PAPER_QUERIES = {  # the rotary queries from a Linear of their own (W_QR), as the DeepSeek-V2 paper writes MLA
    "low-rank": (("self.W_Q = nn.Linear(d_model, n_heads * (nope_dim + rope_dim), bias=False)",
                  "self.W_DQ = nn.Linear(d_model, 6, bias=False)\n        self.q_norm = nn.LayerNorm(6)\n"
                  "        self.W_UQ = nn.Linear(6, n_heads * nope_dim, bias=False)\n"
                  "        self.W_QR = nn.Linear(6, n_heads * rope_dim, bias=False)"),
                 (_SPLIT_QUERY, "c_q = self.q_norm(self.W_DQ(x))\n"
                  "        q_nope = self.W_UQ(c_q).view(B, T, H, Dn).transpose(1, 2)\n"
                  "        q_rope = self.W_QR(c_q).view(B, T, H, R).transpose(1, 2)")),
    "full-rank": (("self.W_Q = nn.Linear(d_model, n_heads * (nope_dim + rope_dim), bias=False)",
                   "self.W_Q = nn.Linear(d_model, n_heads * nope_dim, bias=False)\n"
                   "        self.W_QR = nn.Linear(d_model, n_heads * rope_dim, bias=False)"),
                  (_SPLIT_QUERY, "q_nope = self.W_Q(x).view(B, T, H, Dn).transpose(1, 2)\n"
                   "        q_rope = self.W_QR(x).view(B, T, H, R).transpose(1, 2)")),
}


@pytest.mark.parametrize("queries, chain", [("low-rank", "W_DQ, then q_norm, then "), ("full-rank", "")])
@pytest.mark.parametrize("sizes", [{}, {"d_model": 16, "n_heads": 4, "kv_rank": 4, "nope_dim": 4, "rope_dim": 4}])
def test_rotary_queries_from_their_own_linear_pass_and_wuk_transposed_is_named(tmp_path, queries, chain, sizes):
    """W_QR apart from W_UQ (or W_Q), in either order when their widths agree (Dn == R)."""
    options = {"init": sizes} if sizes else {}
    learner = edited_zoo_file(tmp_path, "ok_mla_absorbed.py", *_PAPER_QUERIES[queries])
    report = check(f"{learner}:LatentAttention", **options)
    assert report.passed, str(report)
    assert (report.roles["q"], report.roles["rope-query"]) == (chain + ("W_UQ" if chain else "W_Q"), chain + "W_QR")
    zh_chain = chain.replace(", then ", "，再经过 ")  # the Chinese report says the chain in Chinese
    assert f"旋转位置查询：{zh_chain}W_QR" in check(f"{learner}:LatentAttention", lang="zh", **options).role_lines()
    learner = edited_zoo_file(tmp_path, "ok_mla_absorbed.py", *_PAPER_QUERIES[queries], TRANSPOSE, name="wuk.py")
    assert check(f"{learner}:LatentAttention", **options).bug == WUK_TRANSPOSED


class _WrappedLatent(nn.Module):
    """A learner's layer around mh.MultiHeadLatentAttention, causal, with its absorb flag passed on."""

    def __init__(self, q_lora_rank):
        super().__init__()
        self.mla = mh.MultiHeadLatentAttention(16, 4, kv_lora_rank=8, qk_nope_head_dim=8, qk_rope_head_dim=4,
                                               v_head_dim=6, q_lora_rank=q_lora_rank, causal=True)

    def forward(self, x, absorb=False):
        return self.mla(x, absorb=absorb)


@pytest.mark.parametrize("q_lora_rank, query", [(None, "mla.q_proj"),
                                                (12, "mla.q_a_proj, then mla.q_a_layernorm, then mla.q_b_proj")])
def test_multiheads_own_mla_wrapped_by_a_learner_passes(q_lora_rank, query):
    report = check(_WrappedLatent(q_lora_rank))
    assert report.passed and report.kind == "latent" and report.roles["q"] == query, str(report)
    assert report.roles["latent"] == "mla.kv_a_proj_with_mqa rows 0:8, then mla.kv_a_layernorm"


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_projects_own_modules_pass_check(lang):
    """multihead's own modules take a Mask object; check passes it as Mask.keep and judges them like any other."""
    torch.manual_seed(0)
    mla = mh.MultiHeadLatentAttention(64, 4, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16)
    report = mh.check(mla, lang=lang)
    assert report.passed and report.kind == "latent", str(report)
    assert any("a multihead Mask" in line or "multihead 的 Mask 对象" in line for line in report.convention_lines())
    assert "Mask.keep" not in str(report)  # no internal API name in a learner's report
    for module in (mh.MultiHeadAttention(64, 4), mh.MultiHeadAttention(64, 8, num_kv_heads=2)):
        report = mh.check(module, lang=lang)
        assert report.passed, str(report)
