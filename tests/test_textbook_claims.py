"""The facts docs/textbook.md states about the documents' code, checked by computation."""

from __future__ import annotations

import pytest
import torch

from multihead import textbook as tb


def test_doc000_split_head_gives_each_head_its_feature_slice_of_every_token():
    m = tb.ReshapeTransposeHeads(8, 2)  # head_dim 4
    x = torch.arange(2 * 3 * 8, dtype=torch.float32).view(2, 3, 8)  # (B, L, hidden)
    heads = m.split_head(x)  # (B, H, L, d)
    for h in range(2):
        assert torch.equal(heads[:, h], x[..., h * 4:(h + 1) * 4])  # head h: features [4h, 4h+4) of all tokens
    direct = x.reshape(2, 2, 3, 4)  # the "why not reshape(B, H, L, d)" alternative
    assert not torch.equal(direct, heads)
    assert torch.equal(direct[0, 0, 1], x[0, 0, 4:])  # it hands head 0 the second half of token 0


def test_doc000_transpose_moves_no_data():
    x = torch.randn(2, 3, 8)
    heads = tb.ReshapeTransposeHeads(8, 2).split_head(x)
    assert heads.data_ptr() == x.data_ptr() and not heads.is_contiguous()  # a strided view, same memory
    assert heads.stride() == (24, 4, 8, 1)  # next token is 8 floats away: memory order is unchanged


def test_doc001_view_needs_contiguous_after_transpose():
    context = torch.randn(2, 2, 6, 2).transpose(1, 2)  # (B, H, L, d) -> (B, L, H, d), not contiguous
    with pytest.raises(RuntimeError, match="view"):
        context.view(2, 6, 4)
    assert torch.equal(context.contiguous().view(2, 6, 4), context.reshape(2, 6, 4))


def test_doc004_element_count_is_preserved_by_folding():
    x = torch.randn(2, 5, 12)
    folded = tb.transpose_qkv(x, 3)
    assert folded.shape == (2 * 3, 5, 12 // 3) and folded.numel() == x.numel()


def test_doc004_parameters_do_not_grow_with_heads_for_fixed_num_hiddens():
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    sizes = {h: count(tb.FoldedBatchHeads(16, 16, 16, 16, h, 0.0)) for h in (1, 2, 4, 8)}
    assert len(set(sizes.values())) == 1 and sizes[1] == 4 * 16 * 16  # four 16x16 matrices, no bias


def test_doc001_stacked_parameters_do_grow_with_heads():
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    # each stacked head is a full single head: dim_out per head, so 3 * dim_in * dim_out per head
    assert [count(tb.StackedHeads(3, 2, 6, 0.0, num_heads=h)) for h in (1, 2, 4)] == [18, 36, 72]
