"""Each textbook class against ``mh.attention`` fed with the class's own projections.

This checks the mask translations that docs/textbook.md gives (each document's convention -> ``mh.Mask``)
on random inputs, for both backends, in float32.
"""

from __future__ import annotations

import pytest
import torch

import multihead as mh
from multihead import textbook as tb

TOL = dict(atol=2e-6, rtol=1e-5)
BACKENDS = ("math", "sdpa")


def randn(*shape, seed=0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def split(x, num_heads):
    """(B, L, H * D) -> (B, H, L, D)."""
    B, L, _ = x.shape
    return x.view(B, L, num_heads, -1).transpose(1, 2)


def merge(x):
    """(B, H, L, D) -> (B, L, H * D)."""
    B, H, L, D = x.shape
    return x.transpose(1, 2).reshape(B, L, H * D)


def core_mha(x_q, x_k, x_v, q_proj, k_proj, v_proj, out_proj, num_heads, mask, backend, causal=False):
    """project -> split -> mh.attention -> merge -> project, with the class's own Linear layers."""
    q, k, v = (split(proj(x), num_heads) for proj, x in ((q_proj, x_q), (k_proj, x_k), (v_proj, x_v)))
    out = merge(mh.attention(q, k, v, mask, causal=causal, backend=backend))  # (B, Lq, H * D)
    return out if out_proj is None else out_proj(out)


@pytest.mark.parametrize("backend", BACKENDS)
def test_doc000_block_mask(backend):
    torch.manual_seed(0)
    m, x = tb.ReshapeTransposeHeads(12, 3), randn(2, 5, 12)
    for block in (torch.triu(torch.ones(5, 5), 1), torch.tensor([[0.0] * 5, [0, 0, 1, 1, 1]]).view(2, 1, 1, 5)):
        ours = core_mha(x, x, x, m.q_linear, m.k_linear, m.v_linear, m.o_linear, 3, mh.Mask.block(block), backend)
        torch.testing.assert_close(m(x, block), ours, **TOL)


@pytest.mark.parametrize("backend", BACKENDS)
def test_doc001_causal(backend):
    torch.manual_seed(0)
    split_heads, x = tb.SplitHeads(3, 4, 6, 0.0, 2, qkv_bias=True), randn(2, 5, 3)
    ours = core_mha(x, x, x, split_heads.Wq, split_heads.Wk, split_heads.Wv, split_heads.Wo, 2, None, backend,
                    causal=True)
    torch.testing.assert_close(split_heads(x), ours, **TOL)

    stacked = tb.StackedHeads(3, 2, 6, 0.0, num_heads=3)
    projections = [concatenated(stacked, name) for name in ("W_query", "W_key", "W_value")]
    ours = core_mha(x, x, x, *projections, None, 3, mh.Mask.causal(), backend)  # no output projection
    torch.testing.assert_close(stacked(x), ours, **TOL)


def concatenated(stacked, name):
    """One Linear holding every head's ``name`` layer, head after head: the split view of the heads."""
    weights = torch.cat([getattr(h, name).weight for h in stacked.heads])  # (H * dim_out, dim_in)
    proj = torch.nn.Linear(weights.shape[1], weights.shape[0], bias=False)
    with torch.no_grad():
        proj.weight.copy_(weights)
    return proj


@pytest.mark.parametrize("backend", BACKENDS)
def test_doc002_keep_mask(backend):
    torch.manual_seed(0)
    m, q, kv = tb.ClassicTransformerHeads(16, 4), randn(2, 4, 16), randn(2, 6, 16, seed=1)
    padding = torch.tensor([[1] * 6, [1, 1, 1, 0, 0, 0]]).view(2, 1, 1, 6)  # (B, 1, 1, Lk)
    causal = torch.tril(torch.ones(4, 6)).view(1, 1, 4, 6)  # (1, 1, Lq, Lk)
    for keep in (padding, causal):
        ours = core_mha(q, kv, kv, m.W_q, m.W_k, m.W_v, m.W_o, 4, mh.Mask.keep(keep), backend)
        torch.testing.assert_close(m(q, kv, kv, keep), ours, **TOL)


@pytest.mark.parametrize("backend", BACKENDS)
def test_doc003_seq_first_mask(backend):
    torch.manual_seed(0)
    m = tb.SeqFirstEinsumHeads(2, 8, dropout_prob=0.0, bias=False)
    q, kv = randn(5, 3, 8), randn(4, 3, 8, seed=1)  # (Lq, B, E), (Lk, B, E)
    batch_first = lambda t: t.transpose(0, 1)  # noqa: E731
    for mask in (torch.tensor([[1, 0, 1], [1, 1, 1], [1, 1, 0], [0, 1, 1]]).view(1, 4, 3),
                 torch.tril(torch.ones(5, 4)).view(5, 4, 1), torch.ones(5, 4, 3)):
        keep = mh.Mask.keep(mask.permute(2, 0, 1).unsqueeze(1))  # (Lq, Lk, B) -> (B, 1, Lq, Lk)
        ours = core_mha(batch_first(q), batch_first(kv), batch_first(kv), m.query.linear, m.key.linear,
                        m.value.linear, m.output, 2, keep, backend)
        torch.testing.assert_close(m(q, kv, kv, mask), batch_first(ours), **TOL)


@pytest.mark.parametrize("backend", BACKENDS)
def test_doc004_valid_lens(backend):
    torch.manual_seed(0)
    m = tb.FoldedBatchHeads(6, 7, 9, 8, 2, 0.0)
    q, k, v = randn(2, 4, 7), randn(2, 6, 6, seed=1), randn(2, 6, 9, seed=2)
    for valid_lens in (torch.tensor([2, 6]), torch.tensor([[1, 2, 3, 4], [6, 5, 1, 2]])):
        ours = core_mha(q, k, v, m.W_q, m.W_k, m.W_v, m.W_o, 2, mh.Mask.lengths(valid_lens), backend)
        torch.testing.assert_close(m(q, k, v, valid_lens), ours, **TOL)


def test_fully_masked_rows_differ_by_convention_and_multihead_returns_zeros():
    """A query that may see no key: -1e9/-1e6 fills average all values, -inf gives NaN, mh gives 0."""
    torch.manual_seed(0)
    q, kv = randn(1, 2, 8), randn(1, 3, 8, seed=1)
    keep = torch.tensor([[1, 1, 1], [0, 0, 0]]).view(1, 1, 2, 3)  # query 1 sees nothing
    classic = tb.ClassicTransformerHeads(8, 2)
    uniform = classic.W_o(classic.W_v(kv).mean(1))  # equal weights on every key, then W_o
    torch.testing.assert_close(classic(q, kv, kv, keep)[0, 1], uniform[0], **TOL)
    labml = tb.SeqFirstEinsumHeads(2, 8, dropout_prob=0.0)
    assert torch.isnan(labml(q.transpose(0, 1), kv.transpose(0, 1), kv.transpose(0, 1),
                             keep[0, 0].unsqueeze(-1))[1]).all()
    ours = core_mha(q, kv, kv, classic.W_q, classic.W_k, classic.W_v, None, 2, mh.Mask.keep(keep), "math")
    assert (ours[0, 1] == 0).all()
