"""Each textbook class against the plain-loop float64 reference (tests/helpers.py: reference_mha).

The classes run in float64 with their own random weights; their mask conventions are translated to a
keep mask (True = may attend) written out independently here. Every query keeps at least one key.
"""

from __future__ import annotations

import pytest
import torch

from helpers import linear_params, randn64, reference_mha
from multihead import textbook as tb

TOL = dict(atol=1e-12, rtol=1e-10)


def projections(q, k, v, o=None):
    """reference_mha keyword arguments from four nn.Linear layers (o=None: no output projection)."""
    params = {**linear_params(q, "q"), **linear_params(k, "k"), **linear_params(v, "v")}
    return params if o is None else {**params, **linear_params(o, "o")}


def build64(cls, *args, **kwargs):
    torch.manual_seed(1)
    return cls(*args, **kwargs).double()


# --- 000: additive 0/1 "1 = blocked" -> keep = mask == 0 ---------------------------------------------

@pytest.mark.parametrize("block", [None, torch.triu(torch.ones(5, 5), 1),
                                   torch.tensor([[0.0] * 5, [0.0] * 2 + [1.0] * 3]).view(2, 1, 1, 5)],
                         ids=["none", "causal", "padding"])
def test_reshape_transpose_heads_matches_reference(block):
    m = build64(tb.ReshapeTransposeHeads, 12, 3)
    x = randn64(2, 5, 12, seed=0)
    keep = None if block is None else block == 0
    ref = reference_mha(x, x, x, **projections(m.q_linear, m.k_linear, m.v_linear, m.o_linear),
                        num_heads=3, keep_mask=keep)
    torch.testing.assert_close(m(x, None if block is None else block.double()), ref, **TOL)


# --- 001: causal; stacked = concatenated heads, split = one big matrix ---------------------------------

def causal_keep(L):
    return torch.tril(torch.ones(L, L, dtype=torch.bool))  # query i keeps keys j <= i


@pytest.mark.parametrize("tokens", [6, 3])
def test_stacked_heads_match_reference(tokens):
    m = build64(tb.StackedHeads, 3, 2, 6, 0.0, num_heads=3)
    x = randn64(2, tokens, 3, seed=0)
    cat = lambda name: torch.cat([getattr(h, name).weight for h in m.heads])  # noqa: E731  (H*2, 3)
    ref = reference_mha(x, x, x, wq=cat("W_query"), wk=cat("W_key"), wv=cat("W_value"), num_heads=3,
                        keep_mask=causal_keep(tokens))
    torch.testing.assert_close(m(x), ref, **TOL)


@pytest.mark.parametrize("qkv_bias", [False, True])
def test_split_heads_match_reference(qkv_bias):
    m = build64(tb.SplitHeads, 3, 6, 6, 0.0, 2, qkv_bias=qkv_bias)
    x = randn64(2, 5, 3, seed=0)
    ref = reference_mha(x, x, x, **projections(m.Wq, m.Wk, m.Wv, m.Wo), num_heads=2, keep_mask=causal_keep(5))
    torch.testing.assert_close(m(x), ref, **TOL)


def test_stacked_weights_concatenate_into_split_weights():
    """Document 001's lesson: per-head W_query stacked row-wise is the split version's Wq."""
    stacked = build64(tb.StackedHeads, 3, 2, 6, 0.0, num_heads=2)
    split = build64(tb.SplitHeads, 3, 4, 6, 0.0, 2)
    with torch.no_grad():
        for big, small in (("Wq", "W_query"), ("Wk", "W_key"), ("Wv", "W_value")):
            getattr(split, big).weight.copy_(torch.cat([getattr(h, small).weight for h in stacked.heads]))
        split.Wo.weight.copy_(torch.eye(4))  # no output projection in the stacked version
        split.Wo.bias.zero_()
    x = randn64(2, 6, 3, seed=0)
    torch.testing.assert_close(split(x), stacked(x), **TOL)


# --- 002: keep mask, mask == 0 blocked, cross-attention ------------------------------------------------

