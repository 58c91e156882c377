"""Every build of the C++ decode kernel (native, x86-64-v3, portable) against float64, the ISA each
reports, and the rule that picks the kernel or the plain-torch form per ISA (cpu/choice.py).

Each build is made once per source (cached in the build folder like the native one): about 8 s of
CPU time each the first time."""
from __future__ import annotations

import functools
import importlib.util
import json
from pathlib import Path

import pytest
import torch

import multihead as mh
from multihead.backends.cpu import build as decode_build, choice as decode_choice
from multihead.backends.decode.quantized_numerics import kernel_step
from multihead.backends.decode.ranges import key_ranges
from multihead.backends.decode.step import describe_step
from multihead.bench import machine
from multihead.bench.suites import read_share
from multihead.caches.quantized import Quantized, quantize

N = 200  # keys: 12 whole tiles of 16 and 8 left over
MEASUREMENTS = Path(__file__).resolve().parent.parent / "benchmarks" / "decode-isa.json"
# (query rows per kv head as heads G x new rows Lq, kv heads, D, Dv): every row grouping of the tiles
CASES = [(1, 1, 2, 128, 64), (2, 1, 2, 64, 96), (1, 3, 2, 96, 64), (5, 1, 1, 128, 128), (7, 1, 1, 64, 64),
         (16, 1, 1, 576, 512)]


@pytest.fixture(scope="module", params=list(decode_build.BUILDS))
def build(request):
    """(name, Kernel) of one build that runs on this CPU."""
    name = request.param
    if not decode_build.runs_here(name):
        pytest.skip(f"this CPU cannot run the {name} build")
    kernel, why = decode_build.variant(name)
    assert kernel is not None, why  # the machines the project supports have a compiler
    return name, kernel


def test_each_build_reports_the_path_it_runs(build):
    name, kernel = build
    expected = {"native": decode_build.isa(), "x86-64-v3": "avx2"}.get(name)
    assert kernel.isa() == expected if expected else kernel.isa().startswith("portable")


def _step(kernel, q, k, v, mask, softcap=None, sinks=None):
    B, H, Lq, _ = q.shape
    lo, hi, qpos, slopes = key_ranges(mask, B, H, Lq, k.shape[2], "cpu")
    empty = torch.empty(0)
    return kernel.decode_step(q.contiguous(), k, v, lo, hi, qpos, empty if slopes is None else slopes.float(),
                              empty if sinks is None else sinks, q.shape[-1] ** -0.5, softcap or 0.0)


@functools.cache
def _matrix(dtype: torch.dtype) -> list[tuple]:
    """The decode matrix in `dtype`, made once for all builds: (q, k, v, mask, extra, float64 reference,
    same-dtype reference) per case. Rows per kv head 1, 2, 3, 5, 7, 16; D 64 to 576 with Dv != D; ragged
    lengths with an empty sequence, a window, a NaN query row and NaN keys past the lengths (never
    read); then ALiBi with softcap and sinks."""
    cases = []
    for G, Lq, Hkv, D, Dv in CASES:
        g = torch.Generator().manual_seed(G * D + Dv)
        H = G * Hkv
        q = torch.randn(3, H, Lq, D, generator=g).to(dtype)
        k = (2 * torch.randn(3, Hkv, N, D, generator=g)).to(dtype)
        v = (2 * torch.randn(3, Hkv, N, Dv, generator=g)).to(dtype)
        masked = mh.Mask.lengths(torch.tensor([N, 150, 0])) & mh.Mask.causal("bottom_right") \
            & mh.Mask.window(100, "bottom_right")
        alibi = mh.Mask.causal("bottom_right") & mh.Mask.alibi(torch.linspace(0.5, 0.01, H), "bottom_right")
        nan_q, nan_k, nan_v = q.clone(), k.clone(), v.clone()
        nan_q[1, 0, 0] = float("nan")  # one query row of NaN: its output row is NaN, no other
        nan_k[1, :, 150:], nan_v[1, :, 150:] = float("nan"), float("nan")  # past sequence 1's length
        for inputs, mask, extra in (((nan_q, nan_k, nan_v), masked, {}),
                                    ((q, k, v), alibi, {"softcap": 4.0, "sinks": torch.linspace(-1.0, 2.0, H)})):
            wide = {name: t.double() if isinstance(t, torch.Tensor) else t for name, t in extra.items()}
            ref = mh.attention(*(t.double() for t in inputs), mask, backend="math", **wide)
            same = mh.attention(*inputs, mask, backend="math", **extra)
            cases.append((inputs, mask, extra, ref, same))
    return cases


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_each_build_matches_float64_on_the_decode_matrix(build, dtype):
    """Every case of _matrix within twice the same-dtype reference's drift of float64, NaN where it is."""
    _, kernel = build
    for (q, k, v), mask, extra, ref, same in _matrix(dtype):
        out = _step(kernel, q, k, v, mask, **extra)
        where = (tuple(q.shape), v.shape[-1], sorted(extra))
        assert out.dtype == dtype and out.shape == ref.shape, where
        assert torch.equal(out.isnan(), ref.isnan()), where
        finite = ~ref.isnan()
        error = (out.double() - ref)[finite].abs().max().item()
        assert error <= 2 * (same.double() - ref)[finite].abs().max().item() + 1e-5, (where, error)


