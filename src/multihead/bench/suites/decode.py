"""Decode: one decoder step with a KV cache, a ragged batch step, and a sliding-window prefill.

1. Decode step, B=1, H=32, Hkv=8, D=128 (E=4096), contexts 4096 and 16384, fp32 and bf16:
   - the attention alone: `mh.attention` on a KVCache's keys and values with the cache's mask (what the
     module calls), the decode kernel called directly (`decode_step`, without dispatch and plan: what
     the kernel itself reads at), raw SDPA with enable_gqa, and SDPA on the queries grouped per kv head,
     (B, Hkv, H/Hkv, D) against (B, Hkv, L, D), which reads each K/V head once. Achieved rate = bytes
     of K and V / time, against the read bandwidth of the same rounds: `sum()` of a 256 MiB fp32
     tensor. Each call takes the next cache of a rotation spanning at least as many bytes, so no call
     finds its keys in the CPU's caches;
   - the module step (MultiHeadAttention with RoPE and GQA appending to a KVCache that holds the
     context) against the same module recomputing the whole context (a causal forward over L + 1
     tokens), and against HF's LlamaAttention with its DynamicCache on identical weights
     (`bench/llama_pair.py`), and the cache write of one token alone (KVCache.append on a cache of the
     same size). Both caches grow by one token per step: the two sides take the same number of
     steps, so they stay at the same context.
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

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

import multihead as mh
from multihead.backends.decode_step import decode_step, plain_decode_step
from multihead.bench.llama_pair import LlamaPair
from multihead.bench.machine import load_average
from multihead.bench.plots import DRAWERS
from multihead.bench.results import SuiteResult, Target
from multihead.bench.suites.context import Context
from multihead.bench.suites.window_prefill import (  # noqa: F401 (band_keep, compiled_flex: used by tests)
    WINDOW_GOAL,
    band_keep,
    band_pairs,
    big_rounds,
    compiled_flex,
    keeping,
    window,
)
from multihead.bench.timing import clock_name, compare, ratio, set_clock
from multihead.cache import KVCache

GOALS = {"bandwidth": 0.5, "recompute": 50.0, "hf": 1.0, "ragged": 1.5, "window": WINDOW_GOAL}
PLAIN = "decode step, plain-torch form (what runs without a compiler)"
KERNEL = "the decode kernel alone (decode_step: no dispatch, no plan)"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
COLUMNS = ["case", "implementation", "ms", "GB/s", "% of bandwidth", "x ours", "max |diff|", "runs"]
OURS, VARLEN, DENSE = "ours: mh.attention", "ours: backend='varlen'", "ours: backend='sdpa'"


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
    parts = len(s.contexts) * len(s.dtypes) * 3 + 2 + 1
    loads = []
    with ctx.bars.task("decode", total=parts) as steps, torch.no_grad():
        for dtype in s.dtypes:
            for length in s.contexts:
                steps.describe(f"decode N={length} {dtype}")
                loads.append(f"N={length} {dtype} {load_average()}")
                attention_alone(ctx, s, length, dtype, result)
                steps.advance()
                module_step(ctx, s, length, dtype, result, steps)
        steps.describe("ragged decode")
        loads.append(f"ragged {load_average()}")
        ragged(ctx, s, result, steps)
        steps.describe("sliding window prefill")
        loads.append(f"window {load_average()}")
        window(ctx, s, result)
        steps.advance()
    result.notes.append("load average (1, 5, 15 min) at the start of each part: " + "; ".join(loads))
    return result


class Rotation:
    """Inputs that take turns: each call, from any timed function, gets the next set in the list."""

    def __init__(self, items: list):
        self.items, self.turn = items, 0

    def __call__(self):
        self.turn = (self.turn + 1) % len(self.items)
        return self.items[self.turn]


def copies_for(nbytes: int, sizes: Sizes) -> int:
    """How many copies of `nbytes` span `rotation_mib` (at least one)."""
    return max(1, math.ceil(sizes.rotation_mib * 2**20 / nbytes))


def filled_cache(lengths: torch.Tensor, longest: int, s: Sizes, dtype: torch.dtype, g: torch.Generator):
    """A KVCache (B, Hkv, longest + 1, D) holding `lengths` random tokens per sequence plus one more
    (the step's), and the step's (keys, values, mask) from that last append."""
    B, Hkv, D = len(lengths), s.kv_heads, s.head_dim
    cache = KVCache(B, longest + 1, Hkv, D, dtype=dtype)
    kv = [torch.randn(B, Hkv, longest, D, generator=g).to(dtype) for _ in range(2)]
    cache.append(*kv, None if bool((lengths == longest).all()) else lengths)
    return cache.append(*(torch.randn(B, Hkv, 1, D, generator=g).to(dtype) for _ in range(2)))


def kv_bytes(keys: torch.Tensor, lengths: torch.Tensor) -> int:
    """Bytes of K and V a step must read: every valid token of every sequence and kv head."""
    return 2 * int(lengths.sum()) * keys.shape[1] * keys.shape[3] * keys.element_size()


def attention_alone(ctx: Context, s: Sizes, length: int, dtype: str, result: SuiteResult) -> None:
    """Part 1a: the attention of one decode step against the read bandwidth of the same rounds."""
    g = torch.Generator().manual_seed(0)
    H, Hkv, D, dt = s.heads, s.kv_heads, s.head_dim, DTYPES[dtype]
    lengths = torch.tensor([length])
    first = filled_cache(lengths, length, s, dt, g)
    nbytes = kv_bytes(first[0], lengths + 1)
    sets = [first] + [filled_cache(lengths, length, s, dt, g) for _ in range(copies_for(nbytes, s) - 1)]
    q = torch.randn(1, H, 1, D, generator=g).to(dt)  # (B, H, 1, D)
    grouped = q.view(1, Hkv, H // Hkv, D)  # (B, Hkv, G, D): the G query heads of each kv head as rows
    big = torch.randn(s.rotation_mib * 2**20 // 4, generator=g)
    turn = Rotation(sets)
    lo, hi = torch.zeros(1, 1, dtype=torch.long), torch.full((1, 1), length + 1)  # the one row keeps every key
    qpos = torch.zeros(1, 1)
    bandwidth_name = f"read bandwidth: sum of {s.rotation_mib} MiB fp32"
    fns = {
        OURS: lambda: mh.attention(q, *turn()),
        PLAIN: lambda: plain_decode_step(q, *turn()[:2], lo, hi, qpos, D**-0.5),
        KERNEL: lambda: decode_step(q, *turn()[:2], lo, hi, qpos, D**-0.5),
        "raw SDPA, enable_gqa": lambda: F.scaled_dot_product_attention(q, *turn()[:2], enable_gqa=True),
        "SDPA on grouped queries": lambda: F.scaled_dot_product_attention(grouped, *turn()[:2]),
        bandwidth_name: big.sum,
    }
    # the call right after the large sum() runs slower: an untimed call takes that place
    untimed = {bandwidth_name: lambda: mh.attention(q, *turn())}
    t = compare(fns, rounds=2 * ctx.rounds, warmup=ctx.warmup, budget_s=ctx.budget_s, after=untimed)
    threads = torch.get_num_threads()
    more = {}
    clock = clock_name()
    for n in (n for n in s.threads if n != threads):  # the kernel and the bandwidth again at n threads
        torch.set_num_threads(n)
        set_clock("wall")  # a CPU clock would add up the threads' time
        try:
            more[n] = compare({OURS: fns[OURS], bandwidth_name: big.sum}, rounds=2 * ctx.rounds,
                              warmup=ctx.warmup, budget_s=ctx.budget_s, after=untimed)
        finally:
            torch.set_num_threads(threads)
            set_clock(clock)
    ours = mh.attention(q, *first)
    diffs = {"raw SDPA, enable_gqa": F.scaled_dot_product_attention(q, *first[:2], enable_gqa=True),
             "SDPA on grouped queries": F.scaled_dot_product_attention(grouped, *first[:2]).view_as(q),
             PLAIN: plain_decode_step(q, *first[:2], lo, hi, qpos, D**-0.5),
             KERNEL: decode_step(q, *first[:2], lo, hi, qpos, D**-0.5)}
    bw = t[bandwidth_name]
    case = f"decode N={length} {dtype}: attention"
    shares = {}
    for name, timing in t.items():
        is_bw = name == bandwidth_name
        moved = big.numel() * 4 if is_bw else nbytes
        shares[name] = 1.0 if is_bw else nbytes / (big.numel() * 4) * ratio(bw, timing)
        result.rows.append({
            "case": case, "implementation": name, "ms": timing.median_s * 1e3,
            "GB/s": moved / timing.median_s / 1e9, "% of bandwidth": 100 * shares[name],
            "x ours": None if is_bw else ratio(timing, t[OURS]),
            "max |diff|": (diffs[name] - ours).abs().max().item() if name in diffs else None,
            "runs": mh.dispatch(q, *first).backend if name == OURS else "",
        })
    for n, tn in more.items():
        share = nbytes / (big.numel() * 4) * ratio(tn[bandwidth_name], tn[OURS])
        result.rows.append({
            "case": case, "implementation": f"{OURS}, {n} threads", "ms": tn[OURS].median_s * 1e3,
            "GB/s": nbytes / tn[OURS].median_s / 1e9, "% of bandwidth": 100 * share,
            "x ours": ratio(tn[OURS], t[OURS]), "runs": f"decode ({n} threads, wall clock; bandwidth "
            f"{big.numel() * 4 / tn[bandwidth_name].median_s / 1e9:.1f} GB/s at {n} threads)"})
    result.targets.append(Target(
        f"decode N={length} {dtype}: attention reads K/V at this share of the read bandwidth",
        shares[OURS], ">=", GOALS["bandwidth"],
        note=(f"{nbytes / 2**20:.0f} MiB of K/V per step; bandwidth {big.numel() * 4 / bw.median_s / 1e9:.1f} "
              f"GB/s (sum of {s.rotation_mib} MiB fp32); raw SDPA {shares['raw SDPA, enable_gqa']:.0%}, "
              f"grouped queries {shares['SDPA on grouped queries']:.0%}, plain-torch form {shares[PLAIN]:.0%}, "
              f"the kernel alone {shares[KERNEL]:.0%}; "
              f"{mh.dispatch(q, *first).detail}")))


def module_step(ctx: Context, s: Sizes, length: int, dtype: str, result: SuiteResult, steps) -> None:
    """Parts 1b and 1c: the module's decode step against the recompute and against HF's layer."""
    E, dt = s.heads * s.head_dim, DTYPES[dtype]
    rounds = 2 * ctx.rounds
    headroom = 5 + ctx.warmup + rounds + ctx.rounds
    pair = LlamaPair.build(E, s.heads, s.kv_heads, s.head_dim, dtype=dt, max_position=length + headroom)
    full = torch.randn(1, length + 1, E, generator=torch.Generator().manual_seed(1)).to(dt)  # (1, L + 1, E)
    x = full[:, length:]  # (1, 1, E): the token after the context
    pair.fill(full[:, :length], headroom)
    ours_first, hf_first = pair.ours_step(x), pair.hf_step(x)
    spare = pair.ours.new_cache(1, length + headroom)  # the cache write alone, on a cache of the same size
    spare.append(pair.our_cache.keys[:, :, :length], pair.our_cache.values[:, :, :length])
    token = pair.our_cache.keys[:, :, :1].clone()  # (1, Hkv, 1, D)
    fns = {"ours": lambda: pair.ours_step(x), "hf": lambda: pair.hf_step(x),
           "append": lambda: spare.append(token, token)}
    if s.compiled_peers:  # two untimed calls: the first compiles, the second may recompile once
        static_first = [pair.hf_static_step(x) for _ in range(2)][0]
        fns["hf static"] = lambda: pair.hf_static_step(x)
    t = compare(fns, rounds=rounds, warmup=ctx.warmup, budget_s=ctx.budget_s)
    steps.advance()
    recomputed: dict[str, torch.Tensor] = {}
    big = big_rounds({"recompute": keeping(recomputed, "out", lambda: pair.recompute(full)),
                      "step": lambda: pair.ours_step(x)}, ctx)
    steps.advance()
    case = f"decode N={length} {dtype}: module step"
    ours_runs = _backend(pair, 1, length + 1, mh.Mask.causal("bottom_right"), dt)
    recompute_x = ratio(big["recompute"], big["step"])
    hf_x = ratio(t["hf"], t["ours"])
    static = [("HF LlamaAttention + StaticCache, torch.compile", t["hf static"], ratio(t["hf static"], t["ours"]),
               static_first - ours_first, "SDPA, compiled")] if s.compiled_peers else []
    for name, timing, times, diff, runs in (
        ("ours: MultiHeadAttention + KVCache", t["ours"], 1.0, None, ours_runs),
        ("of which: KVCache.append of one token", t["append"], ratio(t["append"], t["ours"]), None, ""),
        ("HF LlamaAttention + DynamicCache (sdpa)", t["hf"], hf_x, hf_first - ours_first, "SDPA"),
        *static,
        (f"ours recomputing all {length + 1} tokens", big["recompute"], recompute_x,
         recomputed["out"][:, -1:] - ours_first, _backend(pair, length + 1, length + 1, mh.Mask.causal(), dt)),
    ):
        result.rows.append({"case": case, "implementation": name, "ms": timing.median_s * 1e3,
                            "x ours": times, "runs": runs,
                            "max |diff|": None if diff is None else diff.abs().max().item()})
    result.targets.append(Target(f"decode N={length} {dtype}: recompute / module step", recompute_x, ">=",
                                 GOALS["recompute"], note=f"{len(big['step'].samples)} recompute round(s)"))
    result.targets.append(Target(f"decode N={length} {dtype}: HF LlamaAttention step / ours", hf_x, ">=",
                                 GOALS["hf"], note="identical weights (from_module); HF's SDPA attention"))
    if s.compiled_peers:
        result.targets.append(Target(
            f"decode N={length} {dtype}: HF LlamaAttention + StaticCache compiled / ours",
            ratio(t["hf static"], t["ours"]), ">=", GOALS["hf"],
            note="torch.compile (default mode) of the step on a StaticCache of the same size; ours eager"))


def _backend(pair: LlamaPair, lq: int, lk: int, mask: mh.Mask, dt: torch.dtype) -> str:
    """The backend `auto` picks for the module's attention at these lengths (shapes only, no data)."""
    H, Hkv, D = pair.ours.num_heads, pair.ours.num_kv_heads, pair.ours.head_dim
    zero = torch.zeros((), dtype=dt)
    keys = zero.expand(1, Hkv, lk, D)
    return mh.dispatch(zero.expand(1, H, lq, D), keys, keys, mask).backend


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
    runs = {baseline: "SDPA", grouped_name: "SDPA", OURS: decision.backend, VARLEN: "varlen", DENSE: "sdpa"}
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
