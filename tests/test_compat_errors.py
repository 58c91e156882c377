"""Every bad input to mh.compat.MultiheadAttention raises an error that is an AttentionError *and* an
instance of the type torch.nn.MultiheadAttention raises on the same input (AssertionError or
RuntimeError), with a message that names what was expected and what came."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import multihead as mh
from multihead.compat import CompatAssertionError, CompatPaddingMaskError, CompatRuntimeError, MultiheadAttention

E, H, B, L, S = 8, 2, 3, 4, 5


def x(*shape, dtype=torch.float32):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(0)).to(dtype)


def bools(*shape):
    return torch.zeros(*shape, dtype=torch.bool)


def self_attention(m, **kwargs):
    q = x(B, L, E)
    return m(q, q, q, need_weights=False, **kwargs)


# (id, constructor kwargs, call(module) with batch_first=True inputs (B, L, E) unless unbatched, our message)
CASES = [
    ("query 1-D", {}, lambda m: m(x(E), x(E), x(E)),
     r"query should be unbatched 2D or batched 3D tensor but received 1-D .* got shape \(8,\)"),
    ("query 4-D", {}, lambda m: m(x(1, B, L, E), x(1, B, S, E), x(1, B, S, E)),
     r"received 4-D query tensor.* got shape \(1, 3, 4, 8\)"),
    ("batched query, 2-D key", {}, lambda m: m(x(B, L, E), x(S, E), x(B, S, E)),
     r"expected `key` and `value` to be 3-D but found 2-D and 3-D tensors respectively"),
    ("batched query, 2-D value", {}, lambda m: m(x(B, L, E), x(B, S, E), x(S, E)), r"value \(5, 8\)"),
    ("unbatched query, 3-D key", {}, lambda m: m(x(L, E), x(B, S, E), x(S, E)),
     r"expected `key` and `value` to be 2-D but found 3-D and 2-D"),
    ("batched, 1-D key_padding_mask", {}, lambda m: m(x(B, L, E), x(B, S, E), x(B, S, E), key_padding_mask=bools(S)),
     r"expected `key_padding_mask` to be `None` or 2-D but found 1-D tensor instead"),
    ("unbatched, 2-D key_padding_mask", {}, lambda m: m(x(L, E), x(S, E), x(S, E), key_padding_mask=bools(1, S)),
     r"expected `key_padding_mask` to be `None` or 1-D but found 2-D .* got shape \(1, 5\)"),
    ("1-D attn_mask", {}, lambda m: m(x(B, L, E), x(B, S, E), x(B, S, E), attn_mask=bools(S)),
     r"expected `attn_mask` to be `None`, 2-D or 3-D but found 1-D tensor instead"),
    ("4-D attn_mask", {}, lambda m: m(x(B, L, E), x(B, S, E), x(B, S, E), attn_mask=bools(B, H, L, S)),
     r"but found 4-D tensor instead.* got shape \(3, 2, 4, 5\)"),
    ("unbatched, 3-D attn_mask with wrong heads", {},
     lambda m: m(x(L, E), x(S, E), x(S, E), attn_mask=bools(H + 1, L, S)),
     r"Expected `attn_mask` shape to be \(2, 4, 5\) = \(H, L, S\) .* got \(3, 4, 5\)"),
    ("integer attn_mask", {},
     lambda m: m(x(B, L, E), x(B, S, E), x(B, S, E), attn_mask=torch.zeros(L, S, dtype=torch.long)),
     r"only bool and floating types of attn_mask .* got dtype torch.int64"),
    ("integer key_padding_mask", {},
     lambda m: m(x(B, L, E), x(B, S, E), x(B, S, E), key_padding_mask=torch.zeros(B, S, dtype=torch.int32)),
     r"only bool and floating types of key_padding_mask"),
    ("is_causal=True without attn_mask", {}, lambda m: m(x(B, L, E), x(B, S, E), x(B, S, E), is_causal=True),
     r"Need attn_mask if specifying the is_causal hint.*attn_mask is required; got None"),
    ("query with wrong features", {}, lambda m: m(x(B, L, E + 1), x(B, S, E), x(B, S, E)),
     r"expecting embedding dimension of 8, but got 9.* got shape \(3, 4, 9\)"),
    ("key and value of different lengths", {}, lambda m: m(x(B, L, E), x(B, S, E), x(B, S + 1, E)),
     r"key shape \(3, 5, 8\) does not match value shape \(3, 6, 8\)"),
    ("key and value with wrong features", {}, lambda m: m(x(B, L, E), x(B, S, E + 2), x(B, S, E + 2)),
     r"key must have kdim=8 features .* got shape \(3, 5, 10\)"),
    ("separate kdim/vdim: lengths differ", dict(kdim=3, vdim=5), lambda m: m(x(B, L, E), x(B, S, 3), x(B, S + 1, 5)),
     r"do not match value's.* key \(3, 5, 3\) and value \(3, 6, 5\)"),
    ("separate kdim/vdim: wrong key features", dict(kdim=3, vdim=5), lambda m: m(x(B, L, E), x(B, S, 4), x(B, S, 5)),
     r"kdim=3 features"),
    ("separate kdim/vdim: wrong value features", dict(kdim=3, vdim=5), lambda m: m(x(B, L, E), x(B, S, 3), x(B, S, 6)),
     r"vdim=5 features"),
    ("2-D attn_mask of the wrong size", {}, lambda m: m(x(B, L, E), x(B, S, E), x(B, S, E), attn_mask=bools(L, S + 1)),
     r"2D attn_mask is \(4, 6\), but should be \(4, 5\): .* \(B\*H, L, S\) = \(6, 4, 5\)"),
    ("3-D attn_mask of the wrong size", {}, lambda m: m(x(B, L, E), x(B, S, E), x(B, S, E), attn_mask=bools(H, L, S)),
     r"3D attn_mask is \(2, 4, 5\), but should be \(6, 4, 5\)"),
    ("is_causal with need_weights keeps checking the mask", {},
     lambda m: m(x(B, L, E), x(B, L, E), x(B, L, E), attn_mask=bools(L, L + 1), is_causal=True),
     r"2D attn_mask is \(4, 5\), but should be \(4, 4\)"),
    ("key batch differs from query batch", {}, lambda m: m(x(B, L, E), x(B + 1, S, E), x(B + 1, S, E)),
     r"query has batch 3 but key and value have batch 4"),
    ("key_padding_mask with the wrong batch", {},
     lambda m: m(x(B, L, E), x(B, S, E), x(B, S, E), key_padding_mask=bools(B + 1, S)),
     r"\(B, S\) = \(3, 5\).* got \(4, 5\)"),
    ("key_padding_mask with the wrong length", {},
     lambda m: m(x(B, L, E), x(B, S, E), x(B, S, E), key_padding_mask=bools(B, S - 1)), r"got \(3, 4\)"),
    ("unbatched key_padding_mask with the wrong length", {},
     lambda m: m(x(L, E), x(S, E), x(S, E), key_padding_mask=bools(S + 1)), r"\(S,\) = \(5,\)"),
    # self-attention (query is key is value) in eval under no_grad takes torch's fused fast path, which
    # answers a bad key_padding_mask with RuntimeError instead of AssertionError
    ("self-attention, 1-D key_padding_mask", {}, lambda m: self_attention(m, key_padding_mask=bools(L)),
     r"to be `None` or 2-D but found 1-D tensor"),
    ("self-attention, key_padding_mask with the wrong batch", {},
     lambda m: self_attention(m, key_padding_mask=bools(B + 1, L)), r"got \(4, 4\)"),
    ("self-attention, 2-D attn_mask of the wrong size", {}, lambda m: self_attention(m, attn_mask=bools(L, L + 1)),
     r"2D attn_mask is \(4, 5\)"),
    ("double query, float weights", {},
     lambda m: m(x(B, L, E, dtype=torch.float64), x(B, S, E), x(B, S, E)), r"query has dtype torch.float64"),
]


def torch_error(make, call):
    """The exception torch raises for this input (the case is wrong if it raises none)."""
    try:
        call(make())
    except (AssertionError, RuntimeError) as error:
        return error
    raise AssertionError("torch accepted this input; the case does not test an error")


@pytest.mark.filterwarnings("ignore:Support for mismatched")
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("mode", ["train", "eval, no_grad"])
def test_each_bad_call_raises_an_attention_error_of_torchs_type(case, mode):
    _, kwargs, call, message = case
    training = mode == "train"

    def make(cls):
        torch.manual_seed(0)
        return cls(E, H, batch_first=True, **kwargs).train(training)

    with torch.set_grad_enabled(training):
        expected = torch_error(lambda: make(nn.MultiheadAttention), call)
        with pytest.raises(mh.AttentionError, match=message) as caught:
            call(make(MultiheadAttention))
    assert isinstance(caught.value, type(expected)), (type(caught.value).__mro__, type(expected))
    assert isinstance(caught.value, (CompatAssertionError, CompatRuntimeError, CompatPaddingMaskError))


def test_embed_dim_not_divisible_by_num_heads_is_torchs_assertion_error():
    with pytest.raises(AssertionError, match="divisible"):
        nn.MultiheadAttention(E, 3)
    with pytest.raises(CompatAssertionError, match=r"embed_dim=8 and num_heads=3 \(remainder 2\)") as caught:
        MultiheadAttention(E, 3)
    assert isinstance(caught.value, mh.AttentionError) and isinstance(caught.value, AssertionError)


def test_a_failed_call_leaves_the_module_unchanged():
    m = MultiheadAttention(E, H, batch_first=True, add_bias_kv=True)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    with pytest.raises(CompatRuntimeError):
        m(x(B, L, E), x(B, S, E), x(B, S, E), attn_mask=bools(L, S + 1))
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())


def test_a_bad_key_padding_mask_is_the_type_of_the_path_torch_takes():
    """torch answers it with AssertionError on its regular path and RuntimeError on its fused fast path (eval,
    no grad, batched self-attention, batch_first): the drop-in raises the one torch raises, never both."""
    for train, grad, self_attention, expected, other in ((True, True, True, AssertionError, RuntimeError),
                                                         (False, True, False, AssertionError, RuntimeError),
                                                         (False, False, True, RuntimeError, AssertionError)):
        pad = bools(B, S + 1)
        for module in (nn.MultiheadAttention(E, H, batch_first=True), MultiheadAttention(E, H, batch_first=True)):
            module.train(train)
            q = x(B, S, E)
            args = (q, q, q) if self_attention else (x(B, L, E), q, q)
            with torch.set_grad_enabled(grad), pytest.raises(expected) as caught:
                module(*args, key_padding_mask=pad)
            assert not isinstance(caught.value, other), (type(module).__module__, train, grad, self_attention)
            if isinstance(module, MultiheadAttention):
                assert isinstance(caught.value, CompatPaddingMaskError)


@torch.no_grad()
def test_is_causal_without_a_mask_is_refused_where_torchs_fast_path_drops_the_hint():
    """Deliberately different: torch's fused path (eval, no grad, self-attention) ignores is_causal and
    attends to every key; the drop-in raises as torch's regular path does."""
    theirs = nn.MultiheadAttention(E, H, batch_first=True).eval()
    q = x(B, L, E)
    out, _ = theirs(q, q, q, is_causal=True, need_weights=False)
    torch.testing.assert_close(out, theirs(q, q, q, need_weights=False)[0])  # not causal at all
    with pytest.raises(CompatRuntimeError, match="attn_mask is required"):
        MultiheadAttention(E, H, batch_first=True).eval()(q, q, q, is_causal=True, need_weights=False)
