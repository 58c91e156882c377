"""The bytes counted in the collectives equal the model in multihead.parallel.cost, byte for byte."""
from __future__ import annotations

import pytest

from multihead.parallel import cost
from parallel_cases import WORLD_SIZES, group_results

LABELS = [f"traffic {fn}: {case}" for fn in ("ring", "ulysses") for case in ("even causal mha", "uneven gqa", "mqa")]


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("label", LABELS + ["traffic heads"])
def test_counted_bytes_match_the_model(world_size, label):
    for rank, result in enumerate(group_results(world_size)[label]):
        for direction in ("forward", "forward+backward"):
            counted, modelled = result[direction]
            assert counted == modelled > 0, (rank, direction, counted, modelled)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_the_shape_agreement_is_one_small_gather_per_call(world_size):
    checks = {r["checks"] for label in LABELS for r in group_results(world_size)[label]}
    assert checks == {(world_size - 1) * 13 * 8}  # (P-1) x one row of 13 int64


@pytest.mark.parametrize("P", [2, 4, 8])
def test_ring_forward_moves_p_minus_1_over_p_of_all_keys_and_values(P):
    B, N, Hkv, D = 2, 64, 4, 16
    for rank in range(P):
        assert cost.ring_bytes(B=B, Hkv=Hkv, D=D, Dv=D, N=N, P=P, rank=rank, layout="zigzag", item=4) == \
            (P - 1) * B * (N // P) * 2 * Hkv * D * 4  # P-1 blocks of the local K and V


@pytest.mark.parametrize("P", [2, 4, 8])
def test_ulysses_forward_is_four_n_e_over_p_for_multi_head_attention(P):
    B, N, H, D = 2, 64, 8, 16
    E = H * D
    sent = cost.ulysses_bytes(B=B, H=H, Hkv=H, D=D, Dv=D, N=N, P=P, rank=0, layout="contiguous", item=4)
    assert sent == 4 * B * N * E // P * (P - 1) // P * 4  # 4 N E / P, less the share a rank keeps