@pytest.mark.parametrize("kv_dtype", [torch.int8, torch.float8_e4m3fn], ids=["int8", "fp8"])
def test_each_build_matches_float64_over_quantized_codes(build, kv_dtype):
    """The quantized step (decode_quant_step.h) of every build on the decode matrix's cases, keys and values
    quantized per token and head: within twice the fp32 reference's drift of float64 over the numbers the
    codes stand for, NaN where it is (a NaN key's NaN scale; keys past the lengths are never read)."""
    _, kernel = build
    for (q, k, v), mask, extra, _, _ in _matrix(torch.float32):
        keys, values = Quantized(*quantize(k, kv_dtype), kv_dtype), Quantized(*quantize(v, kv_dtype), kv_dtype)
        wide_k, wide_v = keys.numbers(torch.float64), values.numbers(torch.float64)
        wide = {name: t.double() if isinstance(t, torch.Tensor) else t for name, t in extra.items()}
        ref = mh.attention(q.double(), wide_k, wide_v, mask, backend="math", **wide)
        same = mh.attention(q, wide_k.float(), wide_v.float(), mask, backend="math", **extra)
        B, H, Lq, D = q.shape
        lo, hi, qpos, slopes = key_ranges(mask, B, H, Lq, k.shape[2], "cpu")
        out = kernel_step(kernel, q, keys, values, lo, hi, qpos, D ** -0.5, extra.get("softcap"), slopes,
                          extra.get("sinks"))
        where = (tuple(q.shape), v.shape[-1], sorted(extra))
        assert torch.equal(out.isnan(), ref.isnan()), where
        finite = ~ref.isnan()
        error = (out.double() - ref)[finite].abs().max().item()
        assert error <= 2 * (same.double() - ref)[finite].abs().max().item() + 1e-5, (where, error)


@pytest.mark.parametrize("K, N_out", [(128, 512), (512, 128), (40, 300)])
def test_each_build_latent_products_match_float64(build, K, N_out):
    """The absorbed MLA step's products (latent_products.h) in every build: bf16 weights, fp32 sums."""
    _, kernel = build
    g = torch.Generator().manual_seed(K)
    x = torch.randn(4, 2, K, generator=g)  # (H, M, K)
    w_fold = torch.randn(4, K, N_out, generator=g).bfloat16()
    w_unfold = torch.randn(4, N_out, K, generator=g).bfloat16()
    for w, exact in ((w_fold, x.double() @ w_fold.double()), (w_unfold, x.double() @ w_unfold.double().mT)):
        out = kernel.latent_product(w, x, w is w_fold)
        assert out.shape == (4, 2, N_out)
        assert (out.double() - exact).abs().max().item() <= 1e-4 * exact.abs().max().item()


