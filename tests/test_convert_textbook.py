"""from_module on the five documents' classes: multihead.textbook's and the documents' own code (tests/seeds).

Every case builds the source with random weights (float64), converts it, and checks the same output
and the same input gradients under each mask convention the document uses, mapped to our Mask:

    000  additive 0/1, 1 = blocked        -> Mask.block(m)
    001  causal triu buffer               -> a causal module (MultiHeadAttention(causal=True))
    002  keep, mask == 0 blocked          -> Mask.keep(m)
    003  (Lq, Lk, B), 0 = blocked         -> Mask.keep(m.permute(2, 0, 1)[:, None])   (seq-first)
    004  valid_lens (B,) or (B, Lq)       -> Mask.lengths(valid_lens)
"""
from __future__ import annotations

import pytest
import torch

import multihead as mh
import multihead.textbook as tb
from helpers import assert_same_forward_backward, randn64
from seeds import doc000, doc001, doc002, doc003, doc004

B, L, LK = 2, 5, 7  # batch, query length, key length (cross-attention cases)


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)


def convert(source):
    """float64 source in eval mode, and its conversion."""
    source = source.double().eval()
    return source, mh.MultiHeadAttention.from_module(source)


def check_000(cls):
    """hidden_size 16, 4 heads; additive 0/1 mask (L, L), 1 = blocked, each row keeps its diagonal."""
    source, ours = convert(cls(16, 4))
    blocked = (torch.rand(L, L) < 0.4).double().fill_diagonal_(0)
    assert_same_forward_backward(lambda x: source(x, blocked), lambda x: ours(x, mask=mh.Mask.block(blocked)),
                                 [randn64(B, L, 16)])
    assert_same_forward_backward(source, ours, [randn64(B, L, 16)])


def check_001_causal(make):
    """A causal document-001 module: context_length 8 > L, so its triu buffer is cut to (L, L)."""
    source, ours = convert(make())
    assert ours.causal  # found from the triu buffer: every call masks the future
    assert_same_forward_backward(source, ours, [randn64(B, L, 3)])


def check_002(cls):
    """d_model 16, 4 heads, separate Q/K/V of different lengths; keep mask (B, 1, Lq, Lk), 0 = blocked."""
    source, ours = convert(cls(16, 4))
    keep = (torch.rand(B, 1, L, LK) < 0.6)
    keep[..., 0] = True  # every query keeps at least one key
    inputs = [randn64(B, L, 16), randn64(B, LK, 16), randn64(B, LK, 16)]
    assert_same_forward_backward(lambda q, k, v: source(q, k, v, keep.long()),
                                 lambda q, k, v: ours(q, k, v, mask=mh.Mask.keep(keep)), inputs)
    assert_same_forward_backward(source, ours, inputs)


def check_003(cls, bias=True, mask_shape=(L, LK, B)):
    """heads 4, d_model 16, seq-first (L, B, E); mask (Lq, Lk, B) with size-1 broadcasting, 0 = blocked."""
    source, ours = convert(cls(4, 16, dropout_prob=0.0, bias=bias))
    assert ours.batch_first is False
    keep = torch.rand(mask_shape) < 0.6
    keep[:, 0] = True
    inputs = [randn64(L, B, 16), randn64(LK, B, 16), randn64(LK, B, 16)]
    ours_mask = mh.Mask.keep(keep.permute(2, 0, 1)[:, None])  # (Lq, Lk, B) -> (B, 1, Lq, Lk)
    assert_same_forward_backward(lambda q, k, v: source(q, k, v, keep),
                                 lambda q, k, v: ours(q, k, v, mask=ours_mask), inputs)
    assert_same_forward_backward(lambda q, k, v: source(q, k, v, None), ours, inputs)


