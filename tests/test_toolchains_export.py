"""torch.export (a Mask as an argument, dynamic batch and length), torch.jit.trace, and ONNX export
(dynamo=True) run in onnxruntime: each equal to the eager module."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.export import Dim

import multihead as mh
from helpers import max_abs_diff

E, H = 32, 4


class WithMask(nn.Module):
    """module(x, mask=mask): the Mask is an input of the exported program."""

    def __init__(self, attn: nn.Module):
        super().__init__()
        self.attn = attn

    def forward(self, x, mask):
        return self.attn(x, mask=mask)


class WithPadding(nn.Module):
    """module(x, pad) with pad (B, L) bool, True = padding: plain tensors in, for ONNX and tracing."""

    def __init__(self, attn: nn.Module, causal: bool = False):
        super().__init__()
        self.attn, self.causal = attn, causal

    def forward(self, x, pad=None):
        mask = None if pad is None else mh.Mask.key_padding(pad)
        return self.attn(x, mask=mask, causal=self.causal)


def padding(B: int, L: int, seed: int) -> torch.Tensor:
    """(B, L) bool, True = padding; row 0 is all padding (a sequence with no key)."""
    lens = torch.randint(1, L + 1, (B,), generator=torch.Generator().manual_seed(seed))
    lens[0] = 0
    return torch.arange(L) >= lens[:, None]


def attention_module() -> mh.MultiHeadAttention:
    torch.manual_seed(0)
    return mh.MultiHeadAttention(E, H, num_kv_heads=2).eval()


@pytest.mark.parametrize("kind", ["key_padding", "lengths"])
def test_export_takes_a_mask_with_dynamic_batch_and_length(kind):
    mod = attention_module()
    batch, length = Dim("batch", min=1, max=64), Dim("length", min=2, max=256)
    make = {"key_padding": lambda B, L, s: mh.Mask.key_padding(padding(B, L, s)),
            "lengths": lambda B, L, s: mh.Mask.lengths((~padding(B, L, s)).sum(-1))}[kind]
    # A Mask flattens to its parts' tensors, in order (the padding as given, (B, L)): the spec lists them.
    mask_spec = {"key_padding": [{0: batch, 1: length}], "lengths": [{0: batch}]}[kind]
    program = torch.export.export(WithMask(mod), (torch.randn(3, 6, E), make(3, 6, 0)),
                                  dynamic_shapes=({0: batch, 1: length}, mask_spec))
    for B, L in [(3, 6), (5, 11), (1, 2)]:
        x, mask = torch.randn(B, L, E), make(B, L, B + L)
        assert max_abs_diff(program.module()(x, mask), mod(x, mask=mask)) < 1e-6


@pytest.mark.parametrize("causal", [False, True])
def test_jit_trace_follows_new_shapes(causal):
    mod = WithPadding(attention_module(), causal)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TracerWarnings on shape checks, and trace's deprecation notice
        traced = torch.jit.trace(mod, (torch.randn(3, 6, E), padding(3, 6, 0)))
    for B, L in [(3, 6), (2, 9)]:
        x, pad = torch.randn(B, L, E), padding(B, L, 1)
        assert max_abs_diff(traced(x, pad), mod(x, pad)) < 1e-6


def test_jit_trace_with_sinks_follows_new_shapes():
    torch.manual_seed(0)
    mod = mh.MultiHeadAttention(E, H, num_kv_heads=2, sinks=True).eval()
    nn.init.normal_(mod.sinks)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # TracerWarnings on shape checks, and trace's deprecation notice
        traced = torch.jit.trace(mod, (torch.randn(3, 6, E),))  # its check traces twice: the graphs must agree
    for B, L in [(3, 6), (2, 9)]:
        x = torch.randn(B, L, E)
        assert max_abs_diff(traced(x), mod(x)) < 1e-6


@pytest.mark.parametrize("listed", [False, True], ids=["decode step", "sparse step"])
def test_jit_trace_of_a_decode_step_replays_new_inputs(listed):
    """A one-row step over 96 keys, the shapes where the C++ decode kernel (or its listed-rows form) runs
    eagerly: traced, it keeps to torch's own ops, so replaying it on new tensors gives their attention."""
    g = torch.Generator().manual_seed(0)
    idx = torch.randint(0, 96, (1, 1, 12), generator=g)
    mask = mh.Mask.causal("bottom_right") & (mh.Mask.sparse(idx) if listed else mh.Mask.causal("bottom_right"))

    def step(q, k, v):
        return mh.attention(q, k, v, mask)

    def inputs():
        return torch.randn(1, 4, 1, 16, generator=g), torch.randn(1, 2, 96, 16, generator=g), \
            torch.randn(1, 2, 96, 16, generator=g)

    with warnings.catch_warnings(), torch.no_grad():
        warnings.simplefilter("ignore")  # TracerWarnings on shape checks, and trace's deprecation notice
        traced = torch.jit.trace(step, inputs())
        q, k, v = inputs()
        assert max_abs_diff(traced(q, k, v), step(q, k, v)) < 1e-5


