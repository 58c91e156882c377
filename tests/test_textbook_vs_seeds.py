"""Each textbook class against its document's own code (tests/seeds/) with the same weights.

Forward and backward must be *equal* (tolerance 0: the textbook keeps the documents' operations in
the documents' order) under every mask convention the document uses.
"""

from __future__ import annotations

import pytest
import torch

from helpers import assert_same_forward_and_grads
from multihead import textbook as tb
from seeds import doc000, doc001, doc002, doc003, doc004


def twin(ours_cls, seed_cls, *args, **kwargs):
    """(ours, theirs): the document's module, and ours loaded with its weights (strict)."""
    torch.manual_seed(0)
    theirs = seed_cls(*args, **kwargs)
    ours = ours_cls(*args, **kwargs)
    ours.load_state_dict(theirs.state_dict(), strict=True)
    return ours, theirs


def randn(*shape):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(sum(shape)))


# --- document 000: additive 0/1 mask, 1 = blocked ------------------------------------------------

B, L, E, H = 2, 5, 12, 3
CAUSAL_01 = torch.triu(torch.ones(L, L), diagonal=1)  # (L, L), 1 above the diagonal = future
PADDING_01 = torch.tensor([[0.0] * L, [0.0] * 3 + [1.0] * 2]).view(B, 1, 1, L)  # (B, 1, 1, L)


@pytest.mark.parametrize("mask", [None, CAUSAL_01, PADDING_01, CAUSAL_01.bool(), CAUSAL_01 * PADDING_01],
                         ids=["none", "causal-LL", "padding-B11L", "causal-bool", "both"])
def test_doc000_equals_document(mask):
    ours, theirs = twin(tb.ReshapeTransposeHeads, doc000.MultiHeadAttention, E, H)
    assert_same_forward_and_grads(ours, theirs, [randn(B, L, E)], lambda m, x: m(x, mask))


def test_doc000_split_head_equals_document():
    ours, theirs = twin(tb.ReshapeTransposeHeads, doc000.MultiHeadAttention, E, H)
    x = randn(B, L, E)
    assert torch.equal(ours.split_head(x), theirs.split_head(x))


# --- document 001: causal buffer, stacked and split heads ----------------------------------------

@pytest.mark.parametrize("tokens", [6, 4], ids=["full-context", "shorter-than-context"])
def test_doc001_stacked_equals_document(tokens):
    ours, theirs = twin(tb.StackedHeads, doc001.MultiHeadAttentionStack, 3, 2, 6, 0.0, num_heads=3)
    assert_same_forward_and_grads(ours, theirs, [randn(2, tokens, 3)], lambda m, x: m(x))


@pytest.mark.parametrize("tokens", [6, 4], ids=["full-context", "shorter-than-context"])
@pytest.mark.parametrize("qkv_bias", [False, True])
def test_doc001_split_equals_document(tokens, qkv_bias, capsys):
    ours, theirs = twin(tb.SplitHeads, doc001.MultiHeadAttention, 3, 4, 6, 0.0, 2, qkv_bias=qkv_bias)
    assert_same_forward_and_grads(ours, theirs, [randn(2, tokens, 3)], lambda m, x: m(x))
    printed = capsys.readouterr().out
    assert printed.count(f"torch.Size([2, {tokens}, 4])") == 1, "only the document's copy prints"


def test_doc001_dropout_on_weights_draws_like_the_document(capsys):
    stacked = twin(tb.StackedHeads, doc001.MultiHeadAttentionStack, 3, 2, 6, 0.5, num_heads=2)
    split = twin(tb.SplitHeads, doc001.MultiHeadAttention, 3, 4, 6, 0.5, 2)
    for ours, theirs in (stacked, split):
        out = assert_same_forward_and_grads(ours.train(), theirs.train(), [randn(2, 6, 3)],
                                            lambda m, x: m(x), seed=3)
        torch.manual_seed(3)
        assert not torch.equal(out, ours.eval()(randn(2, 6, 3))), "dropout changed nothing"


def test_doc001_causal_head_equals_document():
    ours, theirs = twin(tb.CausalAttention, doc001.CausalAttention, 3, 2, 6, 0.0)
    assert_same_forward_and_grads(ours, theirs, [randn(2, 5, 3)], lambda m, x: m(x))


