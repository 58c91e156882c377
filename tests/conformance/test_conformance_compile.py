"""torch.compile(dynamic=True): every mask kind, compiled, against the float64 reference at two sizes.

The kinds are compiled in four groups (each group's parts combined with `&`, so one graph covers
several kinds) with fullgraph=True, in grad mode (values and gradients) and, for bf16, under
inference_mode. The second size reuses the compiled function (dynamic shapes).
"""
from __future__ import annotations

import pytest
import torch

import multihead as mh
from tests.conformance.cases import Case
from tests.conformance.check import Expected, run_backend
from tests.conformance.reference import PartSpec

B, H, HKV, D = 2, 4, 2, 8
MAX_L = 32
TABLE = torch.randn(H, 2 * MAX_L - 1, generator=torch.Generator().manual_seed(0))


def near(b, h, q_idx, kv_idx):
    return (q_idx - kv_idx).abs() <= 4


def relative(score, b, h, q_idx, kv_idx):
    return score + TABLE[h, q_idx - kv_idx + MAX_L - 1]


def group_specs(group: str, Lq: int, Lk: int) -> list[PartSpec]:
    g = torch.Generator().manual_seed(Lq * 100 + Lk)
    if group == "keep_block_additive_causal":
        return [PartSpec("keep", {"t": torch.rand(B, 1, Lq, Lk, generator=g) < 0.8}),
                PartSpec("block", {"t": torch.rand(Lq, Lk, generator=g) < 0.2}),
                PartSpec("additive", {"t": torch.randn(1, H, Lq, Lk, generator=g)}),
                PartSpec("causal", {"align": "top_left"})]
    if group == "lengths_bottom_right_alibi":
        return [PartSpec("lengths", {"valid": torch.tensor([Lk - 3, Lk]), "query": torch.tensor([Lq, Lq - 2])}),
                PartSpec("causal", {"align": "bottom_right"}),
                PartSpec("alibi", {"slopes": mh.alibi_slopes(H), "align": "bottom_right"})]
    if group == "key_padding_window_segments":
        ids = torch.sort(torch.randint(0, 2, (B, Lq), generator=g), dim=-1).values
        key_ids = ids if Lq == Lk else torch.sort(torch.randint(0, 2, (B, Lk), generator=g), dim=-1).values
        return [PartSpec("key_padding", {"pad": torch.rand(B, Lk, generator=g) < 0.2}),
                PartSpec("window", {"size": 5, "align": "top_left"}),
                PartSpec("segments", {"ids": ids, "key_ids": key_ids})]
    if group == "mask_mod_score_mod_per_query_lengths":
        return [PartSpec("mask_mod", {"fn": near}), PartSpec("score_mod", {"fn": relative}),
                PartSpec("lengths", {"valid": torch.randint(1, Lk + 1, (B, Lq), generator=g)})]
    raise KeyError(group)


GROUPS = ["keep_block_additive_causal", "lengths_bottom_right_alibi", "key_padding_window_segments",
          "mask_mod_score_mod_per_query_lengths"]
SIZES = [(9, 13), (17, 17)]


@pytest.fixture(autouse=True)
def fresh_dynamo():
    """Each test compiles from scratch: the tests share `attend`, whose cache would otherwise fill up."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def attend(q, k, v, mask, *, softcap, sinks, backend):
    return mh.attention(q, k, v, mask, softcap=softcap, sinks=sinks, backend=backend)


@pytest.mark.parametrize("group", GROUPS)
def test_compiled_dynamic_matches_the_reference_with_gradients(group):
    compiled = torch.compile(attend, dynamic=True, fullgraph=True)
    for Lq, Lk in SIZES:
        case = Case(B=B, H=H, Hkv=HKV, Lq=Lq, Lk=Lk, D=D, dtype=torch.float32, specs=group_specs(group, Lq, Lk),
                    seed=Lq)
        outcome = run_backend(case, "auto", "grad", Expected(case, "grad"), call=compiled)
        assert outcome.status == "ok", f"{case}: {outcome.message}"


@pytest.mark.parametrize("group", GROUPS[:2])
def test_compiled_dynamic_in_bf16_under_inference_mode(group):
    compiled = torch.compile(attend, dynamic=True, fullgraph=True)
    Lq, Lk = SIZES[1]
    case = Case(B=B, H=H, Hkv=HKV, Lq=Lq, Lk=Lk, D=D, dtype=torch.bfloat16, specs=group_specs(group, Lq, Lk),
                seed=Lq, softcap=None)
    outcome = run_backend(case, "auto", "inference_mode", Expected(case, "inference_mode"), call=compiled)
    assert outcome.status == "ok", f"{case}: {outcome.message}"


@pytest.mark.slow
def test_compiled_dynamic_at_lengths_where_banded_engages():
    """Two lengths >= 2048 keys through one compiled function (banded runs both), under no_grad: with
    gradients the compiled banded graph (one SDPA per block, forward and backward) takes minutes on CPU."""
    compiled = torch.compile(attend, dynamic=True)
    for L in (2048, 2100):
        specs = [PartSpec("window", {"size": 512, "align": "top_left"}), PartSpec("causal", {"align": "top_left"})]
        case = Case(B=1, H=2, Hkv=1, Lq=L, Lk=L, D=16, dtype=torch.float32, specs=specs, seed=L)
        outcome = run_backend(case, "auto", "no_grad", Expected(case, "no_grad"), call=compiled)
        assert outcome.status == "ok", f"{case}: {outcome.message}"