# --- ONNX ----------------------------------------------------------------------------------------------

def onnx_session(module: nn.Module, args: tuple, folder):
    """Export with dynamo=True (opset 23, dynamic batch and length); (session, op types in the graph)."""
    onnx = pytest.importorskip("onnx")
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    batch, length = Dim("batch", min=1, max=64), Dim("length", min=2, max=256)
    shapes = tuple({0: batch, 1: length} for _ in args)
    path = folder / "attention.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module, args, str(path), dynamo=True, opset_version=23, dynamic_shapes=shapes,
                          verbose=False)
    ops = {node.op_type for node in onnx.load(str(path)).graph.node}
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"]), ops


@pytest.mark.models
@pytest.mark.parametrize("case", ["self_attention", "causal", "key_padding"])
def test_onnx_export_runs_in_onnxruntime_with_the_attention_op(case, tmp_path):
    mod = WithPadding(attention_module(), causal=case == "causal")
    example = (torch.randn(3, 6, E),) + ((padding(3, 6, 0),) if case == "key_padding" else ())
    session, ops = onnx_session(mod, example, tmp_path)
    assert "Attention" in ops, sorted(ops)  # the opset-23 Attention node, not a decomposition
    assert "Softmax" not in ops, sorted(ops)
    for B, L in [(3, 6), (5, 11), (1, 3)]:
        args = (torch.randn(B, L, E),) + ((padding(B, L, B * L),) if case == "key_padding" else ())
        feeds = {i.name: a.numpy() for i, a in zip(session.get_inputs(), args)}
        (out,) = session.run(None, feeds)
        expected = mod(*args).detach()
        assert max_abs_diff(torch.from_numpy(out), expected) < 1e-5
        if case == "key_padding":  # an all-padding sequence gives out_proj(0) = its bias, as in eager
            torch.testing.assert_close(torch.from_numpy(out[0]), mod.attn.out_proj.bias.expand(L, E).detach())


@pytest.mark.models
def test_onnx_export_with_sinks_runs_in_onnxruntime(tmp_path):
    """Sinks run on the CPU flash kernel's log-sum-exp in eager mode; an exported graph keeps the reference math."""
    torch.manual_seed(0)
    mod = mh.MultiHeadAttention(E, H, num_kv_heads=2, sinks=True).eval()
    nn.init.normal_(mod.sinks)
    session, _ = onnx_session(WithPadding(mod), (torch.randn(3, 6, E),), tmp_path)
    for B, L in [(3, 6), (2, 9)]:
        x = torch.randn(B, L, E)
        (out,) = session.run(None, {session.get_inputs()[0].name: x.numpy()})
        assert max_abs_diff(torch.from_numpy(out), mod(x).detach()) < 1e-5
