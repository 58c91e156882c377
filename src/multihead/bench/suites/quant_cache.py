"""Quantized KV cache: one decode step over an int8 or fp8 (e4m3) cache against the same step over a bf16 cache.

A bf16 model (MultiHeadAttention, E = H * D, RoPE, no bias) with H = Hkv = 8 and D = 128 decodes one token
after N = 16384 cached ones, with new_cache(kv_dtype=None | torch.int8 | torch.float8_e4m3fn):
- the module step (projections, RoPE, the cache write, attention, out projection), interleaved rounds;
- the attention alone over each cache (what the step's attention reads), interleaved rounds.
Each cache holds the keys and values the model's own projections give for random hidden states (RoPE
applied), so that the codes see realistic magnitudes. Drift: each step's output against the output of
the same weights in fp32 over an fp32 cache of the same context, relative to that output's largest
value. Targets: the int8 step >= 1.5x faster than the bf16 step, and int8 and fp8 drift <= 2%.
The three caches together (about 130 MiB) exceed the CPU's last-level cache, and each call reads a
cache the other two calls of its round have pushed out.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

import multihead as mh
from multihead.backends.decode.step import kernel_build
from multihead.bench.results import SuiteResult, Target
from multihead.bench.suites.context import Context
from multihead.bench.timing import compare, ratio, ratio_range

GOALS = {"speed": 1.5, "drift": 0.02}
CACHES = {"bf16 cache": None, "int8 cache": torch.int8, "fp8 e4m3 cache": torch.float8_e4m3fn}
COLUMNS = ["case", "implementation", "ms", "GB/s", "x bf16 cache", "drift vs fp32 cache", "bytes per token", "runs"]


@dataclass(frozen=True)
class Sizes:
    context: int
    heads: int = 8
    head_dim: int = 128

    @classmethod
    def full(cls) -> Sizes:
        return cls(context=16384)

    @classmethod
    def quick(cls) -> Sizes:
        return cls(context=2048)


def filled(m: mh.MultiHeadAttention, context: torch.Tensor, kv_dtype, dtype: torch.dtype, headroom: int):
    """A cache of m's (in `dtype`) holding the keys and values of `context` (1, N, E), RoPE applied."""
    B, N, _ = context.shape
    H, D = m.num_kv_heads, m.head_dim
    cache = m.new_cache(B, N + headroom, dtype=dtype, kv_dtype=kv_dtype)
    x = context.to(dtype)
    k = m.k_proj(x).view(B, N, H, D).transpose(1, 2)  # (B, Hkv, N, D)
    v = m.v_proj(x).view(B, N, H, D).transpose(1, 2)
    _, k = m.rope(k, k, torch.arange(N))
    cache.append(k, v)
    return cache


def run(ctx: Context, s: Sizes) -> SuiteResult:
    N, H, D = s.context, s.heads, s.head_dim
    E = H * D
    result = SuiteResult("quant_cache", f"Quantized KV cache: one decode step, bf16 model E={E} H=Hkv={H} D={D}, "
                                        f"N={N} cached tokens", COLUMNS)
    rounds = 2 * ctx.rounds
    headroom = 4 + ctx.warmup + rounds
    g = torch.Generator().manual_seed(5)
    torch.manual_seed(5)
    with ctx.bars.task("quant_cache", total=3) as steps, torch.no_grad():
        m32 = mh.MultiHeadAttention(E, H, num_kv_heads=H, head_dim=D, bias=False, rope=mh.RoPE(D)).eval()
        m = copy.deepcopy(m32).bfloat16()
        context = torch.randn(1, N, E, generator=g)  # (1, N, E) hidden states
        x = torch.randn(1, 1, E, generator=g).bfloat16()  # (1, 1, E): the token after the context
        reference = m32(x.float(), cache=filled(m32, context, None, torch.float32, 1))  # (1, 1, E)
        caches = {name: filled(m, context, kv, torch.bfloat16, headroom) for name, kv in CACHES.items()}
        first = {name: m(x, cache=cache) for name, cache in caches.items()}
        drift = {name: ((out.float() - reference).abs().max() / reference.abs().max()).item()
                 for name, out in first.items()}
        steps.advance()
        t = compare({name: (lambda cache=cache: m(x, cache=cache)) for name, cache in caches.items()},
                    rounds=rounds, warmup=ctx.warmup, budget_s=ctx.budget_s)
        steps.advance()
        q = torch.randn(1, H, 1, D, generator=g).bfloat16()  # (1, H, 1, D)
        mask = mh.Mask.causal("bottom_right")
        views = {name: _held(cache, N) for name, cache in caches.items()}
        alone = compare({name: (lambda kv=kv: _attend(q, kv, mask)) for name, kv in views.items()},
                        rounds=rounds, warmup=ctx.warmup, budget_s=ctx.budget_s)
        steps.advance()
    build = kernel_build(torch.bfloat16) or "plain torch"
    for case, timings in ((f"decode N={N}: module step", t), (f"decode N={N}: attention alone", alone)):
        for name, kv in CACHES.items():
            per_token = caches[name].bytes_per_token() if kv is not None else 2 * H * D * 2
            result.rows.append({
                "case": case, "implementation": name, "ms": timings[name].median_s * 1e3,
                "GB/s": per_token * N / timings[name].median_s / 1e9,
                "x bf16 cache": ratio(timings["bf16 cache"], timings[name]), "drift vs fp32 cache": drift[name],
                "bytes per token": per_token, "runs": f"C++ decode kernel ({build} build)",
            })
    for name in ("int8 cache", "fp8 e4m3 cache"):
        low, high = ratio_range(t["bf16 cache"], t[name])
        result.targets.append(Target(
            f"decode N={N}: module step, bf16 cache / {name}", ratio(t["bf16 cache"], t[name]), ">=", GOALS["speed"],
            note=f"rounds {low:.2f}x..{high:.2f}x; attention alone "
                 f"{ratio(alone['bf16 cache'], alone[name]):.2f}x; {build} build"))
        result.targets.append(Target(f"decode N={N}: {name} output drift vs fp32 cache (of its largest value)",
                                     drift[name], "<=", GOALS["drift"],
                                     note=f"bf16 cache: {drift['bf16 cache']:.4f}"))
    return result


def _held(cache, N: int):
    """The first N slots as attention reads them: float tensors, or `Quantized` codes with their scales."""
    return tuple(cache.read(part, N) for part in cache.parts)


def _attend(q, kv, mask):
    keys, values = kv  # tensors or a quantized cache's codes: dispatch reads either
    return mh.attention(q, keys, values, mask)
