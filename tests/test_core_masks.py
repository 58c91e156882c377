"""Mask: each convention's meaning, combination, structure, and dense forms."""
from __future__ import annotations

import pytest
import torch

import multihead as mh


def dense_keep(mask, B=2, H=1, Lq=3, Lk=4):
    keep, _ = mask.materialize(B, H, Lq, Lk)
    return torch.broadcast_to(keep, (B, H, Lq, Lk))


def test_keep_and_block_are_opposites_and_accept_0_1_numbers():
    t = torch.tensor([[1, 0, 1, 1]])
    assert torch.equal(dense_keep(mh.Mask.keep(t)), dense_keep(mh.Mask.block(1 - t)))
    assert torch.equal(dense_keep(mh.Mask.keep(t.bool())), dense_keep(mh.Mask.keep(t.float())))


def test_lengths_follow_d2l_semantics_for_both_shapes():
    keep = dense_keep(mh.Mask.lengths(torch.tensor([1, 3])))
    assert keep[0, 0, :, 0].all() and not keep[0, 0, :, 1:].any()
    assert keep[1, 0, :, :3].all() and not keep[1, 0, :, 3].any()
    per_query = dense_keep(mh.Mask.lengths(torch.tensor([[1, 2, 3], [4, 4, 0]])))
    assert per_query[0, 0].sum(-1).tolist() == [1, 2, 3] and per_query[1, 0].sum(-1).tolist() == [4, 4, 0]


def test_query_lengths_make_padding_query_rows_empty():
    keep = dense_keep(mh.Mask.lengths(torch.tensor([4, 2]), query_lens=torch.tensor([3, 1])))
    assert keep[0].any(-1).all() and keep[1, 0, 0].any() and not keep[1, 0, 1:].any()


def test_key_padding_true_means_padding():
    pad = torch.tensor([[False, False, True, True], [False, False, False, False]])
    assert torch.equal(dense_keep(mh.Mask.key_padding(pad))[:, 0, 0], ~pad)


def test_causal_alignments():
    tl = dense_keep(mh.Mask.causal(), B=1, Lq=2, Lk=4)[0, 0]
    br = dense_keep(mh.Mask.causal("bottom_right"), B=1, Lq=2, Lk=4)[0, 0]
    assert tl.tolist() == [[True, False, False, False], [True, True, False, False]]
    assert br.tolist() == [[True, True, True, False], [True, True, True, True]]


def test_and_keeps_only_what_both_keep_and_adds_offsets():
    a = mh.Mask.lengths(torch.tensor([2, 4])) & mh.Mask.causal()
    assert torch.equal(dense_keep(a), dense_keep(mh.Mask.lengths(torch.tensor([2, 4]))) & dense_keep(mh.Mask.causal()))
    b1, b2 = torch.randn(3, 4), torch.randn(3, 4)
    _, bias = (mh.Mask.additive(b1) & mh.Mask.additive(b2)).materialize(2, 1, 3, 4)
    assert torch.allclose(bias, b1 + b2)


def test_additive_minus_inf_becomes_structure():
    t = torch.tensor([[0.5, float("-inf")]])
    keep, bias = mh.Mask.additive(t).materialize(1, 1, 1, 2)
    assert keep.tolist() == [[True, False]] and torch.isfinite(bias).all() and bias[0, 0] == 0.5


def test_structure_queries_and_repr():
    form = mh.Mask.causal().normal_form()
    assert len(form.causal_on(form.index(1, 1, 3, 3, "cpu"))) == 1  # SDPA can take it as is_causal=True
    form = mh.Mask.causal("bottom_right").normal_form()
    assert form.causal_on(form.index(1, 1, 2, 3, "cpu")) == ()  # Lq != Lk: not SDPA's top-left
    text = repr(mh.Mask.causal() & mh.Mask.lengths(torch.tensor([1, 2])) & mh.Mask.additive(torch.zeros(3, 4)))
    assert text == "Mask(causal(top_left) & lengths(2,) & additive(3, 4))"


def test_materialize_checks_the_target_shape():
    with pytest.raises(mh.AttentionError, match="cannot broadcast"):
        mh.Mask.keep(torch.ones(4, 5, 2, dtype=torch.bool)).materialize(2, 2, 4, 5)


def test_mask_tensors_are_its_pytree_leaves_in_order():
    """Mask.tensors (read by the backends to ask whether a mask needs grad) are the tensor leaves torch.compile sees."""
    import torch.utils._pytree as pytree

    lens, slopes = torch.tensor([3, 5]), torch.tensor([0.5, 0.25])
    mask = mh.Mask.lengths(lens) & mh.Mask.causal() & mh.Mask.alibi(slopes)
    leaves = [t for t in pytree.tree_leaves(mask) if t is not None]  # an absent query_lens is a None leaf
    assert len(mask.tensors) == len(leaves) and all(a is b for a, b in zip(mask.tensors, leaves))
    assert mask.tensors[-1] is slopes and torch.equal(mask.tensors[0], lens)
    assert mh.Mask.causal().tensors == ()
