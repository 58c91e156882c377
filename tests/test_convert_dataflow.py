"""The dataflow role finder: every linear map applied to a module's parameters during one call (whatever code
applies it), the pieces its output is used in, and the roles attention's maths gives them."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from multihead.convert.dataflow import Flow
from multihead.convert.leaf_layout import leaf_layout
from multihead.convert.flow_roles import map_pieces, name_roles

B, L, E, H, HKV, D = 2, 5, 16, 4, 2, 4


class CustomLinear(nn.Module):
    def __init__(self, i, o, bias=True):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(o, i))
        self.bias = nn.Parameter(torch.randn(o)) if bias else None

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


class Products(nn.Module):
    """One map per way of applying a parameter."""

    def __init__(self):
        super().__init__()
        self.lin = CustomLinear(E, 8)
        self.right = nn.Parameter(torch.randn(E, 8))  # x @ W
        self.stored = nn.Parameter(torch.randn(8, E))  # x @ W.T
        self.bias = nn.Parameter(torch.randn(8))
        self.heads = nn.Parameter(torch.randn(H, E, D))  # einsum, heads first
        self.back = nn.Parameter(torch.randn(H, D, E))  # einsum over two indices
        self.conv = nn.Parameter(torch.randn(E, 8))  # torch.addmm, GPT-2's Conv1D
        self.conv_bias = nn.Parameter(torch.randn(8))

    def forward(self, x):
        a = self.lin(x)
        b = x @ self.right
        c = x @ self.stored.T + self.bias
        d = torch.einsum("bld,hde->bhle", x, self.heads)
        e = torch.einsum("bhle,hem->blm", d, self.back)
        f = torch.addmm(self.conv_bias, x.view(-1, E), self.conv).view(B, L, 8)
        return a, b, c, d, e, f


def test_every_way_of_applying_a_parameter_is_a_linear_map_with_its_weight_and_bias():
    module, x = Products(), torch.randn(B, L, E)
    with Flow(module, {"x": x}) as flow:
        outputs = module(x)
    names = [m.name for m in flow.maps]
    assert names == ["lin", "right", "stored", "heads", "back", "conv"]
    for found, got in zip(flow.maps, outputs):
        weight, bias = found.weight_bias()
        read = found.read.transpose(1, 2).reshape(B, L, -1) if found.name == "back" else found.read
        want = F.linear(read.reshape(B, L, -1), weight, bias)  # (B, L, O), heads first for the einsums
        if got.dim() == 4:  # (B, H, L, D) -> (B, L, H*D)
            got = got.transpose(1, 2).reshape(B, L, -1)
        torch.testing.assert_close(want, got.reshape(B, L, -1))
    assert flow.maps[2].bias.name == "bias" and flow.maps[5].bias.name == "conv_bias"
    assert [m.reads.kind for m in flow.maps] == ["input"] * 4 + ["map", "input"]


def test_weights_are_differentiable_views_of_the_parameters():
    module, x = Products(), torch.randn(B, L, E)
    with Flow(module, {"x": x}) as flow:
        module(x)
    weight, _ = flow.maps[3].weight_bias()  # heads (H, E, D) -> rows h*D + d
    weight.sum().backward()
    assert torch.equal(module.heads.grad, torch.ones(H, E, D))
    assert torch.equal(weight[D:2 * D], module.heads[1].T)


class FusedGQA(nn.Module):
    def __init__(self, style: str, rotary: int | None = None):
        super().__init__()
        self.qkv = nn.Linear(E, (H + 2 * HKV) * D, bias=False)
        self.out = nn.Linear(H * D, E)
        self.style, self.rotary = style, rotary

    def forward(self, x):
        qkv = self.qkv(x)
        if self.style == "split":
            q, k, v = qkv.split([H * D, HKV * D, HKV * D], dim=-1)
        else:  # slices
            q, k, v = qkv[..., :H * D], qkv[..., H * D:(H + HKV) * D], qkv[..., (H + HKV) * D:]
        q, k, v = (t.view(B, L, -1, D).transpose(1, 2) for t in (q, k, v))
        if self.rotary:
            q, k = (torch.cat((t[..., :self.rotary] * 2.0, t[..., self.rotary:]), -1) for t in (q, k))
        k, v = (t.repeat_interleave(H // HKV, dim=1) for t in (k, v))
        if self.style == "split":
            y = F.scaled_dot_product_attention(q, k, v)
        else:
            y = (q @ k.transpose(-2, -1)).softmax(-1) @ v
        return self.out(y.transpose(1, 2).reshape(B, L, -1))


@pytest.mark.parametrize("style", ["split", "slices"])
@pytest.mark.parametrize("rotary", [None, 2])
def test_an_uneven_fused_split_gives_three_pieces_named_by_the_maths(style, rotary):
    module, x = FusedGQA(style, rotary), torch.randn(B, L, E)
    with Flow(module, {"x": x}) as flow:
        module(x)
    pieces = map_pieces(flow.records)
    assert [p.rows.tolist() for p in pieces[0]] == [list(range(16)), list(range(16, 24)), list(range(24, 32))]
    assert [p.split for p in pieces[0]] == [rotary, rotary, None]
    roles = name_roles(flow.records, pieces)
    assert [(p.map, int(p.rows[0])) for p in roles.q + roles.k + roles.v] == [(0, 0), (0, 16), (0, 24)]
    assert roles.out == 1


def test_a_per_head_view_with_unbind_gives_strided_pieces():
    class PerHead(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(E, 3 * E)

        def forward(self, x):
            q, k, v = self.qkv(x).view(B, L, H, 3, D).permute(3, 0, 2, 1, 4).unbind(0)
            return torch.einsum("bhqk,bhkd->bhqd", torch.einsum("bhqd,bhkd->bhqk", q, k).softmax(-1), v)

    module, x = PerHead(), torch.randn(B, L, E)
    with Flow(module, {"x": x}) as flow:
        module(x)
    pieces = map_pieces(flow.records)[0]
    layout = torch.arange(3 * E).view(H, 3, D)
    assert [p.rows.tolist() for p in pieces] == [layout[:, i].reshape(-1).tolist() for i in range(3)]
    roles = name_roles(flow.records, {0: pieces})
    assert (roles.q, roles.k, roles.v, roles.out) == ([pieces[0]], [pieces[1]], [pieces[2]], None)


def test_heads_computed_one_by_one_and_concatenated_keep_the_fused_pieces_apart():
    """The cat of the heads' outputs sits after products: it joins no pieces (RoPE's cat joins before one)."""
    class HeadLoop(nn.Module):
        def __init__(self):
            super().__init__()
            self.qkv = nn.Linear(E, 3 * E)

        def forward(self, x):
            q, k, v = self.qkv(x).chunk(3, dim=-1)
            heads = [(q[..., h * D:(h + 1) * D] @ k[..., h * D:(h + 1) * D].mT).softmax(-1) @ v[..., h * D:(h + 1) * D]
                     for h in range(H)]
            return torch.cat(heads, dim=-1)

    module, x = HeadLoop(), torch.randn(B, L, E)
    with Flow(module, {"x": x}) as flow:
        module(x)
    assert [p.rows.tolist() for p in map_pieces(flow.records)[0]] == [
        list(range(h * D, (h + 1) * D)) for h in range(3 * H)]  # each head's slice of q, k and v: its own piece


def test_an_einsum_whose_output_puts_keys_first_still_names_the_queries():
    class KeysFirst(nn.Module):
        def __init__(self):
            super().__init__()
            self.q, self.k, self.v = (nn.Parameter(torch.randn(E, E)) for _ in range(3))

        def forward(self, x):
            q, k, v = x @ self.q, x @ self.k, x @ self.v
            scores = torch.einsum("bkd,bqd->bqk", k, q)  # keys written first
            return scores.softmax(-1) @ v

    module, x = KeysFirst(), torch.randn(B, L, E)
    with Flow(module, {"x": x}) as flow:
        module(x)
    roles = name_roles(flow.records, map_pieces(flow.records))
    assert [p.map for p in roles.q + roles.k + roles.v] == [0, 1, 2]


def test_views_of_inputs_keep_their_tag_and_computed_tensors_do_not():
    x = torch.randn(B, L, E)
    module = nn.Linear(E, E)
    with Flow(module, {"x": x}) as flow:
        seq_first = x.transpose(0, 1).contiguous().float()
        normed = F.layer_norm(x, (E,))
    assert (flow.origin(seq_first).kind, flow.origin(seq_first).source) == ("input", "x")
    assert torch.equal(flow.origin(seq_first).shadow, torch.arange(E).expand(L, B, E))
    assert flow.origin(normed).kind == "derived" and ("input", "x") in flow.origin(normed).ancestry


def test_a_cache_write_uses_the_rows_it_stores():
    class Cached(nn.Module):
        def __init__(self):
            super().__init__()
            self.k = nn.Linear(E, E)
            self.register_buffer("cache", torch.zeros(B, 8, E))

        def forward(self, x):
            self.cache[:, :L] = self.k(x)
            return self.cache[:, :L]

    module = Cached()
    with Flow(module, {"x": torch.randn(B, L, E)}) as flow:
        module(torch.randn(B, L, E))
    assert [u.op for u in flow.uses] == ["__setitem__"] and len(flow.uses[0].rows) == E


def test_leaf_layout_knows_a_learners_linear_from_conv1d_and_nn_linear():
    class Conv1D(nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.randn(E, 8))
            self.bias = nn.Parameter(torch.randn(8))

        def forward(self, x):
            return x @ self.weight + self.bias

    assert leaf_layout(CustomLinear(E, 8)) == leaf_layout(CustomLinear(E, E, bias=False)) == "linear"
    assert leaf_layout(Conv1D()) == "conv1d"
    assert leaf_layout(nn.Linear(E, 8)) is None and leaf_layout(nn.LayerNorm(E)) is None
