"""Every bad input raises AttentionError saying what was expected and what came."""
from __future__ import annotations

import pytest
import torch
from torch import nn

import multihead as mh

q4 = torch.randn(2, 4, 5, 8)
k4 = torch.randn(2, 4, 5, 8)
mod = mh.MultiHeadAttention(8, 2)
x = torch.randn(2, 5, 8)


def attn(q=q4, k=k4, v=k4, mask=None, **kw):
    return mh.attention(q, k, v, mask, **kw)


CATALOGUE = [
    # module construction
    ("embed not divisible", lambda: mh.MultiHeadAttention(10, 3), "not divisible by num_heads=3"),
    ("zero heads", lambda: mh.MultiHeadAttention(8, 0), "num_heads must be a positive int"),
    ("float embed", lambda: mh.MultiHeadAttention(8.0, 2), "embed_dim must be a positive int"),
    ("kv heads not dividing", lambda: mh.MultiHeadAttention(12, 6, num_kv_heads=4), "positive divisor of num_heads=6"),
    ("negative head_dim", lambda: mh.MultiHeadAttention(8, 2, head_dim=-1), "head_dim must be a positive int"),
    ("bad dropout", lambda: mh.MultiHeadAttention(8, 2, dropout=1.5), "dropout must be a probability"),
    ("unknown backend", lambda: mh.MultiHeadAttention(8, 2, backend="flash9"), "backend must be 'auto' or one of"),
    ("batch_first not bool", lambda: mh.MultiHeadAttention(8, 2, batch_first="no"), "batch_first must be True or False; got 'no'"),
    ("causal not bool", lambda: mh.MultiHeadAttention(8, 2, causal=None), "causal must be True or False; got None"),
    ("bad bias key", lambda: mh.MultiHeadAttention(8, 2, bias={"query": False}), "bias keys must be among"),
    ("bad bias type", lambda: mh.MultiHeadAttention(8, 2, bias="yes"), "bias must be a bool or a dict"),
    ("bool head count", lambda: mh.MultiHeadAttention(16, num_heads=True), "num_heads must be a positive int; got True"),
    ("bool kv heads", lambda: mh.MultiHeadAttention(16, 4, num_kv_heads=True), "positive divisor of num_heads=4"),
    ("bool window", lambda: mh.MultiHeadAttention(16, 4, window=True), "window must be a positive int"),
    ("bool softcap", lambda: mh.MultiHeadAttention(16, 4, softcap=True), "softcap must be a positive finite number"),
    ("rope and alibi", lambda: mh.MultiHeadAttention(16, 4, rope=mh.RoPE(4), alibi=True), "choose one"),
    ("rope not a RoPE", lambda: mh.MultiHeadAttention(16, 4, rope=True), "rope must be an mh.RoPE"),
    # flags and numbers: real bools for flags, never bools for numbers
    ("causal string", lambda: attn(causal="false"), "causal must be True or False; got 'false' (str)"),
    ("forward causal string", lambda: mod(x, causal="no"), "causal must be True or False; got 'no'"),
    ("causal tensor", lambda: attn(causal=torch.tensor([True, False])), "causal must be True or False; got a tensor"),
    ("scale bool", lambda: attn(scale=True), "scale must be a positive finite number; got True"),
    ("dropout bool", lambda: attn(dropout=False), "dropout must be a probability in [0, 1); got False"),
    ("softcap zero", lambda: attn(softcap=0.0), "softcap must be a positive finite number"),
    ("sinks shape", lambda: attn(sinks=torch.zeros(3)), "sinks must have shape (H=4,)"),
    ("sinks not a tensor", lambda: attn(sinks=[0.0] * 4), "sinks must be a float tensor"),
    ("meta lengths", lambda: attn(mask=mh.Mask.lengths(torch.tensor([3, 4], device="meta"))), "mask is on meta"),
    ("window size", lambda: mh.Mask.window(0), "Mask.window size must be a positive int"),
    ("alibi slopes shape", lambda: attn(mask=mh.Mask.alibi(torch.ones(3))), "expected (H=4,)"),
    ("alibi int slopes", lambda: mh.Mask.alibi(torch.ones(4, dtype=torch.long)), "float slopes of shape (H,)"),
    ("segments float", lambda: mh.Mask.segments(torch.zeros(2, 5)), "must be integer (B, L)"),
    ("segments shape", lambda: attn(mask=mh.Mask.segments(torch.zeros(2, 4, dtype=torch.long))), "expected (2, 5)"),
    ("lengths bool", lambda: mh.Mask.lengths(torch.tensor([True, False])), "integer counts"),
    # module forward
    ("wrong feature size", lambda: mod(torch.randn(2, 5, 7)), "must have 8 features"),
    ("wrong rank", lambda: mod(torch.randn(2, 3, 5, 8)), "must be (B, L, features)"),
    ("key value length", lambda: mod(x, torch.randn(2, 5, 8), torch.randn(2, 6, 8)), "same batch and length"),
    ("query key batch", lambda: mod(x, torch.randn(3, 5, 8), torch.randn(3, 5, 8)), "query has batch 2"),
    ("module dtype", lambda: mod(x.double()), "convert one of them with .to()"),
    ("module raw mask", lambda: mod(x, mask=torch.ones(5, 5)), "mask must be a multihead.Mask"),
    ("module mask shape", lambda: mod(x, mask=mh.Mask.keep(torch.ones(3, 8, 9, dtype=torch.bool))),
     "mask shape (3, 8, 9) cannot broadcast to (B=2, H=2, Lq=5, Lk=5)"),
    ("not a tensor", lambda: mod([[1.0] * 8]), "query must be a torch.Tensor"),
    # functional
    ("q rank", lambda: attn(q=torch.randn(2, 5, 8)), "q must have 4 dims (B, H, L, D)"),
    ("mixed dtypes", lambda: attn(k=k4.double(), v=k4.double()), "must share one dtype"),
    ("integer inputs", lambda: attn(q4.long(), k4.long(), k4.long()), "must be floating point"),
    ("head dim", lambda: attn(k=torch.randn(2, 4, 5, 6), v=torch.randn(2, 4, 5, 6)), "share the head dim D"),
    ("gqa heads", lambda: attn(k=torch.randn(2, 3, 5, 8), v=torch.randn(2, 3, 5, 8)), "multiple of key/value heads Hkv=3"),
    ("k v length", lambda: attn(v=torch.randn(2, 4, 6, 8)), "k and v must agree on (B, Hkv, Lk)"),
    ("batch", lambda: attn(k=torch.randn(3, 4, 5, 8), v=torch.randn(3, 4, 5, 8)), "q has batch 2 but k/v have batch 3"),
    ("mixed devices", lambda: attn(k=k4.to("meta"), v=k4.to("meta")), "must be on one device; got cpu, meta, meta"),
    ("mask device", lambda: attn(mask=mh.Mask.keep(torch.ones(5, 5, dtype=torch.bool, device="meta"))),
     "mask is on meta but the inputs are on cpu"),
    ("raw tensor mask", lambda: attn(mask=torch.ones(5, 5, dtype=torch.bool)), "Mask.keep(t) (True = attend)"),
    ("mask shape", lambda: attn(mask=mh.Mask.block(torch.zeros(7, 5, dtype=torch.bool))), "cannot broadcast to (B=2, H=4, Lq=5, Lk=5)"),
    ("mask rank", lambda: attn(mask=mh.Mask.keep(torch.ones(1, 2, 4, 5, 5, dtype=torch.bool))), "cannot broadcast"),
    ("lengths too long", lambda: attn(mask=mh.Mask.lengths(torch.tensor([3, 6]))), "valid_lens must be <= Lk=5"),
    ("lengths wrong batch", lambda: attn(mask=mh.Mask.lengths(torch.tensor([3, 2, 1]))), "does not match (B=2,)"),
    ("query lengths too long", lambda: attn(mask=mh.Mask.lengths(torch.tensor([3, 2]), query_lens=torch.tensor([9, 1]))),
     "query_lens must be <= Lq=5"),
    ("bad scale", lambda: attn(scale=-1.0), "scale must be a positive finite number"),
    ("bad dropout", lambda: attn(dropout=1.0), "dropout must be a probability"),
    ("unknown backend", lambda: attn(backend="cuda-magic"), "backend must be 'auto' or one of"),
    # mask constructors
    ("negative lengths", lambda: mh.Mask.lengths(torch.tensor([2, -1])), "valid_lens must be >= 0"),
    ("lengths rank", lambda: mh.Mask.lengths(torch.ones(2, 3, 4)), "valid_lens must have shape (B,) or (B, Lq)"),
    ("fractional lengths", lambda: mh.Mask.lengths(torch.tensor([1.5, 2.0])), "whole numbers"),
    ("bool lengths", lambda: mh.Mask.lengths(torch.tensor([True, False])), "integer counts"),
    ("query lengths count", lambda: mh.Mask.lengths(torch.tensor([1, 2]), query_lens=torch.tensor([1])), "one per batch element"),
    ("keep non 0/1", lambda: mh.Mask.keep(torch.tensor([0.0, 0.5])), "bool tensor or 0/1 values"),
    ("block non 0/1", lambda: mh.Mask.block(torch.tensor([[2, 0]])), "bool tensor or 0/1 values"),
    ("additive ints", lambda: mh.Mask.additive(torch.tensor([0, 1])), "expects a floating tensor"),
    ("additive nan", lambda: mh.Mask.additive(torch.tensor([0.0, float("nan")])), "finite values or -inf"),
    ("key padding rank", lambda: mh.Mask.key_padding(torch.zeros(2, 1, 5, dtype=torch.bool)), "expects shape (B, Lk)"),
    ("causal align", lambda: mh.Mask.causal("bottom"), "align must be one of"),
    # conversion
    ("unrecognised module", lambda: mh.MultiHeadAttention.from_module(nn.Sequential(nn.Linear(4, 4))), "cannot recognise"),
    ("not a module", lambda: mh.MultiHeadAttention.from_module("attention"), "expects a torch.nn.Module"),
    ("misspelt hint", lambda: mh.MultiHeadAttention.from_module(nn.MultiheadAttention(8, 2), num_head=2), "unknown hints ['num_head']"),
    ("add_bias_kv", lambda: mh.MultiHeadAttention.from_module(nn.MultiheadAttention(8, 2, add_bias_kv=True)), "add_bias_kv"),
]


