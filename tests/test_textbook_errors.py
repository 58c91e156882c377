"""Bad input to a textbook class raises AttentionError saying what was expected and what came."""

from __future__ import annotations

import pytest
import torch

import multihead as mh
from multihead import textbook as tb


@pytest.mark.parametrize("build, match", [
    (lambda: tb.ReshapeTransposeHeads(10, 3), r"hidden_size=10 must be divisible by num_heads=3"),
    (lambda: tb.ReshapeTransposeHeads(8, 0), r"num_heads must be a positive int, got 0"),
    (lambda: tb.SplitHeads(3, 5, 6, 0.0, 2), r"dim_out=5 must be divisible by num_heads=2"),
    (lambda: tb.StackedHeads(3, 2, 6, 0.0, num_heads=0), r"num_heads must be a positive int"),
    (lambda: tb.ClassicTransformerHeads(16, 5), r"d_model=16 must be divisible by num_heads=5"),
    (lambda: tb.SeqFirstEinsumHeads(3, 8), r"d_model=8 must be divisible by num_heads=3"),
    (lambda: tb.FoldedBatchHeads(8, 8, 8, 10, 4, 0.0), r"num_hiddens=10 must be divisible by num_heads=4"),
    (lambda: tb.ReshapeTransposeHeads(8, 2.0), r"num_heads must be a positive int, got 2.0"),
], ids=["000", "000-zero-heads", "001-split", "001-stacked", "002", "003", "004", "float-heads"])
def test_heads_that_do_not_divide_are_rejected_at_construction(build, match):
    with pytest.raises(mh.AttentionError, match=match):
        build()


def test_doc000_bad_inputs():
    m = tb.ReshapeTransposeHeads(8, 2)
    with pytest.raises(mh.AttentionError, match=r"\(B, L, hidden_size\) with last dim 8, got \(2, 5, 6\)"):
        m(torch.randn(2, 5, 6))
    with pytest.raises(mh.AttentionError, match=r"got \(5, 8\)"):
        m(torch.randn(5, 8))  # no batch dim
    with pytest.raises(mh.AttentionError,
                       match=r"attention_mask of shape \(4, 4\) cannot broadcast .* \(2, 2, 5, 5\)"):
        m(torch.randn(2, 5, 8), torch.zeros(4, 4))
    with pytest.raises(mh.AttentionError, match=r"attention_mask must be a torch.Tensor, got list"):
        m(torch.randn(2, 5, 8), [[0.0] * 5] * 5)


@pytest.mark.parametrize("cls, args", [(tb.StackedHeads, (3, 2, 6, 0.0, 2)), (tb.SplitHeads, (3, 4, 6, 0.0, 2)),
                                       (tb.CausalAttention, (3, 2, 6, 0.0))], ids=["stacked", "split", "head"])
def test_doc001_bad_inputs(cls, args):
    m = cls(*args)
    with pytest.raises(mh.AttentionError, match=r"x has 7 tokens but context_length is 6"):
        m(torch.randn(2, 7, 3))
    with pytest.raises(mh.AttentionError, match=r"\(B, L, dim_in\) with last dim 3, got \(2, 6, 4\)"):
        m(torch.randn(2, 6, 4))
    with pytest.raises(mh.AttentionError, match=r"x must be a torch.Tensor"):
        m([[0.1, 0.2, 0.3]])


def test_doc002_bad_inputs():
    m = tb.ClassicTransformerHeads(8, 2)
    q, kv = torch.randn(2, 3, 8), torch.randn(2, 4, 8)
    with pytest.raises(mh.AttentionError, match=r"K must have shape \(B, L, d_model\) with last dim 8"):
        m(q, torch.randn(2, 4, 6), kv)
    with pytest.raises(mh.AttentionError, match=r"Q \(2, 3, 8\) and K \(3, 4, 8\) must have the same batch size"):
        m(q, torch.randn(3, 4, 8), torch.randn(3, 4, 8))
    with pytest.raises(mh.AttentionError,
                       match=r"K \(2, 4, 8\) and V \(2, 5, 8\) must have the same batch size and length"):
        m(q, kv, torch.randn(2, 5, 8))
    with pytest.raises(mh.AttentionError, match=r"mask of shape \(2, 1, 1, 3\) cannot broadcast .* \(2, 2, 3, 4\)"):
        m(q, kv, kv, torch.ones(2, 1, 1, 3))  # a mask over the queries instead of the keys