def test_the_choice_names_the_faster_form_of_the_committed_measurements():
    """decode_choice.FASTER holds, per ISA build and dtype, the form benchmarks/decode-isa.json measured
    faster (mean read share over its contexts), and nothing that file did not measure; for the AVX2 build, the
    form decode-isa-avx2.json measured faster with torch held to AVX2 on the same machine."""
    rows = json.loads(MEASUREMENTS.read_text())["rows"]
    held = json.loads(MEASUREMENTS.with_name("decode-isa-avx2.json").read_text())
    assert held["machine"]["cpu_capability"] == "AVX2"  # torch itself ran its AVX2 code there
    rows = [r for r in rows if r["isa"] != "avx2" and r["form"] != "plain-torch form"] \
        + [r for r in held["rows"] if r["isa"] == "avx2"] \
        + [dict(r, only="avx2") for r in held["rows"] if r["form"] == "plain-torch form"] \
        + [dict(r, only="other") for r in rows if r["form"] == "plain-torch form"]
    shares: dict[tuple[str, str, str], list[float]] = {}
    for r in rows:
        if r["form"] == "kernel":
            shares.setdefault((r["isa"], r["dtype"], decode_choice.KERNEL), []).append(r["share"])
    for r in rows:  # the plain-torch form as torch runs it beside each build: AVX2-held for the AVX2 build
        if r["form"] == "plain-torch form":
            for isa in {key[0] for key in shares if (key[0] == "avx2") == (r["only"] == "avx2")}:
                shares.setdefault((isa, r["dtype"], decode_choice.PLAIN), []).append(r["share"])
    measured = {(isa, dtype) for isa, dtype, _ in shares}
    assert measured == set(decode_choice.FASTER)
    for isa, dtype in measured:
        mean = {form: sum(shares[isa, dtype, form]) / len(shares[isa, dtype, form])
                for form in (decode_choice.KERNEL, decode_choice.PLAIN)}
        assert decode_choice.FASTER[isa, dtype] == max(mean, key=mean.get), (isa, dtype, mean)


def test_dispatch_says_which_build_runs_and_a_form_measured_slower_does_not_run(monkeypatch):
    q = torch.randn(1, 8, 1, 64)
    k, v = torch.randn(1, 2, 100, 64), torch.randn(1, 2, 100, 64)
    mask = mh.Mask.causal("bottom_right")
    isa = decode_build.isa()
    assert f"C++ decode kernel ({isa} build)" in mh.dispatch(q, k, v, mask).detail
    monkeypatch.setitem(decode_choice.FASTER, (isa, "fp32"), decode_choice.PLAIN)
    said = describe_step(torch.float32, "4 query rows per kv head")
    assert said.startswith("plain torch") and f"measured faster than the C++ decode kernel's {isa} build" in said
    calls = []
    monkeypatch.setattr(decode_build.kernel(), "decode_step", lambda *a: calls.append(a))
    torch.testing.assert_close(mh.attention(q, k, v, mask, backend="decode"),
                               mh.attention(q, k, v, mask, backend="math"), atol=1e-5, rtol=1e-5)
    assert not calls  # the plain-torch form ran


