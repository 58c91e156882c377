"""A new backend is one object registered with mh.register_backend; it declares what it takes as data (its
capabilities, checked by dispatch before its plan), reads the mask's normal form and the shared helpers
(backends/common.py), and nothing in masks/ changes for it. This file is the whole of one: a backend that takes
the masks whose normal form is one interval of keys per query row (the recipe of docs/extending.md)."""
from __future__ import annotations

import pytest
import torch

import multihead as mh
from multihead.backends.capabilities import Capabilities
from multihead.backends.common import masked_softmax, repeat_kv
from multihead.backends.dispatch import backend_names, remove_backend
from multihead.backends.reasons import cannot
from multihead.errors import CannotRunError

NOT_INTERVALS = cannot("rows.mask", "takes masks that keep one interval of keys per query row")
VARIANTS = cannot("rows.variants", "has no softcap, sinks or ALiBi")


class RowIntervals:
    """Attention over each query row's interval [lo, hi) of keys, read from the normal form."""

    name = "rows"
    capabilities = Capabilities(dropout=False)  # dispatch refuses a call with dropout before asking plan

    def plan(self, p, auto=True):
        if not p.form.intervals_only:
            return NOT_INTERVALS
        if p.softcap is not None or p.sinks is not None or p.form.slopes is not None:
            return VARIANTS
        return p.form.row_intervals(p.index())  # (lo, hi), (B, Lq) each

    def run(self, p, plan):
        lo, hi = plan
        j = torch.arange(p.k.shape[2])
        keep = ((j >= lo[..., None]) & (j < hi[..., None]))[:, None]  # (B, 1, Lq, Lk)
        scores = (p.q @ repeat_kv(p.k, p.q.shape[1]).transpose(-1, -2)).float() * p.scale  # (B, H, Lq, Lk)
        return masked_softmax(scores, keep).to(p.v.dtype) @ repeat_kv(p.v, p.q.shape[1])

    def describe(self, p, plan):
        return "each query row over its interval of keys"


@pytest.fixture
def rows_backend():
    mh.register_backend(RowIntervals(), before="decode")  # first in line for "auto"
    yield
    remove_backend("rows")


def _qkv():
    g = torch.Generator().manual_seed(0)
    return torch.randn(2, 4, 6, 8, generator=g), torch.randn(2, 2, 9, 8, generator=g), torch.randn(2, 2, 9, 8, generator=g)


def test_a_registered_backend_runs_the_masks_it_takes_and_equals_the_reference(rows_backend):
    q, k, v = _qkv()
    for mask in (mh.Mask.causal("bottom_right") & mh.Mask.window(3, "bottom_right"),
                 mh.Mask.lengths(torch.tensor([4, 9]), torch.tensor([6, 2])) & mh.Mask.chunks(4), None):
        decision = mh.dispatch(q, k, v, mask)
        assert decision.backend == "rows" and decision.codes["sdpa"] == "ranked-after"
        torch.testing.assert_close(mh.attention(q, k, v, mask), mh.attention(q, k, v, mask, backend="math"))


def test_a_registered_backend_refuses_with_its_own_code(rows_backend):
    q, k, v = _qkv()
    keep = mh.Mask.keep(torch.rand(6, 9, generator=torch.Generator().manual_seed(1)) > 0.5)
    assert mh.dispatch(q, k, v, keep).codes["rows"] == "rows.mask"
    with pytest.raises(CannotRunError) as refused:
        mh.attention(q, k, v, keep, backend="rows")
    assert refused.value.code == "rows.mask" and refused.value.backend == "rows"
    assert mh.dispatch(q, k, v, dropout=0.1).codes["rows"] == "rows.dropout"  # from its capabilities


def test_registration_is_checked_and_undone():
    with pytest.raises(mh.AttentionError, match="new name"):
        mh.register_backend(type("Twin", (RowIntervals,), {"name": "sdpa"})())
    with pytest.raises(mh.AttentionError, match="no run"):
        mh.register_backend(type("Half", (), {"name": "half", "plan": lambda self, p, auto: None})())
    with pytest.raises(mh.AttentionError, match="only a registered backend"):
        remove_backend("sdpa")
    mh.register_backend(RowIntervals())
    assert backend_names()[-2:] == ["rows", "math"]  # by default just before the reference math
    remove_backend("rows")
    assert "rows" not in backend_names()
