"""The interval formula's two bounds, at_least and at_most: the same answer on ints, tensors and a mix of both,
and None for no bound."""
from __future__ import annotations

import pytest
import torch

from multihead.masks.intervals import at_least, at_most


@pytest.mark.parametrize("bound, pick", [(at_least, max), (at_most, min)], ids=["at_least", "at_most"])
def test_each_bound_agrees_on_ints_tensors_and_mixes(bound, pick):
    xs, limits = [-3, 0, 4, 9], [-1, 2, 7]
    for x in xs:
        for limit in limits:
            want = pick(x, limit)
            assert bound(x, limit) == want and type(bound(x, limit)) is int
            for got in (bound(torch.tensor(x), limit), bound(x, torch.tensor(limit)),
                        bound(torch.tensor(x), torch.tensor(limit))):
                assert isinstance(got, torch.Tensor) and got.item() == want
    rows = torch.tensor(xs)  # (4,): one bound per row, as the decode step's intervals hold them
    assert bound(rows, 2).tolist() == [pick(x, 2) for x in xs] == bound(2, rows).tolist()


@pytest.mark.parametrize("bound", [at_least, at_most])
def test_none_is_no_bound(bound):
    t = torch.tensor([1, 5])
    assert bound(None, 3) == 3 and bound(3, None) == 3 and bound(None, None) is None
    assert bound(t, None) is t and bound(None, t) is t
