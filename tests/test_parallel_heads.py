"""shard_heads equals the unsharded module: output, the input's gradient and every parameter's gradient,
with GQA, causal and padding masks, qk_norm, ALiBi, RoPE and a sliding window."""
from __future__ import annotations

import pytest

from parallel_cases import WORLD_SIZES, group_results

LABELS = ("heads mha causal padding", "heads gqa qk_norm alibi", "heads rope window", "heads gqa bias off")


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("label", LABELS)
def test_sharded_module_equals_the_whole_module(world_size, label):
    for rank, result in enumerate(group_results(world_size)[label]):
        diffs = {k: v for k, v in result.items() if k in ("out", "dx") or k.startswith("grad ")}
        assert len(diffs) >= 6
        assert all(v <= 1e-5 for v in diffs.values()), (rank, diffs)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("label", LABELS)
def test_each_rank_holds_its_own_whole_kv_groups(world_size, label):
    for rank, result in enumerate(group_results(world_size)[label]):
        H, Hkv = result["global heads"]
        assert tuple(result["local heads"]) == (H // world_size, Hkv // world_size)
        h = H // world_size
        assert result["heads held"] == list(range(rank * h, (rank + 1) * h))
        groups = {head // (H // Hkv) for head in result["heads held"]}  # the kv heads these query heads use
        assert groups == set(range(rank * Hkv // world_size, (rank + 1) * Hkv // world_size))
