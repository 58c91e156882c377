"""ring_attention and ulysses_attention equal one process (mh.attention on the gathered tensors).

Outputs and the gradients of q, k, v, on 2 and 4 gloo processes, for causal and not, masks, GQA,
MQA, cross-attention, uneven shards and small ring tiles, in both layouts (contiguous and zig-zag,
causal or not); see parallel_cases.CASES.
"""
from __future__ import annotations

import pytest
import torch

from multihead.parallel import layout
from multihead.parallel.launch import run_local
from parallel_cases import CASES, WORLD_SIZES, group_results, sequence_cases

TOLERANCE = {"torch.float32": 1e-5, "torch.float64": 1e-12}
RUNS = [(f"{name}: {case.name}", case) for case in CASES for name in case.only]


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("label, case", RUNS, ids=[f"{label} [{case.shards}]" for label, case in RUNS])
def test_equal_to_one_process_forward_and_backward(world_size, label, case):
    per_rank = group_results(world_size)[label]
    for rank, result in enumerate(per_rank):
        tol = TOLERANCE[result["dtype"]]
        for what in ("out", "dq", "dk", "dv", "gathered out"):
            assert result[what] <= tol, f"rank {rank}: {what} differs by {result[what]:.2e}"
        assert result["shape"][2] == layout.shard_lengths(case.Nq, world_size, case.shards)[rank]


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_rows_that_keep_no_key_are_exact_zeros_with_zero_gradient(world_size):
    results = group_results(world_size)
    checked = [r for label, per_rank in results.items() if not label.startswith(("error", "traffic", "heads"))
               for r in per_rank if "masked row largest" in r]
    assert checked and all(r["masked row largest"] == 0.0 for r in checked)


def test_one_process_group_runs_the_same_code_with_nothing_to_exchange():
    (results,) = run_local(sequence_cases, 1, timeout_s=60)
    for label, result in results.items():
        assert max(result[w] for w in ("out", "dq", "dk", "dv")) <= TOLERANCE[result["dtype"]], label


def test_ulysses_reorders_the_zigzag_split_into_position_order():
    """The permutation Ulysses applies after its all-to-all is the inverse of the zig-zag gather order."""
    N, P = 22, 3
    gathered = layout.gathered_positions(N, P, "zigzag")
    assert torch.equal(gathered[torch.argsort(gathered)], torch.arange(N))


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_both_layouts_are_exact_for_causal_calls(world_size):
    """Contiguous shards of a causal call (the natural cut) are as exact as the zig-zag ones."""
    results = group_results(world_size)
    for fn in ("ring", "ulysses"):
        for label in ("causal gqa", "causal gqa, contiguous"):
            assert max(r[w] for r in results[f"{fn}: {label}"] for w in ("out", "dq", "dk", "dv")) <= 1e-5