@pytest.mark.parametrize("name,call,fragment", CATALOGUE, ids=[c[0] for c in CATALOGUE])
def test_bad_input_raises_attention_error_with_message(name, call, fragment):
    with pytest.raises(mh.AttentionError) as info:
        call()
    assert fragment in str(info.value)


def test_attention_error_is_a_value_error():
    assert issubclass(mh.AttentionError, ValueError)


def test_catalogue_is_large_enough():
    assert len(CATALOGUE) >= 30


# --- messages that point at the right thing -------------------------------------------------------

def test_a_batch_length_heads_layout_is_recognised_and_the_transpose_named():
    q, k = torch.randn(2, 10, 12, 64), torch.randn(2, 12, 12, 64)  # (B, L, H, D) with Lq=10, Lk=12
    with pytest.raises(mh.AttentionError, match=r"\(B, L, H, D\).*transpose\(1, 2\)"):
        mh.attention(q, k, k)


@pytest.mark.parametrize("keyword, points_to", [("attn_mask", "Mask.block"), ("key_padding_mask", "Mask.key_padding")])
def test_torch_mask_keywords_on_the_module_point_to_mask_and_compat(keyword, points_to):
    attn = mh.MultiHeadAttention(16, 2)
    with pytest.raises(TypeError, match=points_to) as caught:
        attn(torch.randn(1, 3, 16), **{keyword: torch.zeros(1, 3, dtype=torch.bool)})
    assert isinstance(caught.value, mh.AttentionError)
    assert "multihead.compat.MultiheadAttention" in str(caught.value)


def test_a_key_padding_mask_of_the_wrong_shape_is_reported_in_the_shape_the_user_passed():
    q = torch.randn(2, 2, 5, 8)
    with pytest.raises(mh.AttentionError, match=r"Mask.key_padding mask has shape \(2, 7\); expected \(B=2, Lk=5\)"):
        mh.attention(q, q, q, mh.Mask.key_padding(torch.zeros(2, 7, dtype=torch.bool)))
