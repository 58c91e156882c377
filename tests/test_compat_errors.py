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
    ("query 1-D", {}, lambda m: m(x(E), x(E), x(E)), r"query must be \(L, E\) unbatched .* got 1-D"),
    ("query 4-D", {}, lambda m: m(x(1, B, L, E), x(1, B, S, E), x(1, B, S, E)), r"got 4-D shape \(1, 3, 4, 8\)"),
    ("batched query, 2-D key", {}, lambda m: m(x(B, L, E), x(S, E), x(B, S, E)), r"key and value must be 3-D"),
    ("batched query, 2-D value", {}, lambda m: m(x(B, L, E), x(B, S, E), x(S, E)), r"value \(5, 8\)"),
    ("unbatched query, 3-D key", {}, lambda m: m(x(L, E), x(B, S, E), x(S, E)), r"must be 2-D too"),
    ("batched, 1-D key_padding_mask", {}, lambda m: m(x(B, L, E), x(B, S, E), x(B, S, E), key_padding_mask=bools(S)),
     r"key_padding_mask must be 2-D \(B, S\); got 1-D"),
    ("unbatched, 2-D key_padding_mask", {}, lambda m: m(x(L, E), x(S, E), x(S, E), key_padding_mask=bools(1, S)),
     r"key_padding_mask must be 1-D \(S,\); got 2-D"),
    ("1-D attn_mask", {}, lambda m: m(x(B, L, E), x(B, S, E), x(B, S, E), attn_mask=bools(S)),
     r"attn_mask must be 2-D \(L, S\) or 3-D"),
    ("4-D attn_mask", {}, lambda m: m(x(B, L, E), x(B, S, E), x(B, S, E), attn_mask=bools(B, H, L, S)),
     r"got 4-D shape"),
    ("unbatched, 3-D attn_mask with wrong heads", {},
     lambda m: m(x(L, E), x(S, E), x(S, E), attn_mask=bools(H + 1, L, S)),
     r"\(H, L, S\) = \(2, 4, 5\); got \(3, 4, 5\)"),
    ("integer attn_mask", {},
     lambda m: m(x(B, L, E), x(B, S, E), x(B, S, E), attn_mask=torch.zeros(L, S, dtype=torch.long)),
     r"attn_mask must be a bool tensor .* got dtype torch.int64"),
    ("integer key_padding_mask", {},
     lambda m: m(x(B, L, E), x(B, S, E), x(B, S, E), key_padding_mask=torch.zeros(B, S, dtype=torch.int32)),
     r"key_padding_mask must be a bool tensor"),
    ("is_causal=True without attn_mask", {}, lambda m: m(x(B, L, E), x(B, S, E), x(B, S, E), is_causal=True),
     r"attn_mask is required; got None"),
    ("query with wrong features", {}, lambda m: m(x(B, L, E + 1), x(B, S, E), x(B, S, E)),
     r"embed_dim=8 features .* got shape \(3, 4, 9\)"),
    ("key and value of different lengths", {}, lambda m: m(x(B, L, E), x(B, S, E), x(B, S + 1, E)),
     r"same shape .* key \(3, 5, 8\) and value \(3, 6, 8\)"),
    ("key and value with wrong features", {}, lambda m: m(x(B, L, E), x(B, S, E + 2), x(B, S, E + 2)),
     r"key must have kdim=8 features .* got shape \(3, 5, 10\)"),
    ("separate kdim/vdim: lengths differ", dict(kdim=3, vdim=5), lambda m: m(x(B, L, E), x(B, S, 3), x(B, S + 1, 5)),
     r"all but the last dim"),
    ("separate kdim/vdim: wrong key features", dict(kdim=3, vdim=5), lambda m: m(x(B, L, E), x(B, S, 4), x(B, S, 5)),
     r"kdim=3 features"),
    ("separate kdim/vdim: wrong value features", dict(kdim=3, vdim=5), lambda m: m(x(B, L, E), x(B, S, 3), x(B, S, 6)),
     r"vdim=5 features"),
    ("2-D attn_mask of the wrong size", {}, lambda m: m(x(B, L, E), x(B, S, E), x(B, S, E), attn_mask=bools(L, S + 1)),
     r"attn_mask must be \(L, S\) = \(4, 5\) or \(B\*H, L, S\) = \(6, 4, 5\); got \(4, 6\)"),
    ("3-D attn_mask of the wrong size", {}, lambda m: m(x(B, L, E), x(B, S, E), x(B, S, E), attn_mask=bools(H, L, S)),
     r"got \(2, 4, 5\)"),
    ("is_causal with need_weights keeps checking the mask", {},
     lambda m: m(x(B, L, E), x(B, L, E), x(B, L, E), attn_mask=bools(L, L + 1), is_causal=True), r"attn_mask must be"),
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
     r"must be 2-D \(B, S\); got 1-D"),
    ("self-attention, key_padding_mask with the wrong batch", {},
     lambda m: self_attention(m, key_padding_mask=bools(B + 1, L)), r"got \(4, 4\)"),
    ("self-attention, 2-D attn_mask of the wrong size", {}, lambda m: self_attention(m, attn_mask=bools(L, L + 1)),
     r"got \(4, 5\)"),
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


def test_a_bad_key_padding_mask_is_both_of_torchs_types():
    """torch answers it with AssertionError on its regular path and RuntimeError on its fast path."""
    m = MultiheadAttention(E, H, batch_first=True)
    with pytest.raises(CompatPaddingMaskError) as caught:
        m(x(B, L, E), x(B, S, E), x(B, S, E), key_padding_mask=bools(B, S + 1))
    assert all(isinstance(caught.value, t) for t in (mh.AttentionError, AssertionError, RuntimeError))


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
