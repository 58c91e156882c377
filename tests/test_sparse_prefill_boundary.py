"""The sparse backend runs a prefill only up to the fraction of keys measured faster than the dense keep mask."""
from __future__ import annotations

import json
from pathlib import Path

import torch

import multihead as mh
from multihead.backends import sparse

RESULTS = Path(__file__).resolve().parents[1] / "benchmarks" / "sparse-prefill-boundary.json"


def prefill(Lq: int, Lk: int, K: int, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, 4, Lq, 16, generator=g).to(dtype)
    k, v = (torch.randn(1, 2, Lk, 16, generator=g).to(dtype) for _ in range(2))
    lists = torch.randint(0, Lk, (1, Lq, K), generator=g)
    return q, k, v, mh.Mask.sparse(lists)


def test_auto_leaves_a_prefill_above_the_measured_fraction_to_the_dense_keep_mask():
    for dtype in (torch.float32, torch.bfloat16):
        below, above, Lk = sparse.prefill_up_to(dtype), sparse.prefill_up_to(dtype) + 1, 4096
        assert mh.dispatch(*prefill(64, Lk, below, dtype)).backend == "sparse"
        d = mh.dispatch(*prefill(64, Lk, above, dtype))
        assert d.backend != "sparse" and d.codes["sparse"] == "sparse.prefill-dense-faster"
        assert mh.dispatch(*prefill(1, Lk, above, dtype)).backend == "sparse"  # a decode step keeps its kernel
        q, k, v, mask = prefill(64, Lk, above, dtype)
        torch.testing.assert_close(mh.attention(q, k, v, mask), mh.attention(q, k, v, mask, backend="sparse"),
                                   atol=1e-5 if dtype == torch.float32 else 2e-2, rtol=0)


def test_the_table_holds_the_most_keys_measured_faster_at_every_length_on_the_committed_machine():
    data = json.loads(RESULTS.read_text())
    capability = data["machine"]["cpu_capability"]
    for name, dtype in (("float32", torch.float32), ("bfloat16", torch.bfloat16)):
        up_to = sparse.PREFILL_UP_TO[(capability, dtype)]
        rows = [r for r in data["rows"] if r["dtype"] == name]
        assert up_to == data["sparse wins up to K"][name]
        assert all(r["dense / sparse"] > 1.0 for r in rows if r["K"] <= up_to)
        assert any(r["dense / sparse"] < 1.0 for r in rows if r["K"] > up_to) or up_to == max(r["K"] for r in rows)