# --- document 002: keep mask (mask == 0 blocked), separate Q, K, V --------------------------------

LQ, LK, D_MODEL = 4, 6, 16
KEEP_PAD = torch.tensor([[1] * LK, [1] * 4 + [0] * 2]).view(2, 1, 1, LK)  # (B, 1, 1, Lk)
KEEP_CAUSAL = torch.tril(torch.ones(LQ, LK)).view(1, 1, LQ, LK)  # (1, 1, Lq, Lk)


@pytest.mark.parametrize("mask", [None, KEEP_PAD, KEEP_CAUSAL, KEEP_PAD.bool() & KEEP_CAUSAL.bool()],
                         ids=["none", "padding", "causal", "both-bool"])
def test_doc002_equals_document_cross_attention(mask):
    ours, theirs = twin(tb.ClassicTransformerHeads, doc002.MultiHeadAttention, D_MODEL, 4)
    inputs = [randn(2, LQ, D_MODEL), randn(2, LK, D_MODEL), randn(2, LK, D_MODEL)]
    assert_same_forward_and_grads(ours, theirs, inputs, lambda m, q, k, v: m(q, k, v, mask))


def test_doc002_farward_typo_module_cannot_be_called_but_its_method_matches():
    ours, theirs = twin(tb.ClassicTransformerHeads, doc002.MultiHeadAttentionAsWritten, D_MODEL, 4)
    q, kv = randn(2, LQ, D_MODEL), randn(2, LK, D_MODEL)
    with pytest.raises(NotImplementedError, match="forward"):
        theirs(q, kv, kv)  # nn.Module only ever calls `forward`
    assert_same_forward_and_grads(ours, theirs, [q, kv, kv, KEEP_PAD],
                                  lambda m, q, k, v, mask: getattr(m, "farward", m.forward)(q, k, v, mask))


def test_doc002_split_and_combine_heads_equal_document():
    ours, theirs = twin(tb.ClassicTransformerHeads, doc002.MultiHeadAttention, D_MODEL, 4)
    x = randn(2, LQ, D_MODEL)
    assert torch.equal(ours.split_heads(x), theirs.split_heads(x))
    assert torch.equal(ours.combine_heads(ours.split_heads(x)), x)


# --- document 003: sequence-first, mask (Lq, Lk, B) with size-1 broadcasting, 0 = blocked ---------

SEQ_Q, SEQ_K, BATCH = 4, 5, 3
MASKS_003 = {
    "none": None,
    "full-LqLkB": (randn(SEQ_Q, SEQ_K, BATCH) > -0.5).index_fill(1, torch.tensor([0]), True),
    "shared-query-1LkB": torch.tensor([[1, 1, 1], [1, 0, 1], [1, 1, 0], [1, 1, 1], [0, 1, 1]]).view(1, SEQ_K, BATCH),
    "shared-batch-LqLk1": torch.tril(torch.ones(SEQ_Q, SEQ_K)).view(SEQ_Q, SEQ_K, 1),
    "all-1-1Lk1": torch.tensor([1, 1, 1, 0, 1]).view(1, SEQ_K, 1),
}


@pytest.mark.parametrize("mask", MASKS_003.values(), ids=MASKS_003.keys())
@pytest.mark.parametrize("bias", [True, False])
def test_doc003_equals_document(mask, bias):
    ours, theirs = twin(tb.SeqFirstEinsumHeads, doc003.MultiHeadAttention, 2, 8, dropout_prob=0.0, bias=bias)
    assert "value.linear.bias" in ours.state_dict(), "value projection always has a bias"
    inputs = [randn(SEQ_Q, BATCH, 8), randn(SEQ_K, BATCH, 8), randn(SEQ_K, BATCH, 8)]
    assert_same_forward_and_grads(ours, theirs, inputs, lambda m, q, k, v: m(q, k, v, mask))
    assert torch.equal(ours.attn, theirs.attn), "the last attention weights are kept the same way"
    assert ours.attn.shape == (SEQ_Q, SEQ_K, BATCH, 2)


def test_doc003_dropout_and_kept_weights_like_the_document():
    ours, theirs = twin(tb.SeqFirstEinsumHeads, doc003.MultiHeadAttention, 4, 8)  # dropout_prob=0.1
    x = randn(SEQ_Q, BATCH, 8)
    assert_same_forward_and_grads(ours.train(), theirs.train(), [x], lambda m, x: m(x, x, x, None), seed=5)
    assert torch.equal(ours.attn, theirs.attn)