@pytest.mark.parametrize("mask", [None, torch.tensor([[1, 1, 1, 1, 1, 1], [1, 1, 1, 0, 0, 0]]).view(2, 1, 1, 6),
                                  torch.tril(torch.ones(4, 6)).view(1, 1, 4, 6)],
                         ids=["none", "padding", "causal"])
def test_classic_transformer_heads_match_reference(mask):
    m = build64(tb.ClassicTransformerHeads, 16, 4)
    q, kv = randn64(2, 4, 16, seed=0), randn64(2, 6, 16, seed=1)
    keep = None if mask is None else mask != 0
    ref = reference_mha(q, kv, kv, **projections(m.W_q, m.W_k, m.W_v, m.W_o), num_heads=4, keep_mask=keep)
    torch.testing.assert_close(m(q, kv, kv, mask), ref, **TOL)


# --- 003: seq-first, mask (Lq, Lk, B) 0 = blocked -> keep (B, 1, Lq, Lk) -------------------------------

@pytest.mark.parametrize("mask", [None, torch.tensor([[1, 0, 1], [1, 1, 1], [1, 1, 0], [0, 1, 1]]).view(1, 4, 3),
                                  torch.tril(torch.ones(5, 4)).view(5, 4, 1)],
                         ids=["none", "1-Lk-B", "Lq-Lk-1"])
@pytest.mark.parametrize("bias", [True, False])
def test_seq_first_einsum_heads_match_reference(mask, bias):
    m = build64(tb.SeqFirstEinsumHeads, 2, 8, dropout_prob=0.0, bias=bias)
    q, kv = randn64(5, 3, 8, seed=0), randn64(4, 3, 8, seed=1)  # (Lq, B, E), (Lk, B, E)
    keep = None if mask is None else (mask != 0).permute(2, 0, 1).unsqueeze(1)  # (B|1, 1, Lq|1, Lk)
    to_batch_first = lambda t: t.transpose(0, 1)  # noqa: E731  (L, B, E) -> (B, L, E)
    ref = reference_mha(to_batch_first(q), to_batch_first(kv), to_batch_first(kv), num_heads=2, keep_mask=keep,
                        **projections(m.query.linear, m.key.linear, m.value.linear, m.output))
    torch.testing.assert_close(m(q, kv, kv, mask), to_batch_first(ref), **TOL)
    weights = m.attn.permute(2, 3, 0, 1)  # kept weights (Lq, Lk, B, H) -> (B, H, Lq, Lk)
    torch.testing.assert_close(weights.sum(-1), torch.ones(3, 2, 5, dtype=torch.float64), **TOL)
    if keep is not None:
        assert (weights.masked_select(~keep.expand_as(weights)) == 0).all()


# --- 004: valid_lens (B,) or (B, Lq) -> keep keys j < len ----------------------------------------------

@pytest.mark.parametrize("valid_lens", [None, torch.tensor([2, 6]), torch.tensor([[1, 2, 3, 4], [6, 5, 1, 2]])],
                         ids=["none", "B", "B-Lq"])
@pytest.mark.parametrize("bias", [False, True])
def test_folded_batch_heads_match_reference(valid_lens, bias):
    m = build64(tb.FoldedBatchHeads, 6, 7, 9, 8, 2, 0.0, bias=bias)
    q, k, v = randn64(2, 4, 7, seed=0), randn64(2, 6, 6, seed=1), randn64(2, 6, 9, seed=2)
    keep = None
    if valid_lens is not None:
        lens = valid_lens.view(2, 1, -1, 1)  # (B, 1, 1|Lq, 1)
        keep = torch.arange(6).view(1, 1, 1, 6) < lens  # (B, 1, 1|Lq, Lk)
    ref = reference_mha(q, k, v, **projections(m.W_q, m.W_k, m.W_v, m.W_o), num_heads=2, keep_mask=keep)
    torch.testing.assert_close(m(q, k, v, valid_lens), ref, **TOL)