def test_doc003_mask_checks_explain_each_of_the_documents_asserts():
    m = tb.SeqFirstEinsumHeads(2, 8)
    q, kv = torch.randn(3, 2, 8), torch.randn(4, 2, 8)  # Lq=3, Lk=4, B=2
    with pytest.raises(mh.AttentionError, match=r"mask must have 3 dims \(Lq=3 or 1, Lk=4, B=2 or 1\), got \(3, 4\)"):
        m(q, kv, kv, torch.ones(3, 4))
    with pytest.raises(mh.AttentionError,
                       match=r"mask dim 0 must be the query length Lq=3 or 1, got mask \(2, 4, 2\)"):
        m(q, kv, kv, torch.ones(2, 4, 2))  # assert 1
    with pytest.raises(mh.AttentionError, match=r"mask dim 1 must be the key length Lk=4, got mask \(3, 1, 2\)"):
        m(q, kv, kv, torch.ones(3, 1, 2))  # assert 2: the key axis never broadcasts
    with pytest.raises(mh.AttentionError, match=r"mask dim 2 must be the batch size B=2 or 1, got mask \(3, 4, 3\)"):
        m(q, kv, kv, torch.ones(3, 4, 3))  # assert 3
    with pytest.raises(mh.AttentionError, match=r"mask dim 0 .* got mask \(2, 4, 3\)"):
        m(q, kv, kv, torch.ones(2, 4, 3))  # the document's batch-first reading (B, Lk, Lq) is rejected
    with pytest.raises(mh.AttentionError, match=r"mask must have 3 dims .* got list"):
        m(q, kv, kv, [[[1]]])


def test_doc003_bad_inputs():
    m = tb.SeqFirstEinsumHeads(2, 8)
    q, kv = torch.randn(3, 2, 8), torch.randn(4, 2, 8)
    with pytest.raises(mh.AttentionError,
                       match=r"query must have shape \(L, B, d_model\) with last dim 8, got \(3, 8\)"):
        m(torch.randn(3, 8), kv, kv)
    with pytest.raises(mh.AttentionError, match=r"must have the same batch size \(dim 1, sequence-first\)"):
        m(q, torch.randn(4, 3, 8), torch.randn(4, 3, 8))  # a batch-first key passed by mistake
    with pytest.raises(mh.AttentionError, match=r"must have the same length and batch size"):
        m(q, kv, torch.randn(5, 2, 8))


def test_doc004_bad_inputs():
    m = tb.FoldedBatchHeads(6, 7, 9, 8, 2, 0.0)
    q, k, v = torch.randn(2, 4, 7), torch.randn(2, 5, 6), torch.randn(2, 5, 9)
    with pytest.raises(mh.AttentionError,
                       match=r"valid_lens must have shape \(B,\)=\(2,\) or \(B, Lq\)=\(2, 4\), got \(3,\)"):
        m(q, k, v, torch.tensor([1, 2, 3]))
    with pytest.raises(mh.AttentionError, match=r"got \(2, 5\)"):
        m(q, k, v, torch.ones(2, 5, dtype=torch.long))  # one length per KEY is not a d2l form
    with pytest.raises(mh.AttentionError, match=r"valid_lens must be a torch.Tensor .* got list"):
        m(q, k, v, [3, 2])
    with pytest.raises(mh.AttentionError, match=r"keys must have shape \(B, Lk, key_size\) with last dim 6"):
        m(q, v, v, None)
    with pytest.raises(mh.AttentionError,
                       match=r"queries \(2, 4, 7\) and keys \(1, 5, 6\) must have the same batch size"):
        m(q, k[:1], v[:1], None)


def test_doc004_helpers_bad_inputs():
    with pytest.raises(mh.AttentionError, match=r"num_hiddens=8 must be divisible by num_heads=3"):
        tb.transpose_qkv(torch.randn(2, 5, 8), 3)
    with pytest.raises(mh.AttentionError, match=r"dim 0 a multiple of num_heads=2, got \(5, 4, 2\)"):
        tb.transpose_output(torch.randn(5, 4, 2), 2)
    with pytest.raises(mh.AttentionError, match=r"valid_lens must have shape \(B,\)=\(4,\) or \(B, Lq\)=\(4, 3\)"):
        tb.masked_softmax(torch.randn(4, 3, 5), torch.ones(4, 5))  # one length per key
    with pytest.raises(mh.AttentionError, match=r"got \(3,\)"):
        tb.DotProductAttention(0.0)(torch.randn(2, 3, 4), torch.randn(2, 5, 4), torch.randn(2, 5, 4),
                                    torch.tensor([1, 2, 3]))


def test_attention_error_is_a_value_error():
    with pytest.raises(ValueError):
        tb.SplitHeads(3, 5, 6, 0.0, 2)