def test_doc003_prepare_for_multi_head_attention_equals_document():
    ours, theirs = twin(tb.PrepareForMultiHeadAttention, doc003.PrepareForMultiHeadAttention, 8, 2, 4, True)
    for shape in [(SEQ_Q, BATCH, 8), (BATCH, 8)]:  # (L, B, d_model) or (B, d_model)
        out = assert_same_forward_and_grads(ours, theirs, [randn(*shape)], lambda m, x: m(x))
        assert out.shape == shape[:-1] + (2, 4)


def test_doc003_get_score_and_prepare_mask_equal_document():
    ours, theirs = twin(tb.SeqFirstEinsumHeads, doc003.MultiHeadAttention, 2, 8)
    q, k = randn(SEQ_Q, BATCH, 2, 4), randn(SEQ_K, BATCH, 2, 4)
    assert torch.equal(ours.get_score(q, k), theirs.get_score(q, k))
    mask = MASKS_003["shared-query-1LkB"]
    shapes = ((SEQ_Q, BATCH, 8), (SEQ_K, BATCH, 8))
    assert torch.equal(ours.prepare_mask(mask, *shapes), theirs.prepare_mask(mask, *shapes))


# --- document 004: valid_lens (B,) or (B, Lq), heads folded into the batch -------------------------

LENS_004 = {
    "none": None,
    "per-sequence-B": torch.tensor([2, 5]),
    "per-query-BLq": torch.tensor([[1, 2, 3, 4], [5, 5, 1, 2]]),
}


@pytest.mark.parametrize("valid_lens", LENS_004.values(), ids=LENS_004.keys())
@pytest.mark.parametrize("bias", [False, True])
def test_doc004_equals_document(valid_lens, bias):
    # key_size 6, query_size 7, value_size 9, num_hiddens 8, 2 heads
    ours, theirs = twin(tb.FoldedBatchHeads, doc004.MultiHeadAttention, 6, 7, 9, 8, 2, 0.0, bias=bias)
    inputs = [randn(2, 4, 7), randn(2, 5, 6), randn(2, 5, 9)]
    assert_same_forward_and_grads(ours, theirs, inputs, lambda m, q, k, v: m(q, k, v, valid_lens))
    assert torch.equal(ours.attention.attention_weights, theirs.attention.attention_weights)


def test_doc004_dropout_draws_like_the_document():
    ours, theirs = twin(tb.FoldedBatchHeads, doc004.MultiHeadAttention, 8, 8, 8, 8, 4, 0.5)
    x = randn(2, 5, 8)
    assert_same_forward_and_grads(ours.train(), theirs.train(), [x, LENS_004["per-sequence-B"]],
                                  lambda m, x, lens: m(x, x, x, lens), seed=11)


def test_doc004_helpers_equal_document():
    x = randn(2, 5, 12)
    assert torch.equal(tb.transpose_qkv(x, 3), doc004.transpose_qkv(x, 3))
    assert tb.transpose_qkv(x, 3).shape == (6, 5, 4)  # (B * H, L, num_hiddens / H)
    assert torch.equal(tb.transpose_output(tb.transpose_qkv(x, 3), 3), x)
    scores = randn(4, 3, 5)
    for lens in (torch.tensor([1, 2, 5, 3]), torch.tensor([[1, 2, 3]] * 4), None):
        assert torch.equal(tb.masked_softmax(scores.clone(), lens), doc004.masked_softmax(scores.clone(), lens))
    rows = randn(3, 5)
    lens = torch.tensor([0, 2, 5])
    assert torch.equal(tb.sequence_mask(rows.clone(), lens, value=-7.0),
                       doc004.sequence_mask(rows.clone(), lens, value=-7.0))
    q, k, v = randn(4, 3, 6), randn(4, 5, 6), randn(4, 5, 2)
    ours, theirs = tb.DotProductAttention(0.0), doc004.DotProductAttention(0.0)
    assert_same_forward_and_grads(ours, theirs, [q, k, v, torch.tensor([5, 1, 2, 3])],
                                  lambda m, q, k, v, lens: m(q, k, v, lens))
