"""from_module by naming alone: small modules written here in each public convention, and the errors.

The classes below are not the textbook's: they only share its attribute names, which is all a
converter may look at. Sources with a forward are compared output-for-output and gradient-for-gradient;
the others against helpers.reference_mha (plain float64 loops) on the source's own weights.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import multihead as mh
from helpers import assert_same_forward_backward, randn64, reference_mha

B, L, E, H = 2, 5, 12, 3


@pytest.fixture(autouse=True)
def _seeded():
    torch.manual_seed(0)


def heads_first(x, num_heads):
    """(B, L, H*D) -> (B, H, L, D)."""
    return x.unflatten(-1, (num_heads, -1)).transpose(1, 2)


class FusedCausalSelfAttention(nn.Module):
    """nanoGPT's layout: c_attn Linear(E, 3E) holds q, k, v side by side; c_proj; n_head; causal."""

    def __init__(self, n_embd, n_head, bias=True):
        super().__init__()
        self.n_head = n_head
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.attn_dropout = nn.Dropout(0.0)

    def forward(self, x):
        q, k, v = self.c_attn(x).split(x.shape[-1], dim=2)  # 3 x (B, L, E)
        q, k, v = (heads_first(t, self.n_head) for t in (q, k, v))  # (B, H, L, D)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, L, D)
        return self.c_proj(y.transpose(1, 2).flatten(2))  # (B, L, E)


class BertLikeSelfAttention(nn.Module):
    """HF BertSelfAttention's names: query/key/value, num_attention_heads. Returns heads concatenated."""

    def __init__(self, hidden, heads, position_embedding_type="absolute"):
        super().__init__()
        self.num_attention_heads = heads
        self.position_embedding_type = position_embedding_type
        self.query, self.key, self.value = (nn.Linear(hidden, hidden) for _ in range(3))
        self.dropout = nn.Dropout(0.0)

    def forward(self, x, pad):
        q, k, v = (heads_first(p(x), self.num_attention_heads) for p in (self.query, self.key, self.value))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=~pad[:, None, None, :])  # (B, H, L, D)
        return y.transpose(1, 2).flatten(2)  # (B, L, E)


class BertLikeAttention(nn.Module):
    """HF BertAttention's names: self (the above) and output.dense (then LayerNorm, not attention's)."""

    def __init__(self, hidden, heads, **kwargs):
        super().__init__()
        self.self = BertLikeSelfAttention(hidden, heads, **kwargs)
        self.output = nn.Module()
        self.output.dense = nn.Linear(hidden, hidden)

    def forward(self, x, pad):
        return self.output.dense(self.self(x, pad))


class LectureHead(nn.Module):
    """One causal head as GPT lecture code writes it: key/query/value Linear(E, D, bias=False), a tril buffer."""

    def __init__(self, n_embd, head_size, block_size=8):
        super().__init__()
        self.key, self.query, self.value = (nn.Linear(n_embd, head_size, bias=False) for _ in range(3))
        self.register_buffer("tril", torch.tril(torch.ones(block_size, block_size)))  # 1 = may attend

    def forward(self, x):
        q, k, v = self.query(x), self.key(x), self.value(x)  # (B, L, D)
        scores = q @ k.transpose(-2, -1) * k.shape[-1] ** -0.5  # (B, L, L)
        scores = scores.masked_fill(self.tril[:x.shape[1], :x.shape[1]] == 0, float("-inf"))
        return scores.softmax(dim=-1) @ v  # (B, L, D)


