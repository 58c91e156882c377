"""Bad input raises AttentionError on every rank (never a hang), and a failed call changes nothing."""
from __future__ import annotations

import pytest
import torch

import multihead as mh
from multihead import parallel as par
from parallel_cases import WORLD_SIZES, group_results

# case -> a phrase every rank's message holds (None: the rank that failed has its own message and
# the others name it)
EXPECTED = {
    "shard lengths off the split": "shard lengths are",
    "one rank's q is 3-D": None,
    "ranks disagree on causal": "ranks disagree on causal",
    "ranks disagree on the mask": "ranks disagree on mask",
    "heads of another size on one rank": "ranks disagree on H",
    "a mask kind that cannot shard": "cannot shard by sequence",
    "key padding of the local shard": "global positions",
    "too short for the zig-zag split": "too few for layout='zigzag'",
    "contiguous shards called as zig-zag": "layout='zigzag'",  # P=2: lengths [4, 3], not [3, 4]; P=4: N=7 < 8
    "an unknown layout": 'layout must be "contiguous" or "zigzag"',
    "ranks disagree on layout": "ranks disagree on layout",
    "a 2-D mesh as the group": "must be 1-D",
    "contiguous shards gathered as zig-zag": "zigzag layout",
}
CASES = [f"error {fn}: {label}" for label in list(EXPECTED)[:-1] for fn in ("ring", "ulysses")] + [
    "error ulysses: heads not divisible", "error shard_heads: heads not divisible", "error shard_heads: 2-D mesh",
    "error shard_heads: sinks on one rank", "error unshard_sequence: dims differ",
    "error unshard_sequence: contiguous shards gathered as zig-zag", "error unshard_sequence: ranks disagree on layout"]


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("case", CASES)
def test_every_rank_raises_attention_error(world_size, case):
    outcomes = group_results(world_size)[case]
    assert [kind for kind, _ in outcomes] == ["AttentionError"] * world_size, outcomes
    phrase = EXPECTED.get(case.split(": ", 1)[1])
    if phrase is not None:
        assert all(phrase in message for _, message in outcomes), outcomes


@pytest.mark.parametrize("world_size", WORLD_SIZES)
@pytest.mark.parametrize("case, own", [("error ring: one rank's q is 3-D", "must have 4 dims"),
                                       ("error shard_heads: sinks on one rank", "sink logits")])
def test_the_failing_rank_says_why_and_the_others_name_it(world_size, case, own):
    outcomes = group_results(world_size)[case]
    assert own in outcomes[1][1]
    assert all("rank 1 of" in message for r, (_, message) in enumerate(outcomes) if r != 1)


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_failed_shard_heads_leaves_the_module_unchanged(world_size):
    assert [kind for kind, _ in group_results(world_size)["error shard_heads: module state unchanged"]] == \
        ["unchanged"] * world_size


@pytest.mark.parametrize("world_size", WORLD_SIZES)
def test_a_rank_outside_the_group_is_told_and_the_members_run(world_size):
    outcomes = group_results(world_size)["error ring: not a member of the group"]
    assert outcomes[0][0] == "no error"
    assert all(kind == "AttentionError" and "not a member" in msg for kind, msg in outcomes[1:])


def test_without_an_initialised_process_group_every_entry_point_says_so():
    q = torch.randn(1, 2, 4, 8)
    calls = [lambda: par.ring_attention(q, q, q, layout="zigzag"),
             lambda: par.ulysses_attention(q, q, q, layout="zigzag"), lambda: par.shard_sequence(q, layout="zigzag"),
             lambda: par.unshard_sequence(q, layout="zigzag"),
             lambda: par.shard_heads(mh.MultiHeadAttention(8, 2), mesh=None)]
    for call in calls:
        with pytest.raises(mh.AttentionError, match="not initialised"):
            call()


def test_shard_heads_takes_only_multihead_modules():
    with pytest.raises(mh.AttentionError, match="MultiHeadAttention"):
        par.shard_heads(torch.nn.MultiheadAttention(8, 2), mesh=None)


@pytest.mark.parametrize("call", [par.ring_attention, par.ulysses_attention, par.shard_sequence, par.unshard_sequence])
def test_the_layout_is_a_required_keyword_and_checked_before_anything_else(call):
    """No default that could follow from causal: leaving it out is a TypeError; a wrong value an AttentionError."""
    q = torch.randn(1, 2, 4, 8)
    tensors = (q,) if call in (par.shard_sequence, par.unshard_sequence) else (q, q, q)
    with pytest.raises(TypeError, match="layout"):
        call(*tensors)
    if call is par.shard_sequence:  # no communication: checked without a process group
        with pytest.raises(mh.AttentionError, match='layout must be "contiguous" or "zigzag"'):
            call(q, layout="causal")
