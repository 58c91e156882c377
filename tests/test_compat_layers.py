"""mh.compat.MultiheadAttention inside torch's own Transformer layers: the same outputs and gradients,
and exactly when torch's encoder fast path takes over without calling it."""
from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from helpers import max_abs_diff
from multihead.compat import MultiheadAttention

# torch warns when one call mixes a bool and a float mask; these tests mix them on purpose.
pytestmark = pytest.mark.filterwarnings("ignore:Support for mismatched")

E, H, L, S, B = 16, 4, 5, 7, 3
TOL = dict(atol=1e-5, rtol=1e-5)


def swap_attention(layer: nn.Module) -> nn.Module:
    """A copy of `layer` whose nn.MultiheadAttention modules are ours, with the same weights."""
    ours = copy.deepcopy(layer)
    for name in ("self_attn", "multihead_attn"):
        theirs = getattr(layer, name, None)
        if theirs is not None:
            replacement = MultiheadAttention(theirs.embed_dim, theirs.num_heads, dropout=theirs.dropout,
                                             batch_first=theirs.batch_first)
            replacement.load_state_dict(theirs.state_dict())
            setattr(ours, name, replacement)
    return ours.train(layer.training)


def count_calls(layer: nn.Module) -> list:
    calls = []
    for module in layer.modules():
        if isinstance(module, MultiheadAttention):
            module.register_forward_hook(lambda *args: calls.append(1))
    return calls


def run_layers(kind: str, batch_first: bool):
    """(inputs, call) for one encoder or decoder layer with causal and padding masks."""
    g = torch.Generator().manual_seed(2)
    shape = (lambda n: (B, n, E)) if batch_first else (lambda n: (n, B, E))
    tgt, memory = torch.randn(shape(L), generator=g), torch.randn(shape(S), generator=g)
    causal = nn.Transformer.generate_square_subsequent_mask(L)
    pad_tgt = torch.zeros(B, L, dtype=torch.bool)
    pad_tgt[1, -2:] = True
    pad_mem = torch.zeros(B, S, dtype=torch.bool)
    pad_mem[0, -3:] = True
    if kind == "encoder":
        return (tgt,), lambda layer, x: layer(x, src_mask=causal, src_key_padding_mask=pad_tgt, is_causal=True)
    return (tgt, memory), lambda layer, x, m: layer(x, m, tgt_mask=causal, tgt_key_padding_mask=pad_tgt,
                                                    memory_key_padding_mask=pad_mem, tgt_is_causal=True)


@pytest.mark.parametrize("kind", ["encoder", "decoder"])
@pytest.mark.parametrize("batch_first, norm_first", [(False, False), (True, True)])
def test_replacing_attention_in_torch_transformer_layers_keeps_outputs_and_gradients(kind, batch_first,
                                                                                    norm_first):
    torch.manual_seed(0)
    make = nn.TransformerEncoderLayer if kind == "encoder" else nn.TransformerDecoderLayer
    theirs = make(E, H, dim_feedforward=32, dropout=0.0, batch_first=batch_first, norm_first=norm_first)
    ours = swap_attention(theirs)
    calls = count_calls(ours)
    inputs, call = run_layers(kind, batch_first)
    results = []
    for layer in (theirs, ours):
        leaves = [t.clone().requires_grad_() for t in inputs]
        out = call(layer, *leaves)
        out.square().sum().backward()
        results.append((out, [t.grad for t in leaves], [p.grad for p in layer.parameters()]))
    assert len(calls) == (1 if kind == "encoder" else 2)  # our forward ran, once per attention
    torch.testing.assert_close(results[1][0], results[0][0], **TOL)
    for got, expected in zip(results[1][1] + results[1][2], results[0][1] + results[0][2]):
        torch.testing.assert_close(got, expected, **TOL)
    # eval, no grad: torch's encoder fast path may bypass forward (same result); with it off, ours runs
    theirs.eval(), ours.eval()
    calls.clear()
    with torch.no_grad():
        expected = call(theirs, *inputs)
        torch.backends.mha.set_fastpath_enabled(False)
        try:
            got = call(ours, *inputs)
        finally:
            torch.backends.mha.set_fastpath_enabled(True)
    assert calls and max_abs_diff(got, expected) < 1e-5


# --- torch's encoder fast path ---------------------------------------------------------------------------

class CountingAttention(MultiheadAttention):
    """The drop-in, counting its forward calls (a forward hook would itself turn torch's fast path off)."""

    calls = 0

    def forward(self, *args, **kwargs):
        self.calls += 1
        return super().forward(*args, **kwargs)


def encoder_pair(batch_first: bool = True):
    torch.manual_seed(0)
    theirs = nn.TransformerEncoderLayer(E, H, dim_feedforward=32, dropout=0.0, batch_first=batch_first)
    ours = copy.deepcopy(theirs)
    ours.self_attn = CountingAttention(E, H, batch_first=batch_first)
    ours.self_attn.load_state_dict(theirs.self_attn.state_dict())
    return theirs, ours


@pytest.mark.parametrize("situation", ["eval, no_grad", "eval, inference_mode", "eval, grad", "train, no_grad",
                                       "eval, no_grad, fast path off", "eval, no_grad, batch_first=False",
                                       "eval, no_grad, a forward hook"])
def test_encoder_fast_path_bypasses_the_drop_in_exactly_when_torch_takes_it(situation):
    """torch's nn.TransformerEncoderLayer fast path (eval, no autograd, batch_first ...) reads the drop-in's
    in_proj_weight and runs torch's fused kernel; forward is never called. Anywhere else forward runs."""
    theirs, ours = encoder_pair(batch_first="batch_first=False" not in situation)
    if situation.startswith("eval"):
        theirs.eval(), ours.eval()
    if "hook" in situation:
        ours.self_attn.register_forward_hook(lambda *args: None)
    x = torch.randn((B, L, E) if ours.self_attn.batch_first else (L, B, E))
    pad = torch.zeros(B, L, dtype=torch.bool)
    pad[1, -2:] = True
    contexts = {"eval, grad": torch.enable_grad, "eval, inference_mode": torch.inference_mode}
    context = contexts.get(situation, torch.no_grad)
    torch.backends.mha.set_fastpath_enabled("fast path off" not in situation)
    try:
        with context():
            expected, got = theirs(x, src_key_padding_mask=pad), ours(x, src_key_padding_mask=pad)
    finally:
        torch.backends.mha.set_fastpath_enabled(True)
    bypassed = situation in ("eval, no_grad", "eval, inference_mode")
    assert ours.self_attn.calls == (0 if bypassed else 1)
    if bypassed:  # both ran torch's fused kernel on the same weights; padded rows come back as zeros there
        torch.testing.assert_close(got, expected, atol=0, rtol=0)
    else:
        keep = ~pad.T[..., None] if not ours.self_attn.batch_first else ~pad[..., None]
        torch.testing.assert_close(got * keep, expected * keep, **TOL)


def test_decoder_layers_have_no_fast_path_so_the_drop_in_always_runs():
    torch.manual_seed(0)
    layer = nn.TransformerDecoderLayer(E, H, dim_feedforward=32, dropout=0.0, batch_first=True).eval()
    for name in ("self_attn", "multihead_attn"):
        counting = CountingAttention(E, H, batch_first=True)
        counting.load_state_dict(getattr(layer, name).state_dict())
        setattr(layer, name, counting)
    with torch.no_grad():
        layer(torch.randn(B, L, E), torch.randn(B, S, E))
    assert layer.self_attn.calls == layer.multihead_attn.calls == 1
