"""Decode: one decoder step with a KV cache, a ragged batch step, and a sliding-window prefill.

1. Decode step, B=1, H=32, Hkv=8, D=128 (E=4096), contexts 1024, 4096 and 16384, fp32 and bf16:
   - the attention alone against the read bandwidth, one bandwidth for the whole run (read_share.py);
   - the module step (MultiHeadAttention with RoPE and GQA appending to a KVCache that holds the
     context) against the same module recomputing the whole context (a causal forward over L + 1
     tokens), against HF's LlamaAttention on identical weights (`bench/llama_pair.py`) at each of its
     calls: eager with its DynamicCache, eager with a StaticCache, and that StaticCache step under
     torch.compile; the target takes HF at its best call, the fastest of the three. And the cache write
     of one token alone (KVCache.append on a cache of the same size). Every cache grows by one token
     per step: all sides take the same number of steps, so they stay at the same context.
2. Ragged decode: 8 sequences with contexts 512 ... 4096 evenly spaced, one step: the attention on a
   cache holding each sequence's own length, against the dense padded decode (SDPA over all slots with
   a key-padding mask); then the same step through the module.
3. Sliding-window prefill (window_prefill.py): W=1024, N=16384, B=1, H=8, D=64, fp32: `mh.attention(q, k,
   v, Mask.window(W), causal=True)` against SDPA with the dense (N, N) bool mask built beforehand, and
   against compiled FlexAttention with a block mask.

Ratios are medians of per-round ratios (`timing.compare`). Calls that take seconds (the recompute,
the window prefill) get no warm-up and as many rounds as the budget allows, down to one.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

import multihead as mh
from multihead.bench.llama_pair import GQA_UNDER_COMPILE, LlamaPair
from multihead.bench.machine import load_average
from multihead.bench.plots import DRAWERS
from multihead.bench.results import SuiteResult, Target
from multihead.bench.suites import read_share
from multihead.bench.suites.context import Context
from multihead.bench.suites.read_share import (  # noqa: F401 (Rotation, copies_for: used by tests)
    OURS,
    Rotation,
    copies_for,
    filled_cache,
    kv_bytes,
    label,
)
from multihead.bench.suites.window_prefill import (  # noqa: F401 (band_keep, compiled_flex: used by tests)
    WINDOW_GOAL,
    band_keep,
    band_pairs,
    big_rounds,
    compiled_flex,
    keeping,
    window,
)
from multihead.bench.timing import compare, ratio

GOALS = {"recompute": 50.0, "hf": 1.0, "ragged": 1.5, "window": WINDOW_GOAL}
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
COLUMNS = ["case", "implementation", "ms", "GB/s", "% of bandwidth", "x ours", "max |diff|", "runs"]
VARLEN, DENSE = "ours: backend='varlen'", "ours: backend='sdpa'"
HF_DYNAMIC = "HF LlamaAttention + DynamicCache (sdpa)"
HF_STATIC = "HF LlamaAttention + StaticCache (sdpa), eager"
HF_COMPILED = "HF LlamaAttention + StaticCache, torch.compile"


@dataclass(frozen=True)
class Sizes:
    contexts: tuple[int, ...]
    heads: int = 32
    kv_heads: int = 8
    head_dim: int = 128
    dtypes: tuple[str, ...] = ("fp32", "bf16")
    ragged_batch: int = 8
    ragged_longest: int = 4096
    window: int = 1024
    window_length: int = 16384
    window_heads: int = 8
    window_head_dim: int = 64
    rotation_mib: int = 256  # the bandwidth tensor, and the least bytes a rotation of caches spans
    threads: tuple[int, ...] = (1, 2)  # torch threads the attention's read share is measured at
    compiled_peers: bool = True  # HF's StaticCache and FlexAttention under torch.compile (each compiles once)

    @classmethod
    def full(cls) -> Sizes:
        return cls(contexts=(1024, 4096, 16384))

    @classmethod
    def quick(cls) -> Sizes:
        """Small sizes; without the compiled peers (compiling them on a CPU takes half a minute each)."""
        return cls(contexts=(1024,), ragged_longest=1024, window=128, window_length=2048, rotation_mib=64,
                   threads=(1,), compiled_peers=False)


def run(ctx: Context, sizes: Sizes) -> SuiteResult:
    s = sizes
    result = SuiteResult(
        "decode",
        f"Decode: B=1 H={s.heads} Hkv={s.kv_heads} D={s.head_dim} at N={', '.join(map(str, s.contexts))}; "
        f"ragged {s.ragged_batch} x up to {s.ragged_longest}; window W={s.window} at N={s.window_length} "
        f"(H={s.window_heads}, D={s.window_head_dim})",
        COLUMNS,
    )
    steps_total = len(s.contexts) * len(s.dtypes) * 3 + 2 + 1
    loads, parts = [], []
    with ctx.bars.task("decode", total=steps_total) as steps, torch.no_grad():
        for dtype in s.dtypes:
            for length in s.contexts:
                steps.describe(f"decode N={length} {dtype}")
                loads.append(f"N={length} {dtype} {load_average()}")
                parts.append(read_share.measure(ctx, s, length, dtype, result))
                steps.advance()
                module_step(ctx, s, length, dtype, result, steps)
        read_share.report(parts, result)
        steps.describe("ragged decode")
        loads.append(f"ragged {load_average()}")
        ragged(ctx, s, result, steps)
        steps.describe("sliding window prefill")
        loads.append(f"window {load_average()}")
        window(ctx, s, result)
        steps.advance()
    result.notes.append(f"HF LlamaAttention's calls: {GQA_UNDER_COMPILE}")
    result.notes.append("load average (1, 5, 15 min) at the start of each part: " + "; ".join(loads))
    return result


def module_step(ctx: Context, s: Sizes, length: int, dtype: str, result: SuiteResult, steps) -> None:
    """Parts 1b and 1c: the module's decode step against the recompute and against HF's layer at each of
    its calls; the target takes HF at its fastest."""
    E, dt = s.heads * s.head_dim, DTYPES[dtype]
    rounds = 2 * ctx.rounds
    headroom = 5 + ctx.warmup + rounds + ctx.rounds
    pair = LlamaPair.build(E, s.heads, s.kv_heads, s.head_dim, dtype=dt, max_position=length + headroom)
    full = torch.randn(1, length + 1, E, generator=torch.Generator().manual_seed(1)).to(dt)  # (1, L + 1, E)
    x = full[:, length:]  # (1, 1, E): the token after the context
    pair.fill(full[:, :length], headroom)
    ours_first = pair.ours_step(x)
    spare = pair.ours.new_cache(1, length + headroom)  # the cache write alone, on a cache of the same size
    spare.append(pair.our_cache.keys[:, :, :length], pair.our_cache.values[:, :, :length])
    token = pair.our_cache.keys[:, :, :1].clone()  # (1, Hkv, 1, D)
    peers = {HF_DYNAMIC: pair.hf_step, HF_STATIC: pair.hf_static_eager_step}
    if s.compiled_peers:
        peers[HF_COMPILED] = pair.hf_static_step
    first = {name: step(x) for name, step in peers.items()}  # one step each (the compiled one compiles)
    if s.compiled_peers:  # a second untimed call: a compiled step may recompile once
        pair.hf_static_step(x)
    fns = {"ours": lambda: pair.ours_step(x), "append": lambda: spare.append(token, token),
           **{name: (lambda step=step: step(x)) for name, step in peers.items()}}
    t = compare(fns, rounds=rounds, warmup=ctx.warmup, budget_s=ctx.budget_s)
    steps.advance()
    recomputed: dict[str, torch.Tensor] = {}
    big = big_rounds({"recompute": keeping(recomputed, "out", lambda: pair.recompute(full)),
                      "step": lambda: pair.ours_step(x)}, ctx)
    steps.advance()
    case = f"decode N={length} {dtype}: module step"
    recompute_x = ratio(big["recompute"], big["step"])
    runs = {HF_DYNAMIC: "SDPA", HF_STATIC: "SDPA", HF_COMPILED: "SDPA, compiled"}
    for name, timing, times, diff, backend in (
        ("ours: MultiHeadAttention + KVCache", t["ours"], 1.0, None, _backend(pair, 1, length + 1, mh.Mask.causal("bottom_right"), dt)),
        ("of which: KVCache.append of one token", t["append"], ratio(t["append"], t["ours"]), None, ""),
        *((name, t[name], ratio(t[name], t["ours"]), first[name] - ours_first, runs[name]) for name in peers),
        (f"ours recomputing all {length + 1} tokens", big["recompute"], recompute_x,
         recomputed["out"][:, -1:] - ours_first, _backend(pair, length + 1, length + 1, mh.Mask.causal(), dt)),
    ):
        result.rows.append({"case": case, "implementation": name, "ms": timing.median_s * 1e3,
                            "x ours": times, "runs": backend,
                            "max |diff|": None if diff is None else diff.abs().max().item()})
    result.targets.append(Target(f"decode N={length} {dtype}: recompute / module step", recompute_x, ">=",
                                 GOALS["recompute"], note=f"{len(big['step'].samples)} recompute round(s)"))
    best = min(peers, key=lambda name: t[name].median_s)
    result.targets.append(Target(
        f"decode N={length} {dtype}: HF LlamaAttention step at its best call / ours", ratio(t[best], t["ours"]), ">=",
        GOALS["hf"], note=f"HF's best call: {best}; " + ", ".join(f"{name} {ratio(t[name], t['ours']):.2f}x" for name in peers)
        + "; identical weights (from_module); ours eager"))


def _backend(pair: LlamaPair, lq: int, lk: int, mask: mh.Mask, dt: torch.dtype) -> str:
    """The backend `auto` picks for the module's attention at these lengths (shapes only, no data)."""
    H, Hkv, D = pair.ours.num_heads, pair.ours.num_kv_heads, pair.ours.head_dim
    zero = torch.zeros((), dtype=dt)
    keys = zero.expand(1, Hkv, lk, D)
    return label(mh.dispatch(zero.expand(1, H, lq, D), keys, keys, mask).backend, dt)