class LectureMultiHead(nn.Module):
    """`heads` run one by one, concatenated, then `proj`: the stacked style with an output projection."""

    def __init__(self, n_embd, num_heads):
        super().__init__()
        self.heads = nn.ModuleList(LectureHead(n_embd, n_embd // num_heads) for _ in range(num_heads))
        self.proj = nn.Linear(n_embd, n_embd)

    def forward(self, x):
        return self.proj(torch.cat([head(x) for head in self.heads], dim=-1))  # (B, L, E)


class Named(nn.Module):
    """Linear layers under the given names (dotted names make submodules), plus attributes."""

    def __init__(self, layers: dict, **attributes):
        super().__init__()
        for path, layer in layers.items():
            owner = self
            *parents, leaf = path.split(".")
            for name in parents:
                if not hasattr(owner, name):
                    owner.add_module(name, nn.Module())
                owner = getattr(owner, name)
            owner.add_module(leaf, layer)
        for name, value in attributes.items():
            setattr(self, name, value)


def four(names, e=E, bias=True):
    """{q, k, v, out names: Linear(e, e)}."""
    return {name: nn.Linear(e, e, bias=bias) for name in names}


def check_against_reference(source, q, k, v, out, num_heads, *, batch_first=True, causal=False):
    """The conversion of `source` (hint causal=...) equals reference_mha on the layers q, k, v, out (or None)."""
    ours = mh.MultiHeadAttention.from_module(source.double(), causal=causal)
    assert ours.causal is causal
    x = randn64(B, L, q.in_features)
    keep = torch.ones(L, L, dtype=torch.bool).tril() if causal else None
    expected = reference_mha(x, x, x, wq=q.weight, wk=k.weight, wv=v.weight, bq=q.bias, bk=k.bias, bv=v.bias,
                             wo=None if out is None else out.weight, bo=None if out is None else out.bias,
                             num_heads=num_heads, keep_mask=keep)
    got = ours(x if batch_first else x.transpose(0, 1))
    torch.testing.assert_close(got if batch_first else got.transpose(0, 1), expected)
    return ours


# --- styles with a forward of their own -----------------------------------------------------------

@pytest.mark.parametrize("bias", [True, False])
def test_nanogpt_fused_c_attn_converts(bias):
    source = FusedCausalSelfAttention(E, H, bias=bias).double().eval()
    ours = mh.MultiHeadAttention.from_module(source)
    assert (ours.num_heads, ours.embed_dim, ours.causal) == (H, E, True)  # nanoGPT is always causal
    assert_same_forward_backward(source, ours, [randn64(B, L, E)])
    assert not mh.MultiHeadAttention.from_module(source, causal=False).causal


@pytest.mark.parametrize("cls", [BertLikeAttention, BertLikeSelfAttention])
def test_bert_names_convert_with_key_padding(cls):
    source = cls(E, H).double().eval()
    ours = mh.MultiHeadAttention.from_module(source)
    pad = torch.tensor([[False] * L, [False] * 3 + [True] * (L - 3)])  # (B, Lk), True = padding
    assert_same_forward_backward(lambda x: source(x, pad), lambda x: ours(x, mask=mh.Mask.key_padding(pad)),
                                 [randn64(B, L, E)])


def test_stacked_heads_with_an_output_projection_convert():
    source = LectureMultiHead(E, H).double().eval()
    ours = mh.MultiHeadAttention.from_module(source)
    assert (ours.num_heads, ours.head_dim, ours.causal) == (H, E // H, True)  # from the heads' tril buffers
    assert_same_forward_backward(source, ours, [randn64(B, L, E)])


# --- styles checked against the plain reference ---------------------------------------------------

@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("names, attrs, batch_first", [
    (("q_linear", "k_linear", "v_linear", "o_linear"), {"num_heads": H}, True),
    (("Wq", "Wk", "Wv", "Wo"), {"num_heads": H}, True),
    (("W_q", "W_k", "W_v", "W_o"), {"h": H}, True),  # the Annotated Transformer calls it h
    (("query.linear", "key.linear", "value.linear", "output"), {"heads": H}, False),
    (("W_query", "W_key", "W_value", "out_proj"), {"num_heads": H}, True),  # LLMs-from-scratch
])
def test_each_naming_style_converts(names, attrs, batch_first, bias):
    source = Named(four(names, bias=bias), **attrs)
    layers = [source.get_submodule(name) for name in names]
    ours = check_against_reference(source, *layers, H, batch_first=batch_first)
    assert ours.batch_first is batch_first
    assert all((proj.bias is not None) is bias for proj in (ours.q_proj, ours.k_proj, ours.v_proj, ours.out_proj))


def test_single_causal_head_without_a_head_count_is_one_head():
    source = Named(four(("W_query", "W_key", "W_value")))
    ours = check_against_reference(source, source.W_query, source.W_key, source.W_value, None, 1, causal=True)
    assert ours.num_heads == 1 and ours.out_proj.bias is None


@pytest.mark.parametrize("buffer, causal", [
    (torch.ones(6, 6).triu(1), True),  # document 001: 1 = future key
    (torch.ones(6, 6, dtype=torch.bool).tril().view(1, 1, 6, 6), True),  # nanoGPT's bias: 1 = may attend
    (torch.ones(6, 6).tril(-1), False),  # not a causal mask (the diagonal is blocked)
    (torch.ones(6, 6), False),
    (torch.ones(1, 1), False),  # too small to tell
])
def test_causal_mask_buffers_are_recognised(buffer, causal):
    source = Named(four(("q_linear", "k_linear", "v_linear", "o_linear")), num_heads=H)
    source.register_buffer("mask", buffer)
    assert mh.MultiHeadAttention.from_module(source).causal is causal


def test_head_count_comes_from_the_config():
    source = Named(four(("q_linear", "k_linear", "v_linear", "o_linear")), config=Named({}, n_head=4))
    assert mh.MultiHeadAttention.from_module(source).num_heads == 4


def test_hints_set_the_head_count_and_the_layout():
    source = Named(four(("query.linear", "key.linear", "value.linear", "output")), heads=H)
    ours = mh.MultiHeadAttention.from_module(source, num_heads=4, batch_first=True)
    assert (ours.num_heads, ours.batch_first) == (4, True)


@pytest.mark.parametrize("how", ["modules", "names", "pairs"])
def test_explicit_projections_for_unknown_names(how):
    source = Named(four(("a", "b", "c", "d")))
    layers = {"modules": (source.a, source.b, source.c, source.d), "names": ("a", "b", "c", "d"),
              "pairs": tuple((m.weight, m.bias) for m in (source.a, source.b, source.c, source.d))}[how]
    ours = mh.MultiHeadAttention.from_module(source, num_heads=H, **dict(zip(("q", "k", "v", "out"), layers)))
    x = torch.randn(B, L, E)
    expected = reference_mha(x, x, x, num_heads=H, wq=source.a.weight, wk=source.b.weight, wv=source.c.weight,
                             wo=source.d.weight, bq=source.a.bias, bk=source.b.bias, bv=source.c.bias,
                             bo=source.d.bias)
    torch.testing.assert_close(ours(x).double(), expected, atol=1e-5, rtol=1e-5)


def test_explicit_projections_with_fewer_kv_heads():
    """q: 4 heads, k/v: 2 heads (GQA). Same as 4 full heads whose k/v rows repeat each kv head twice."""
    D = 3
    source = Named({"a": nn.Linear(E, 4 * D), "b": nn.Linear(E, 2 * D), "c": nn.Linear(E, 2 * D),
                    "d": nn.Linear(4 * D, E)})
    ours = mh.MultiHeadAttention.from_module(source, num_heads=4, num_kv_heads=2, q="a", k="b", v="c", out="d")
    assert (ours.num_heads, ours.num_kv_heads, ours.head_dim) == (4, 2, D)
    kv_head = torch.arange(4) // 2  # query head h reads kv head h // 2
    rows = (kv_head[:, None] * D + torch.arange(D)).flatten()  # (4*D,) rows of the (2*D, E) k/v weights
    widened = [(layer.weight[rows], layer.bias[rows]) for layer in (source.b, source.c)]
    full = mh.MultiHeadAttention.from_module(source, num_heads=4, q="a", k=widened[0], v=widened[1], out="d")
    x = torch.randn(B, L, E)
    torch.testing.assert_close(ours(x), full(x))


# --- errors ---------------------------------------------------------------------------------------

def test_unrecognised_module_names_what_it_found():
    source = nn.Sequential(nn.Linear(E, E), nn.ReLU(), nn.Linear(E, 4))
    with pytest.raises(mh.AttentionError, match=r"0: Linear\(12 -> 12\).*num_heads"):
        mh.MultiHeadAttention.from_module(source)


def test_missing_head_count_asks_for_num_heads():
    source = Named(four(("q_linear", "k_linear", "v_linear", "o_linear")))
    with pytest.raises(mh.AttentionError, match=r"q_linear: Linear\(12 -> 12\).*num_heads=\.\.\."):
        mh.MultiHeadAttention.from_module(source)
    assert mh.MultiHeadAttention.from_module(source, num_heads=2).num_heads == 2


def test_uninitialised_lazy_linear_asks_for_one_forward():
    source = Named({name: nn.LazyLinear(E, bias=False) for name in ("W_q", "W_k", "W_v", "W_o")}, num_heads=H)
    with pytest.raises(mh.AttentionError, match="uninitialised LazyLinear.*forward once"):
        mh.MultiHeadAttention.from_module(source)


@pytest.mark.parametrize("source, match", [
    (Named(four(("Wq", "Wk", "Wv", "Wo")), num_heads=5), "not divisible by num_heads=5"),
    (Named({"c_attn": nn.Linear(E, 2 * E + 1), "c_proj": nn.Linear(E, E)}, n_head=H), "3 x E"),
    (BertLikeAttention(E, H, position_embedding_type="relative_key"), "relative position"),
    (Named({"Wq": nn.Linear(E, E), "Wk": nn.Linear(E, 6), "Wv": nn.Linear(E, E), "Wo": nn.Linear(E, E)},
           num_heads=H), "key projection"),
])
def test_inconsistent_modules_say_why(source, match):
    with pytest.raises(mh.AttentionError, match=match):
        mh.MultiHeadAttention.from_module(source)


@pytest.mark.parametrize("source", [
    Named({**four(("q_linear", "k_linear", "v_linear", "o_linear")), "ffn": nn.Linear(E, 4 * E)}, num_heads=H),
    Named({**four(("W_query", "W_key", "W_value")), "gate": nn.Linear(E, E)}),
    Named({"c_attn": nn.Linear(E, 3 * E), "c_proj": nn.Linear(E, E), "mlp.fc": nn.Linear(E, E)}, n_head=H),
    Named({"heads": nn.ModuleList([Named(four(("W_query", "W_key", "W_value", "extra"), e=4))])}),
    Named({"heads": nn.ModuleList([Named(four(("W_query", "W_key", "W_value"), e=4))]), "lm_head": nn.Linear(4, 9)}),
], ids=["block", "gated-head", "gpt-block", "head-with-extra", "stack-with-extra"])
def test_extra_linear_layers_are_not_silently_dropped(source):
    with pytest.raises(mh.AttentionError, match="also has linear layers that attention does not use"):
        mh.MultiHeadAttention.from_module(source)


def test_an_extra_lazy_layer_is_described_without_an_input_size():
    source = Named({**four(("W_q", "W_k", "W_v", "W_o")), "extra": nn.LazyLinear(4)}, num_heads=H)
    with pytest.raises(mh.AttentionError, match=r"not use: extra \(\? -> 4\)"):
        mh.MultiHeadAttention.from_module(source)


@pytest.mark.parametrize("hints, match", [
    ({"q": "a", "num_heads": H}, r"missing \['k', 'v'\]"),
    ({"q": "a", "k": "b", "v": "c"}, "num_heads"),
    ({"q": "a", "k": "b", "v": "nope", "num_heads": H}, "no linear layer at that name"),
    ({"q": ("a",), "k": "b", "v": "c", "num_heads": H}, "linear layer or a \\(weight, bias\\) pair"),
])
def test_explicit_projection_errors(hints, match):
    with pytest.raises(mh.AttentionError, match=match):
        mh.MultiHeadAttention.from_module(Named(four(("a", "b", "c"))), **hints)


@pytest.mark.parametrize("hints, match", [
    ({"batch_first": "no"}, "batch_first must be True or False; got 'no'"),
    ({"causal": None}, "causal must be True or False; got None"),
    ({"num_heads": "4"}, "num_heads must be a positive int; got '4'"),
])
def test_hints_of_the_wrong_type_are_refused(hints, match):
    with pytest.raises(mh.AttentionError, match=match):
        mh.MultiHeadAttention.from_module(Named(four(("W_q", "W_k", "W_v", "W_o")), num_heads=H), **hints)


def test_stacked_heads_must_agree():
    uneven = Named({"heads": nn.ModuleList([Named(four(("W_query", "W_key", "W_value"), e=4)),
                                            Named({n: nn.Linear(4, 2) for n in ("W_query", "W_key", "W_value")})])})
    with pytest.raises(mh.AttentionError, match="differ in shape"):
        mh.MultiHeadAttention.from_module(uneven)
    mixed = Named({"heads": nn.ModuleList([Named(four(("W_query", "W_key", "W_value"), e=4)),
                                           Named(four(("q_linear", "k_linear", "v_linear"), e=4))])})
    with pytest.raises(mh.AttentionError, match=r"heads\[1\].*lacks"):
        mh.MultiHeadAttention.from_module(mixed)
    even = Named({"heads": nn.ModuleList([Named(four(("W_query", "W_key", "W_value"), e=4)) for _ in range(2)])})
    with pytest.raises(mh.AttentionError, match="stacks 2 heads"):
        mh.MultiHeadAttention.from_module(even, num_heads=3)