def test_the_isa_script_times_every_build_here_and_records_the_machine(tmp_path):
    """benchmarks/decode_isa.py (the evidence behind FASTER) on tiny sizes: every build this CPU runs, the
    plain-torch form and the machine's vector ISA land in its JSON."""
    spec = importlib.util.spec_from_file_location("decode_isa", MEASUREMENTS.parent / "decode_isa.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    result = script.main(["--tiny", "--rounds", "1", "--out", str(tmp_path / "isa.json")])
    forms = {(r["form"], r["build"], r["isa"]) for r in result["rows"]}
    here = {name for name in decode_build.BUILDS if decode_build.runs_here(name)}
    assert {("kernel", name, decode_build.variant(name)[0].isa()) for name in here} <= forms
    assert ("plain-torch form", "", "") in forms
    assert result["machine"]["decode_isa"] == decode_build.isa() and result["machine"]["cpu_flags"]
    assert json.loads((tmp_path / "isa.json").read_text())["rows"] == result["rows"]


def test_the_decode_bench_names_the_build_that_ran():
    assert machine.describe()["decode_isa"] == decode_build.isa()
    assert read_share.label("sdpa", torch.float32) == "sdpa"
    assert read_share.label("decode", torch.bfloat16) == f"decode, {decode_build.isa()} build"



def test_the_kernel_refuses_layouts_it_cannot_read_before_reading_them():
    """decode_calls.Kernel passes addresses: a tensor of another dtype, shape or layout is refused first."""
    kernel = decode_build.kernel()
    q, k, v = torch.randn(1, 4, 1, 32), torch.randn(1, 2, 70, 32), torch.randn(1, 2, 70, 32)
    lo, hi, qpos, _ = key_ranges(None, 1, 4, 1, 70, "cpu")
    empty = torch.empty(0)
    good = (q, k, v, lo, hi, qpos, empty, empty, 0.1, 0.0)
    assert kernel.decode_step(*good).shape == (1, 4, 1, 32)
    for position, bad in ((1, k.half()), (1, k.transpose(2, 3)), (0, q.transpose(1, 2)), (2, v[:, :1]),
                          (3, lo.int()), (4, hi[:, :0]), (6, torch.ones(3))):
        with pytest.raises(ValueError, match="decode kernel"):
            kernel.decode_step(*good[:position], bad, *good[position + 1:])
    w = torch.randn(2, 16, 8).bfloat16()
    with pytest.raises(ValueError, match="latent product"):
        kernel.latent_product(w.float(), torch.randn(2, 1, 16), True)
    with pytest.raises(ValueError, match="share K"):
        kernel.latent_product(w, torch.randn(2, 1, 15), True)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_build_reads_listed_rows_as_float64_does(build, dtype):
    """decode_listed (Mask.sparse's step): each row reads only the cache slots it lists, in any order, with
    sinks and softcap; a row listing nothing gives 0. Against float64 attention over the same rows."""
    _, kernel = build
    g = torch.Generator().manual_seed(3)
    for G, Hkv, D, Dv, K in ((16, 1, 128, 128, 40), (3, 2, 33, 17, 19), (2, 2, 64, 96, 5)):
        B, H = 3, G * Hkv
        q = torch.randn(B, H, 1, D, generator=g).to(dtype)
        k, v = torch.randn(B, Hkv, N, D, generator=g).to(dtype), torch.randn(B, Hkv, N, Dv, generator=g).to(dtype)
        idx = torch.stack([torch.randperm(N, generator=g)[:K] for _ in range(B)])  # (B, K), unsorted
        count = torch.tensor([K, K // 2, 0])
        sinks = torch.randn(H, generator=g)
        out = kernel.decode_listed(q, k, v, idx, count, sinks, D ** -0.5, 20.0)
        for b in range(B):
            rows = idx[b, :count[b]]
            if not len(rows):
                assert torch.equal(out[b], torch.zeros_like(out[b]))
                continue
            args = (k[b:b + 1, :, rows], v[b:b + 1, :, rows])
            ref = mh.attention(q[b:b + 1].double(), *(t.double() for t in args), softcap=20.0, sinks=sinks.double(),
                               backend="math")
            same = mh.attention(q[b:b + 1], *args, softcap=20.0, sinks=sinks.to(dtype), backend="math")
            drift = (same.double() - ref).abs().max().item()
            assert (out[b:b + 1].double() - ref).abs().max().item() <= 2 * drift + 1e-5, (G, D, b)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_each_build_skips_free_and_repeated_listed_slots(build, dtype):
    """decode_listed reads each distinct slot >= 0 once: -1 (none) and a slot listed again weigh nothing, in a
    sorted list (the kernel reads it as it is) and an unsorted one (sorted first). Against float64."""
    _, kernel = build
    g = torch.Generator().manual_seed(5)
    B, H, Hkv, D, Dv, K = 3, 4, 2, 64, 48, 70  # K > one block of listed rows, so repeats straddle blocks
    q = torch.randn(B, H, 1, D, generator=g).to(dtype)
    k, v = torch.randn(B, Hkv, N, D, generator=g).to(dtype), torch.randn(B, Hkv, N, Dv, generator=g).to(dtype)
    idx = torch.randint(-1, N, (B, K), generator=g)
    idx[:, 1::3] = idx[:, 0::3][:, :idx[:, 1::3].shape[1]]  # every third slot repeats the one before it
    idx[1] = idx[1].sort().values  # row 1 sorted (free slots first), rows 0 and 2 in any order
    idx[2, :] = -1
    idx[2, 5:9] = 7  # row 2: one key, listed four times among free slots
    out = kernel.decode_listed(q, k, v, idx, torch.full((B,), K), torch.empty(0), D ** -0.5, 0.0)
    assert torch.equal(kernel.decode_listed(q, k, v, idx, None, None, D ** -0.5, 0.0), out)  # None: all K, no sinks
    for b in range(B):
        rows = idx[b].unique()
        rows = rows[rows >= 0]
        ref = mh.attention(q[b:b + 1].double(), k[b:b + 1, :, rows].double(), v[b:b + 1, :, rows].double(),
                           backend="math")
        same = mh.attention(q[b:b + 1], k[b:b + 1, :, rows], v[b:b + 1, :, rows], backend="math")
        drift = (same.double() - ref).abs().max().item()
        assert (out[b:b + 1].double() - ref).abs().max().item() <= 2 * drift + 1e-5, b