def check_004(cls, bias=False):
    """query/key/value sizes 6/5/4, num_hiddens 12, 3 heads; valid_lens (B,) and (B, Lq), all >= 1."""
    source, ours = convert(cls(5, 6, 4, 12, 3, 0.0, bias=bias))
    inputs = [randn64(B, L, 6), randn64(B, LK, 5), randn64(B, LK, 4)]
    for valid_lens in (torch.tensor([3, LK]), torch.randint(1, LK + 1, (B, L))):
        assert_same_forward_backward(lambda q, k, v: source(q, k, v, valid_lens),
                                     lambda q, k, v: ours(q, k, v, mask=mh.Mask.lengths(valid_lens)), inputs)
    assert_same_forward_backward(lambda q, k, v: source(q, k, v, None), ours, inputs)


CAUSAL_001 = {
    "textbook-split": lambda: tb.SplitHeads(3, 4, 8, 0.0, num_heads=2),
    "textbook-split-bias": lambda: tb.SplitHeads(3, 4, 8, 0.0, num_heads=2, qkv_bias=True),
    "textbook-stacked": lambda: tb.StackedHeads(3, 2, 8, 0.0, num_heads=3),
    "textbook-one-head": lambda: tb.CausalAttention(3, 2, 8, 0.0),
    "document-split": lambda: doc001.MultiHeadAttention(3, 4, 8, 0.0, num_heads=2),
    "document-stacked": lambda: doc001.MultiHeadAttentionStack(3, 2, 8, 0.0, num_heads=3),
    "document-one-head": lambda: doc001.CausalAttention(3, 2, 8, 0.0),
}


@pytest.mark.parametrize("cls", [tb.ReshapeTransposeHeads, doc000.MultiHeadAttention], ids=["textbook", "document"])
def test_document_000_converts(cls):
    check_000(cls)


@pytest.mark.parametrize("name", CAUSAL_001)
def test_document_001_converts(name):
    check_001_causal(CAUSAL_001[name])


@pytest.mark.parametrize("cls", [tb.ClassicTransformerHeads, doc002.MultiHeadAttention], ids=["textbook", "document"])
def test_document_002_converts(cls):
    check_002(cls)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("mask_shape", [(L, LK, B), (1, LK, B), (L, LK, 1), (1, LK, 1)])
@pytest.mark.parametrize("cls", [tb.SeqFirstEinsumHeads, doc003.MultiHeadAttention], ids=["textbook", "document"])
def test_document_003_converts(cls, bias, mask_shape):
    check_003(cls, bias, mask_shape)


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("cls", [tb.FoldedBatchHeads, doc004.MultiHeadAttention], ids=["textbook", "document"])
def test_document_004_converts(cls, bias):
    check_004(cls, bias)


def test_stacked_heads_weights_concatenate_into_split_weights():
    """Document 001's lesson: head h's W_query is rows [h*D, (h+1)*D) of the split Wq; out is the identity."""
    stacked = tb.StackedHeads(3, 2, 8, 0.0, num_heads=3)
    ours = mh.MultiHeadAttention.from_module(stacked)
    for h, head in enumerate(stacked.heads):
        torch.testing.assert_close(ours.q_proj.weight[2 * h:2 * h + 2], head.W_query.weight)
        torch.testing.assert_close(ours.v_proj.weight[2 * h:2 * h + 2], head.W_value.weight)
    torch.testing.assert_close(ours.out_proj.weight, torch.eye(6))
    assert ours.out_proj.bias is None and (ours.num_heads, ours.head_dim, ours.out_dim) == (3, 2, 6)


def test_conversion_copies_mode_and_dropout_and_owns_its_weights():
    """Eval source -> eval result; attention dropout p carried over; later edits to the source do not leak."""
    source = tb.SeqFirstEinsumHeads(4, 16, dropout_prob=0.25)
    assert mh.MultiHeadAttention.from_module(source).training
    ours = mh.MultiHeadAttention.from_module(source.eval())
    assert not ours.training and ours.dropout == 0.25
    before = ours.q_proj.weight.clone()
    with torch.no_grad():
        source.query.linear.weight.add_(1.0)
    torch.testing.assert_close(ours.q_proj.weight, before)
