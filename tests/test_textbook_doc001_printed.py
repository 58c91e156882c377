"""Document 001's own session, replayed: ``torch.manual_seed(123)`` on its 6-token input must print
exactly the tensors the document prints (4 decimals), with our classes and with the document's code."""

from __future__ import annotations

import torch

from multihead import textbook as tb
from seeds import doc001

# The rows the document prints (both batch entries are the same input, so the same rows).
STACKED_PRINTED = torch.tensor([
    [-0.4519, 0.2216, 0.4772, 0.1063],
    [-0.5874, 0.0058, 0.5891, 0.3257],
    [-0.6300, -0.0632, 0.6202, 0.3860],
    [-0.5675, -0.0843, 0.5478, 0.3589],
    [-0.5526, -0.0981, 0.5321, 0.3428],
    [-0.5299, -0.1081, 0.5077, 0.3493],
])
SPLIT_PRINTED = torch.tensor([
    [0.1184, 0.3120, -0.0847, -0.5774],
    [0.0178, 0.3221, -0.0763, -0.4225],
    [-0.0147, 0.3259, -0.0734, -0.3721],
    [-0.0116, 0.3138, -0.0708, -0.3624],
    [-0.0117, 0.2973, -0.0698, -0.3543],
    [-0.0132, 0.2990, -0.0689, -0.3490],
])


def assert_prints(context_vecs, rows):
    """Equal to the document's print-out: shape (2, 6, 4), every value to 4 decimals."""
    assert context_vecs.shape == (2, 6, 4)
    torch.testing.assert_close(context_vecs.detach(), rows.expand(2, 6, 4), atol=5e-5, rtol=0)


def test_stacked_heads_print_the_documents_tensor():
    # In [3]: the document's cell, with our class in place of MultiHeadAttentionStack.
    torch.manual_seed(123)
    batch = torch.stack((doc001.inputs, doc001.inputs), dim=0)
    b, token_len, dim = batch.shape
    multi_heads = tb.StackedHeads(dim, 2, token_len, 0.0, num_heads=2)
    assert_prints(multi_heads(batch), STACKED_PRINTED)


def test_split_heads_print_the_documents_tensor(capsys):
    # In [44] / In [45]: the seed is set, then the module is built and called.
    batch = torch.stack((doc001.inputs, doc001.inputs), dim=0)
    torch.manual_seed(123)
    b, num_tokens, dim_in = batch.shape
    multi_heads = tb.SplitHeads(dim_in, 4, num_tokens, 0.0, 2)
    assert_prints(multi_heads(batch), SPLIT_PRINTED)
    assert capsys.readouterr().out == "", "the textbook class keeps none of the document's debug prints"


def test_the_documents_own_code_prints_the_same(capsys):
    batch = torch.stack((doc001.inputs, doc001.inputs), dim=0)
    torch.manual_seed(123)
    assert_prints(doc001.MultiHeadAttentionStack(3, 2, 6, 0.0, num_heads=2)(batch), STACKED_PRINTED)
    torch.manual_seed(123)
    assert_prints(doc001.MultiHeadAttention(3, 4, 6, 0.0, 2)(batch), SPLIT_PRINTED)
    # ... and its forward's two debugging prints, as in the document's output cell.
    assert capsys.readouterr().out.splitlines() == [
        "torch.Size([2, 6, 4])", "Linear(in_features=4, out_features=4, bias=True)"]
