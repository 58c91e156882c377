"""The attention loops of `multihead bench --suite loops` (loops.py runs them): each the way a loop calls it.

- Sparse decode, real loop: one decode step (B=1, H=16, one kv head, D=128, bf16) over `listed` keys of a
  `keys`-key cache, a fresh unsorted index tensor (a new Mask.sparse) at every step, and the K/V rotated
  through copies that together exceed the CPU's caches (cold), against the dense step over all keys on the
  same rotation (goal 8x).
- Sparse prefill: L queries each listing `per_query` keys at or before it (Mask.sparse & causal) against
  the dense keep mask of the same keys (Mask.keep) and against plain causal attention, all through "auto".
  The rule: where auto picks sparse it must be at least as fast as the dense keep mask.
- Quantized caches: MultiHeadAttention (E=1024, H=16, Hkv=4) with a float, an int8 and an fp8 cache: the
  prompt of `prompt` tokens, then one-token steps (the prompt rows take the cache's whole prefill path).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

import multihead as mh
from multihead.bench.results import SuiteResult, Target
from multihead.bench.suites.context import Context
from multihead.bench.timing import compare, ratio
from multihead.capture import trace

GOAL_SPARSE_STEP = 8.0
COLD_BYTES = 256 << 20  # the K/V copies a cold loop rotates through, at least


@dataclass(frozen=True)
class Sizes:
    keys: int = 32768
    listed: int = 1024
    prefill: tuple[tuple[int, int], ...] = ((2048, 64), (4096, 128))  # (queries, listed keys each)
    prompt: int = 4096
    steps: int = 4

    @classmethod
    def quick(cls) -> Sizes:
        return cls(keys=8192, listed=256, prefill=((1024, 32),), prompt=1024)


def parts(ctx: Context, s: Sizes, result: SuiteResult) -> list:
    """(name, callable) for each part, in the order loops.py runs them."""
    out = [("sparse decode, fresh lists, cold K/V", lambda: sparse_decode(ctx, s, result))]
    out += [(f"sparse prefill L={L}", lambda L=L, K=K: sparse_prefill(ctx, L, K, result)) for L, K in s.prefill]
    out += [(f"quantized caches N={s.prompt}", lambda: quantized_caches(ctx, s, result))]
    return out


def _backend(fn) -> str:
    with trace() as t:
        fn()
    return ", ".join(f"{name} x{n}" for name, n in t.backends().items())


def sparse_decode(ctx: Context, s: Sizes, result: SuiteResult) -> None:
    g = torch.Generator().manual_seed(0)
    N, K, H, D = s.keys, s.listed, 16, 128
    copies = max(2, COLD_BYTES // (2 * N * D * 2) + 1)
    kv = [tuple(torch.randn(1, 1, N, D, generator=g).bfloat16() for _ in range(2)) for _ in range(copies)]
    q = torch.randn(1, H, 1, D, generator=g).bfloat16()
    turn = [0, 0]
    dense = mh.Mask.causal("bottom_right")

    def next_kv(slot: int):
        turn[slot] = (turn[slot] + 1) % copies
        return kv[turn[slot]]

    def sparse_step():
        k, v = next_kv(0)
        listed = torch.randperm(N)[:K].view(1, 1, K)  # fresh and unsorted, as a top-k selection hands them
        return mh.attention(q, k, v, mh.Mask.sparse(listed) & dense)

    def dense_step():
        k, v = next_kv(1)
        return mh.attention(q, k, v, dense)

    fns = {"sparse: fresh unsorted list, cold K/V": sparse_step, "dense step, cold K/V": dense_step}
    ran = {name: _backend(fn) for name, fn in fns.items()}
    t = compare(fns, rounds=4 * ctx.rounds, warmup=ctx.warmup, budget_s=ctx.budget_s)
    mine = "sparse: fresh unsorted list, cold K/V"
    for name in fns:
        result.rows.append({"loop": "sparse decode", "case": f"{K} listed of {N} keys, bf16, H={H}, Hkv=1, D={D}, "
                            f"K/V rotated over {copies} copies", "implementation": name,
                            "ms": t[name].median_s * 1e3, "tokens/s": 1 / t[name].median_s,
                            "x ours": ratio(t[name], t[mine]), "ran": ran[name], "max |diff|": None})
    result.targets.append(Target(f"sparse decode {K} of {N}, fresh lists, cold K/V: dense step / sparse step",
                                 ratio(t["dense step, cold K/V"], t[mine]), ">=", GOAL_SPARSE_STEP))


def sparse_prefill(ctx: Context, L: int, K: int, result: SuiteResult) -> None:
    g = torch.Generator().manual_seed(1)
    H, Hkv, D = 16, 4, 64
    q = torch.randn(1, H, L, D, generator=g)
    k, v = (torch.randn(1, Hkv, L, D, generator=g) for _ in range(2))
    i = torch.arange(L)[:, None]
    listed = (torch.rand(L, K, generator=g) * (i + 1)).long()  # K keys at or before each query (repeats allowed)
    listed[:, 0] = i[:, 0]  # each query keeps itself
    keep = torch.zeros(L, L, dtype=torch.bool).scatter_(1, listed, True)
    masks = {"auto: Mask.sparse & causal": mh.Mask.sparse(listed.view(1, L, K)) & mh.Mask.causal(),
             "auto: Mask.keep (dense, same keys)": mh.Mask.keep(keep.view(1, 1, L, L)),
             "auto: plain causal (more keys)": mh.Mask.causal()}
    fns = {name: (lambda m=m: mh.attention(q, k, v, m)) for name, m in masks.items()}
    ran = {name: _backend(fn) for name, fn in fns.items()}
    outs = {name: fn() for name, fn in fns.items()}
    t = compare(fns, rounds=ctx.rounds, warmup=ctx.warmup, budget_s=ctx.budget_s)
    mine, dense = "auto: Mask.sparse & causal", "auto: Mask.keep (dense, same keys)"
    for name in fns:
        diff = None if name.startswith("auto: plain") else (outs[name] - outs[dense]).abs().max().item()
        result.rows.append({"loop": "sparse prefill", "case": f"L={L}, {K} listed keys each, fp32, H={H}, Hkv={Hkv}",
                            "implementation": name, "ms": t[name].median_s * 1e3, "tokens/s": L / t[name].median_s,
                            "x ours": ratio(t[name], t[mine]), "ran": ran[name], "max |diff|": diff})
    result.targets.append(Target(f"sparse prefill L={L}, {K} each: dense keep mask / what auto ran for Mask.sparse",
                                 ratio(t[dense], t[mine]), ">=", 0.95,
                                 note=f"auto ran {ran[mine]} for the sparse mask (where it runs the dense keep mask "
                                      "too, the two rows are one path: 0.95 leaves room for noise); the rule: auto "
                                      "never runs a path slower than another exact path the project knows"))


def quantized_caches(ctx: Context, s: Sizes, result: SuiteResult) -> None:
    torch.manual_seed(2)
    attn = mh.MultiHeadAttention(1024, 16, num_kv_heads=4).eval()
    prompt = torch.randn(1, s.prompt, 1024)
    token = torch.randn(1, 1, 1024)
    rounds = ctx.rounds
    capacity = s.prompt + s.steps * (rounds + ctx.warmup + 2) + 8
    rows = {}
    for label, kv_dtype in (("float cache", None), ("int8 cache", torch.int8), ("fp8 cache", torch.float8_e4m3fn)):
        def fresh(kv_dtype=kv_dtype):
            return attn.new_cache(1, capacity, kv_dtype=kv_dtype)
        caches = [fresh()]

        def prompt_step(fresh=fresh, caches=caches):
            caches[0] = fresh()
            return attn(prompt, cache=caches[0])

        def steps(caches=caches):
            return [attn(token, cache=caches[0]) for _ in range(s.steps)][-1]
        rows[label] = (prompt_step, steps)
    fns = {f"{label}: prompt": fn for label, (fn, _) in rows.items()}
    t = compare(fns, rounds=rounds, warmup=ctx.warmup, budget_s=ctx.budget_s)
    for label, (prompt_step, _) in rows.items():
        prompt_step()  # each cache holds the prompt before its steps are timed
    step_fns = {f"{label}: {s.steps} steps": fn for label, (_, fn) in rows.items()}
    ran = {name: _backend(fn) for name, fn in step_fns.items()}
    t.update(compare(step_fns, rounds=rounds, warmup=0, budget_s=ctx.budget_s))
    for name, timing in t.items():
        base = t["float cache: prompt" if name.endswith("prompt") else f"float cache: {s.steps} steps"]
        result.rows.append({"loop": "quantized cache", "case": f"prompt {s.prompt} then steps, fp32 model, E=1024, "
                            "H=16, Hkv=4 (x ours: against the float cache)", "implementation": name, "ms": timing.median_s * 1e3,
                            "tokens/s": (s.prompt if name.endswith("prompt") else s.steps) / timing.median_s,
                            "x ours": ratio(timing, base), "ran": ran.get(name, ""), "max |diff|": None})
