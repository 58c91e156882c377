"""The C++ module's entry points as custom ops (cpu/ops.py): each through the checked wrapper, under torch.compile
(dynamic shapes, full graph) and against float64, and each op's schema and fake implementation (opcheck)."""
from __future__ import annotations

import pytest
import torch

from multihead.backends.cpu import build as decode_build, ops
from multihead.backends.cpu.calls import Kernel
from multihead.caches.quantized import quantize

N, H, HKV, D, DV = 2048, 8, 2, 64, 64
pytestmark = pytest.mark.skipif(decode_build.kernel() is None, reason="the C++ decode kernel is not built here")


def _inputs(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(2, H, 1, D, generator=g)
    k, v = torch.randn(2, HKV, N, D, generator=g), torch.randn(2, HKV, N, DV, generator=g)
    hi = torch.tensor([[N], [1500]])
    return q, k, v, torch.zeros_like(hi), hi, (hi - 1).float()


def _attend(q, k, v, lo, hi, sinks=None):
    """(out, lse) float64 of q over k[lo:hi], v (GQA), sinks joining the denominator."""
    G, j = q.shape[1] // k.shape[1], torch.arange(k.shape[2])
    s = q.double() @ k.double().repeat_interleave(G, 1).transpose(-1, -2) / D ** 0.5
    s = s.masked_fill(~((j >= lo[:, None, :, None]) & (j < hi[:, None, :, None])), float("-inf"))
    vv = v.double().repeat_interleave(G, 1)
    if sinks is not None:
        s = torch.cat([s, sinks.double().view(1, -1, 1, 1).expand(*s.shape[:3], 1)], -1)
        vv = torch.cat([vv, vv.new_zeros(vv.shape[0], vv.shape[1], 1, vv.shape[3])], 2)
    lse = torch.logsumexp(s, -1)
    return torch.exp(s - lse[..., None]) @ vv, lse


def _close(out, ref, tol=2e-5):
    assert (out.double() - ref).abs().max().item() <= tol * ref.abs().max().item()


def _compiled(fn):
    return torch.compile(fn, dynamic=True, fullgraph=True, backend="aot_eager")


def test_every_entry_point_is_a_method_of_the_wrapper_and_an_op():
    """One checked wrapper (Kernel) and a custom op for each C++ entry point (decode_step's C++ entry serves the
    float and the quantized ops: its kind argument says which keys it reads)."""
    built = decode_build.kernel().module
    entries = {name for name in dir(built) if not name.startswith("_") and name not in ("Step", "isa")}
    assert entries == set(ops.OPS) - {"decode_quantized"}
    assert all(callable(getattr(Kernel, name)) for name in ops.OPS)
    assert all(hasattr(torch.ops.multihead, name) for name in ops.OPS)


def test_decode_step_op_with_lse():
    q, k, v, lo, hi, qpos = _inputs()
    sinks, empty = torch.linspace(-1, 1, H), torch.empty(0)
    ref, ref_lse = _attend(q, k, v, lo, hi, sinks)
    fn = _compiled(lambda q, k, v: ops.call("decode_step", q, k, v, lo, hi, qpos, empty, sinks, D ** -0.5, 0.0, True))
    for out, lse in (fn(q, k, v), ops.call("decode_step", q, k, v, lo, hi, qpos, empty, sinks, D ** -0.5, 0.0, True)):
        _close(out, ref)
        assert (lse.double() - ref_lse).abs().max().item() <= 1e-5


@pytest.mark.parametrize("kind", [torch.int8, torch.float8_e4m3fn], ids=["int8", "fp8"])
def test_decode_quantized_op(kind):
    q, k, v, lo, hi, qpos = _inputs(1)
    (kc, ks), (vc, vs) = quantize(k, kind), quantize(v, kind)
    kc, vc = (t.view(kind) for t in (kc, vc))
    ref, _ = _attend(q, kc.double() * ks.double()[..., None], vc.double() * vs.double()[..., None], lo, hi)
    empty = torch.empty(0)
    fn = _compiled(lambda q: ops.call("decode_quantized", q, kc, vc, ks, vs, lo, hi, qpos, empty, empty, D ** -0.5,
                                      0.0, False)[0])
    _close(fn(q), ref)


def test_decode_listed_op():
    q, k, v, _, _, _ = _inputs(2)
    idx = torch.stack([torch.arange(0, N, 3), torch.arange(N - 1, 0, -3)]).contiguous()  # (2, K) slots
    idx[1, 5] = -1  # skipped
    keep = torch.zeros(2, N, dtype=torch.bool)
    for b in range(2):
        keep[b, idx[b][idx[b] >= 0]] = True
    G = H // HKV
    s = q.double() @ k.double().repeat_interleave(G, 1).transpose(-1, -2) / D ** 0.5
    ref = torch.softmax(s.masked_fill(~keep[:, None, None], float("-inf")), -1) @ v.double().repeat_interleave(G, 1)
    fn = _compiled(lambda q: ops.call("decode_listed", q, k, v, idx, None, None, D ** -0.5, 0.0))
    _close(fn(q), ref)


def test_latent_product_op():
    g = torch.Generator().manual_seed(3)
    x, w = torch.randn(4, 2, 128, generator=g), torch.randn(4, 128, 256, generator=g).bfloat16()
    fn = _compiled(lambda x: ops.call("latent_product", w, x, True))
    _close(fn(x), x.double() @ w.double(), 1e-5)


def test_keep_nan_rows_op():
    q = torch.randn(2, H, 3, D)
    q[1, 2, 0, 5] = float("nan")
    out = torch.zeros(2, H, 3, DV)

    def marked(out, q):
        ops.call("keep_nan_rows", out, q)
        return out

    got = _compiled(marked)(out.clone(), q)
    assert got.isnan().any(-1).nonzero().tolist() == [[1, 2, 0]] and got[1, 2, 0].isnan().all()


def test_each_op_passes_opcheck():
    """Schemas, fake implementations and aliasing of the ops, as torch.library.opcheck checks them."""
    q, k, v, lo, hi, qpos = _inputs(4)
    empty = torch.empty(0)
    (kc, ks), (vc, vs) = quantize(k, torch.int8), quantize(v, torch.int8)
    table = torch.arange(2 * N // 64, dtype=torch.int32).view(2, -1)
    kp = k.view(2, HKV, N // 64, 64, D).transpose(1, 2).reshape(-1, HKV, 64, D).contiguous()
    vp = v.view(2, HKV, N // 64, 64, DV).transpose(1, 2).reshape(-1, HKV, 64, DV).contiguous()
    x, w = torch.randn(4, 2, 128), torch.randn(4, 128, 256).bfloat16()
    cases = {
        "decode_step": (q, k, v, lo, hi, qpos, empty, empty, 0.125, 0.0, True),
        "decode_quantized": (q, kc, vc, ks, vs, lo, hi, qpos, empty, empty, 0.125, 0.0, False),
        "decode_paged": (q, kp, vp, table, lo, hi, qpos, empty, empty, 0.125, 0.0, None, None, True),
        "decode_listed": (q, k, v, torch.arange(0, N, 7).expand(2, -1).contiguous(), None, None, 0.125, 0.0),
        "latent_product": (w, x, True),
        "keep_nan_rows": (torch.zeros(2, H, 1, DV), q),
    }
    for name, args in cases.items():
        torch.library.opcheck(ops.OPS[name], args, test_utils=("test_schema", "test_faketensor"))
