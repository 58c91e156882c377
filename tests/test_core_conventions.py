"""The ecosystem's conventions at the functional core: layout="bshd" (flash-attn's (B, L, H, D)), a backend
that declares what it takes (mh.register_backend, Capabilities) and serves a quantized cache's codes, Mask.of
for one's own parts, one word from mh.dispatch for a score_mod, and a quantized step that mh.dispatch explains,
capture_attention records and torch.compile keeps as a custom op."""
from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch

import multihead as mh
from multihead.backends.capabilities import Capabilities
from multihead.backends.dispatch import remove_backend
from multihead.caches.quantized import Quantized, quantize
from multihead.masks import Index, Part


def _qkv(Lq=300, Lk=300, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(2, 4, Lq, 16, generator=g).to(dtype), torch.randn(2, 2, Lk, 16, generator=g).to(dtype),
            torch.randn(2, 2, Lk, 16, generator=g).to(dtype))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"])
def test_layout_bshd_takes_and_gives_flash_attn_tensors(dtype):
    """(B, L, H, D) in, (B, L, H, Dv) out, equal to the (B, H, L, D) call; with Lq = Lk and GQA, where the wrong
    layout would run silently."""
    q, k, v = _qkv(dtype=dtype)
    mask = mh.Mask.lengths(torch.tensor([300, 120]))
    ref = mh.attention(q, k, v, mask, causal=True)
    out = mh.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), mask, causal=True, layout="bshd")
    assert out.shape == (2, 300, 4, 16)
    torch.testing.assert_close(out, ref.transpose(1, 2))
    out, lse = mh.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True, layout="bshd",
                            return_lse=True)
    assert lse.shape == (2, 4, 300)
    assert mh.dispatch(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), layout="bshd").backend == "sdpa"
    with pytest.raises(mh.AttentionError, match="layout must be one of"):
        mh.attention(q, k, v, layout="bsdh")


def test_layout_bshd_has_a_gradient():
    q, k, v = (t.requires_grad_() for t in _qkv(Lq=40, Lk=40))
    mh.attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), causal=True, layout="bshd").sum().backward()
    grads = [t.grad.clone() for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None
    mh.attention(q, k, v, causal=True).sum().backward()
    for t, g in zip((q, k, v), grads):
        torch.testing.assert_close(t.grad, g)


def test_a_score_mod_is_said_once():
    q, k, v = _qkv(Lq=8, Lk=8)
    decision = mh.dispatch(q, k, v, mh.Mask.score_mod(lambda s, b, h, i, j: s * 0.5))
    assert decision.backend == "math" and decision.codes["sdpa"] == "sdpa.scored"
    assert "reference math" not in decision.detail and "reference math" in decision.reasons["sdpa"]


@dataclass(frozen=True, eq=False)
class Even(Part):
    """Keys at even positions (a toy mask kind: residual, evaluated densely)."""

    def keep(self, ix: Index) -> torch.Tensor:
        return ix.k % 2 == 0  # (.., Lq, Lk)

    def fold(self, form) -> None:
        form.residual(self)

    def describe(self) -> str:
        return "even keys"


def test_mask_of_ones_own_parts():
    q, k, v = _qkv(Lq=8, Lk=8)
    mask = mh.Mask.of(Even()) & mh.Mask.causal()
    keep = (torch.arange(8) % 2 == 0) & torch.ones(8, 8, dtype=torch.bool).tril()
    torch.testing.assert_close(mh.attention(q, k, v, mask), mh.attention(q, k, v, mh.Mask.keep(keep)))
    with pytest.raises(mh.AttentionError, match="Mask.of takes mask parts"):
        mh.Mask.of(keep)


class DequantizingBackend:
    """A user's backend for a quantized cache: dequantizes the codes whole and runs the reference."""

    name = "dequantizing"
    capabilities = Capabilities(kv_forms=("quantized",), backward=False, dropout=False)

    def plan(self, p, auto=True):
        return None

    def run(self, p, plan):
        k, v = p.k.numbers(p.q.dtype), p.v.numbers(p.q.dtype)
        return mh.attention(p.q, k, v, mh.Mask(p.form.parts), scale=p.scale, backend="math")

    def describe(self, p, plan):
        return "dequantizes the cache whole"


def _quantized_step(Lk=2100, seed=3):
    q, k, v = _qkv(Lq=1, Lk=Lk, seed=seed)
    keys, values = (Quantized(*quantize(t, torch.int8), torch.int8) for t in (k, v))
    return q, keys, values, mh.Mask.lengths(torch.tensor([Lk, 1000])) & mh.Mask.causal("bottom_right")


def test_a_registered_backend_declares_the_quantized_form_and_serves_it():
    q, keys, values, mask = _quantized_step()
    mh.register_backend(DequantizingBackend(), before="decode")
    try:
        with torch.no_grad():
            decision = mh.dispatch(q, keys, values, mask)
            assert decision.backend == "dequantizing" and decision.codes["decode"] == "decode.kv-form"
            out = mh.attention(q, keys, values, mask)
        ref = mh.attention(q.double(), keys.numbers(torch.float64), values.numbers(torch.float64), mask)
        assert (out.double() - ref).abs().max().item() <= 1e-5
        assert mh.dispatch(*_qkv(Lq=1, Lk=100)).codes["dequantizing"] == "dequantizing.kv-form"
    finally:
        remove_backend("dequantizing")


def test_a_quantized_step_is_explained_recorded_and_compiled():
    q, keys, values, mask = _quantized_step()
    with torch.no_grad():
        decision = mh.dispatch(q, keys, values, mask)
        assert decision.backend == "quantized"
        assert set(decision.codes.values()) == {f"{name}.kv-form" for name in decision.codes}
        with mh.capture_attention() as record:
            out = mh.attention(q, keys, values, mask)
        assert len(record) == 1 and record[0].weights.shape == (2, 4, 1, 2100)
        assert not record[0].weights[1, :, :, 1000:].any()  # past sequence 1's length
        graphs = []

        def keep_graph(gm, inputs):
            graphs.append(gm.code)
            return gm.forward
        compiled = torch.compile(lambda q, c, s, vc, vs: mh.attention(
            q, Quantized(c, s, torch.int8), Quantized(vc, vs, torch.int8), mask), backend=keep_graph, dynamic=True)
        again = compiled(q, keys.codes, keys.scales, values.codes, values.scales)
    torch.testing.assert_close(again, out, atol=1e-5, rtol=1e-5)
    assert any("decode_quantized" in code for code in graphs)
    with pytest.raises(mh.AttentionError, match="no backward"):
        mh.attention(q.clone().requires_grad_(), keys, values, mask)
