"""torch.compile: every Mask kind traces as one graph (no breaks), gives eager's values and gradients,
and does not recompile on repeated shapes, nor across lengths with dynamic=True.

Compiles are slow on small machines, so most tests trace with dynamo and run the graph through
AOTAutograd ("aot_eager", which also traces the backward); one test runs the real compiler (inductor).
"""
from __future__ import annotations

import pytest
import torch
from torch._dynamo.testing import CompileCounter, CompileCounterWithBackend

import multihead as mh
from helpers import MASK_KINDS, mask_of_kind

# inductor's own use of torch.jit.script_method announces that API's deprecation; nothing of ours.
pytestmark = pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")

H, HKV, D = 4, 2, 8  # grouped-query: 4 query heads share 2 key/value heads


def qkv(B: int, Lq: int, Lk: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, H, Lq, D, generator=g), torch.randn(B, HKV, Lk, D, generator=g),
            torch.randn(B, HKV, Lk, D, generator=g))


def attend(q, k, v, mask):
    return mh.attention(q, k, v, mask)


def forward_and_grads(fn, q, k, v, mask):
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v)]
    out = fn(*leaves, mask)
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    return out.detach(), torch.autograd.grad(out, leaves, upstream)


def dead_rows(mask, B: int, Lq: int, Lk: int) -> torch.Tensor:
    """(B, H or 1, Lq) bool: query rows that keep no key under `mask`."""
    keep, _ = mask.materialize(B, H, Lq, Lk)
    if keep is None:
        return torch.zeros(1, 1, Lq, dtype=torch.bool)
    return ~torch.broadcast_to(keep, (B, H, Lq, Lk)).any(-1)


@pytest.mark.parametrize("kind", MASK_KINDS)
def test_attention_is_one_graph_with_no_breaks(kind):
    B, Lq, Lk = 3, 6, 8
    explanation = torch._dynamo.explain(attend)(*qkv(B, Lq, Lk), mask_of_kind(kind, B, H, Lq, Lk))
    assert (explanation.graph_count, explanation.graph_break_count) == (1, 0), explanation.break_reasons


@pytest.mark.parametrize("kind", MASK_KINDS)
def test_attention_compiles_fullgraph_equal_to_eager_without_recompiles(kind):
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(attend, backend=counter, fullgraph=True)
    B, Lq, Lk = 3, 6, 8
    for seed in (0, 1):  # new values, same shapes: the second call must reuse the graph
        q, k, v = qkv(B, Lq, Lk, seed)
        mask = mask_of_kind(kind, B, H, Lq, Lk, seed)
        out, grads = forward_and_grads(compiled, q, k, v, mask)
        out_eager, grads_eager = forward_and_grads(attend, q, k, v, mask)
        torch.testing.assert_close(out, out_eager, atol=1e-6, rtol=1e-6)
        for got, expected in zip(grads, grads_eager):
            torch.testing.assert_close(got, expected, atol=1e-6, rtol=1e-6)
        dead = dead_rows(mask, B, Lq, Lk)
        assert torch.equal(out.masked_select(dead[..., None]), torch.zeros(int(dead.sum()) * D))
    assert counter.frame_count == 1


@pytest.mark.parametrize("kind", MASK_KINDS)
def test_dynamic_shapes_compile_once_across_lengths(kind):
    torch._dynamo.reset()
    counter = CompileCounter()
    compiled = torch.compile(attend, backend=counter, fullgraph=True, dynamic=True)
    # Sizes chosen distinct from H, HKV and D, so that no size is specialised by coincidence.
    for B, Lq, Lk in [(3, 6, 7), (3, 9, 11), (5, 11, 13), (5, 13, 6)]:
        q, k, v = qkv(B, Lq, Lk)
        mask = mask_of_kind(kind, B, H, Lq, Lk)
        torch.testing.assert_close(compiled(q, k, v, mask), attend(q, k, v, mask), atol=1e-6, rtol=1e-6)
    assert counter.frame_count == 1


def test_module_compiles_with_inductor_forward_and_backward():
    """The real compiler, on the module: causal with key padding, then lengths with padded queries."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    mod = mh.MultiHeadAttention(32, H, num_kv_heads=HKV)
    counter = CompileCounterWithBackend("inductor")
    compiled = torch.compile(mod, backend=counter, fullgraph=True)
    B, L = 3, 7
    pad = torch.arange(L) >= torch.tensor([7, 4, 0])[:, None]  # row 2 is all padding
    for mask in (mh.Mask.key_padding(pad) & mh.Mask.causal(),
                 mh.Mask.lengths(torch.tensor([7, 3, 0]), query_lens=torch.tensor([5, 3, 0]))):
        frames = counter.frame_count
        for seed in (0, 1):
            x = torch.randn(B, L, 32, generator=torch.Generator().manual_seed(seed))
            xs = [x.clone().requires_grad_() for _ in range(2)]
            outs = [compiled(xs[0], mask=mask), mod(xs[1], mask=mask)]
            torch.testing.assert_close(outs[0], outs[1], atol=1e-5, rtol=1e-5)
            assert torch.equal(outs[0][2], torch.zeros(L, 32) + mod.out_proj.bias)  # all-padding row: out_proj(0)
            mod.zero_grad()
            outs[0].square().sum().backward()
            compiled_grads = [p.grad.clone() for p in mod.parameters()]
            mod.zero_grad()
            outs[1].square().sum().backward()
            for got, expected in zip(compiled_grads + [xs[0].grad], [p.grad for p in mod.parameters()] + [xs[1].grad]):
                torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
        assert counter.frame_count == frames + 1  # one graph per mask structure, none for new values


def test_module_with_dynamic_shapes_compiles_once_across_batch_and_length():
    torch._dynamo.reset()
    torch.manual_seed(0)
    mod = mh.MultiHeadAttention(32, H, num_kv_heads=HKV).eval()
    counter = CompileCounter()
    compiled = torch.compile(mod, backend=counter, fullgraph=True, dynamic=True)
    for B, L in [(3, 6), (5, 9), (3, 13)]:
        x = torch.randn(B, L, 32)
        pad = torch.arange(L) >= torch.randint(0, L + 1, (B,))[:, None]
        mask = mh.Mask.key_padding(pad)
        torch.testing.assert_close(compiled(x, mask=mask, causal=True), mod(x, mask=mask, causal=True),
                                   atol=1e-6, rtol=1e-6)
    assert counter.frame_count == 1
