"""The local process groups the parallel tests run in: results come back, and a hang ends as an error."""
from __future__ import annotations

import time

import pytest
import torch.distributed as dist

from multihead.parallel.launch import GroupFailed, free_port, run_local


def rank_and_size(offset: int):
    return dist.get_rank() + offset, dist.get_world_size()


def rank_one_raises():
    if dist.get_rank() == 1:
        raise ValueError("rank one's own error")
    return "fine"


def rank_one_waits_alone():
    if dist.get_rank() == 1:
        dist.barrier()  # rank 0 stays up but never joins: the collective's timeout ends it
    else:
        time.sleep(4)
    return "fine"


def rank_one_sleeps():
    if dist.get_rank() == 1:
        time.sleep(120)
    return "fine"


def test_each_rank_returns_its_result_in_rank_order():
    assert run_local(rank_and_size, 3, 10, timeout_s=60) == [(10, 3), (11, 3), (12, 3)]


def test_a_rank_that_raises_fails_the_group_with_its_traceback():
    with pytest.raises(GroupFailed, match="rank 1 raised:(.|\n)*rank one's own error"):
        run_local(rank_one_raises, 2, timeout_s=60)


def test_a_collective_nobody_joins_ends_at_the_group_timeout():
    start = time.monotonic()
    with pytest.raises(GroupFailed, match="rank 1 raised(.|\n)*(Timed out|timeout|Timeout)"):
        run_local(rank_one_waits_alone, 2, timeout_s=60, collective_timeout_s=1)
    assert time.monotonic() - start < 30


def test_a_rank_past_the_deadline_is_killed():
    start = time.monotonic()
    with pytest.raises(GroupFailed, match=r"ranks \[1\] reported nothing"):
        run_local(rank_one_sleeps, 2, timeout_s=3)
    assert time.monotonic() - start < 30


def test_free_port_is_a_port_number():
    assert 0 < free_port() < 65536