def ragged(ctx: Context, s: Sizes, result: SuiteResult, steps) -> None:
    """Part 2: one step of a ragged batch, the length-aware path against the dense padded decode."""
    B, H, D, N = s.ragged_batch, s.heads, s.head_dim, s.ragged_longest
    g = torch.Generator().manual_seed(2)
    lengths = torch.tensor([N * (i + 1) // B for i in range(B)])  # (B,) tokens cached before the step
    first = filled_cache(lengths, N, s, torch.float32, g)
    Lk = first[0].shape[2]
    nbytes, padded = kv_bytes(first[0], lengths + 1), kv_bytes(first[0], torch.full((B,), Lk))
    sets = [first] + [filled_cache(lengths, N, s, torch.float32, g) for _ in range(copies_for(padded, s) - 1)]
    q = torch.randn(B, H, 1, D, generator=g)  # (B, H, 1, D)
    keep = (torch.arange(Lk) < (lengths + 1)[:, None])[:, None, None, :]  # (B, 1, 1, Lk): valid keys
    turn = Rotation(sets)
    baseline = "dense padded: SDPA + key-padding mask"
    grouped_name = "dense padded: SDPA on grouped queries + key-padding mask"
    grouped = q.view(B, s.kv_heads, H // s.kv_heads, D)  # (B, Hkv, G, D): each kv head read once
    fns = {
        baseline: lambda: F.scaled_dot_product_attention(q, *turn()[:2], keep, enable_gqa=True),
        grouped_name: lambda: F.scaled_dot_product_attention(grouped, *turn()[:2], keep),
        OURS: lambda: mh.attention(q, *turn()),
        VARLEN: lambda: mh.attention(q, *turn(), backend="varlen"),
        DENSE: lambda: mh.attention(q, *turn(), backend="sdpa"),
    }
    t = compare(fns, rounds=2 * ctx.rounds, warmup=ctx.warmup, budget_s=ctx.budget_s)
    steps.advance()
    expected = F.scaled_dot_product_attention(q, *first[:2], keep, enable_gqa=True)
    decision = mh.dispatch(q, *first)
    runs = {baseline: "SDPA", grouped_name: "SDPA", OURS: label(decision.backend, torch.float32), VARLEN: "varlen",
            DENSE: "sdpa"}
    case = f"ragged decode {B} x {lengths[0].item()}..{N}: attention"
    for name, timing in t.items():
        result.rows.append({
            "case": case, "implementation": name, "ms": timing.median_s * 1e3,
            "GB/s": (padded if name in (baseline, grouped_name) else nbytes) / timing.median_s / 1e9,
            "x ours": ratio(timing, t[OURS]), "runs": runs[name],
            "max |diff|": (None if name == baseline else
                           (F.scaled_dot_product_attention(grouped, *first[:2], keep).view_as(q) - expected).abs().max().item()
                           if name == grouped_name else _diff(name, q, first, expected)),
        })
    module_x = ragged_module_step(ctx, s, lengths, result)
    steps.advance()
    strongest = min((baseline, grouped_name), key=lambda name: t[name].median_s)
    result.targets.append(Target(
        f"ragged decode {B} x {lengths[0].item()}..{N}: strongest dense padded call / ours",
        ratio(t[strongest], t[OURS]), ">=", GOALS["ragged"],
        note=(f"strongest dense call: {strongest}; SDPA enable_gqa / ours {ratio(t[baseline], t[OURS]):.2f}x; "
              f"auto runs {decision.backend}; backend='varlen' gives {ratio(t[strongest], t[VARLEN]):.2f}x; "
              f"ideal {padded / nbytes:.2f} (K/V bytes); module step: dense / ours {module_x:.2f}x")))
    result.notes.append("ragged decode, auto: " + "; ".join(line.strip() for line in str(decision).splitlines()))


def _diff(name: str, q, inputs, expected) -> float:
    backend = {OURS: "auto", VARLEN: "varlen", DENSE: "sdpa"}[name]
    return (mh.attention(q, *inputs, backend=backend) - expected).abs().max().item()


def ragged_module_step(ctx: Context, s: Sizes, lengths: torch.Tensor, result: SuiteResult) -> float:
    """The ragged step through the module (RoPE, GQA, KVCache), auto against varlen and the dense path;
    returns dense / auto. The projections read all weights once per step, whatever the lengths."""
    B, H, Hkv, D, N = s.ragged_batch, s.heads, s.kv_heads, s.head_dim, s.ragged_longest
    g = torch.Generator().manual_seed(4)
    attn = mh.MultiHeadAttention(H * D, H, num_kv_heads=Hkv, head_dim=D, bias=False, rope=mh.RoPE(D)).eval()
    rounds = 2 * ctx.rounds
    k, v = (torch.randn(B, Hkv, N, D, generator=g) for _ in range(2))  # (B, Hkv, N, D)
    x = torch.randn(B, 1, H * D, generator=g)  # (B, 1, E): one new token per sequence
    backends = {"auto": OURS, "varlen": VARLEN, "sdpa": DENSE}
    caches = {}
    for backend in backends:
        caches[backend] = attn.new_cache(B, N + 2 + ctx.warmup + rounds)
        caches[backend].append(k, v, lengths)

    def step(backend: str):
        def call():
            attn.backend = backend
            return attn(x, cache=caches[backend])
        return call

    first = {backend: step(backend)() for backend in backends}
    t = compare({backends[b]: step(b) for b in backends}, rounds=rounds, warmup=ctx.warmup,
                budget_s=ctx.budget_s)
    attn.backend = "auto"
    weights = sum(p.numel() * p.element_size() for p in attn.parameters())
    case = f"ragged decode {B} x {lengths[0].item()}..{N}: module step ({weights / 2**20:.0f} MiB of weights)"
    for backend, name in backends.items():
        result.rows.append({
            "case": case, "implementation": name.replace("mh.attention", "MultiHeadAttention"),
            "ms": t[name].median_s * 1e3, "x ours": ratio(t[name], t[OURS]), "runs": backend,
            "max |diff|": None if backend == "sdpa" else (first[backend] - first["sdpa"]).abs().max().item(),
        })
    return ratio(t[DENSE], t[OURS])


def plot(plt, r: SuiteResult):
    """ms per call of every row, log scale (the recompute and a decode step differ by 100x and more)."""
    import textwrap

    fig, ax = plt.subplots(figsize=(13, 0.3 * len(r.rows) + 1.5))
    ax.barh(range(len(r.rows)), [row["ms"] for row in r.rows])
    labels = [f"{row['case']}:" + ("\n" if len(row["case"] + row["implementation"]) > 64 else " ")
              + row["implementation"] for row in r.rows]  # long ones on two lines
    ax.set_yticks(range(len(r.rows)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xscale("log")
    ax.set_xlabel("ms per call (log scale)")
    ax.set_title(textwrap.fill(r.title, 60), fontsize=9)
    return fig


DRAWERS.setdefault("decode", plot)  # `multihead bench --plot` draws this suite with it
