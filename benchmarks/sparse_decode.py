"""Sparse decode: a step over the keys a query lists (Mask.sparse) against the dense step over all of them, and
the absorbed DeepSeek V3.2 sparse step against HF's DeepseekV32Attention layer step.

    python benchmarks/sparse_decode.py [--out benchmarks/sparse-decode.json] [--markdown benchmarks/sparse-decode.md]
                                       [--rounds 10] [--repeats 3] [--no-compile] [--tiny]

1. Attention alone: one decode step, B=1, H=16 query heads, one kv head, D=128, bf16; 1024 listed keys of a
   32,768-key cache (mh.attention under Mask.sparse & Mask.causal) against the dense step over all 32,768
   (Mask.causal alone), each through "auto"; the backend and kernel that ran are recorded (mh.dispatch).
2. The layer: DeepSeek V3.2's attention at DeepSeek-V2-Lite's widths (E=2048, H=16, C=512, Dn=128, R=64,
   Dv=128, q_lora_rank=512; an indexer of 64 heads of 128 keeping 2048 keys), context 16,384, bf16. Ours:
   MultiHeadLatentAttention.from_module(HF's layer) + LatentCache (absorbed step: the indexer's scan of its
   small keys, then attention over the 2048 selected latents). HF: DeepseekV32Attention (sdpa) with its
   DynamicCache, with a StaticCache eager, and the StaticCache step under torch.compile; the goal is taken
   against HF's fastest call. The caches are filled from the same context by the projections a prefill
   computes (no prefill attention), and the first steps' outputs are compared (max |diff|).

Every timed form runs once per round, interleaved and rotated (bench.timing.compare), on one torch thread
with the process's CPU clock; the whole comparison is repeated and the medians over the repeats reported,
with each repeat's ratio. Keys stay in the CPU's caches between rounds where they fit (warm). `--tiny`
runs small sizes (a check of the script).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys

import torch

import multihead as mh
from multihead.bench import machine
from multihead.bench.timing import compare, ratio, set_clock

GOAL_STEP, GOAL_HF = 8.0, 30.0
FULL = {"keys": 32768, "listed": 1024, "heads": 16, "dim": 128, "context": 16384, "hidden": 2048,
        "layer_heads": 16, "q_lora": 512, "index_heads": 64, "index_dim": 128, "top_k": 2048}
TINY = {"keys": 2048, "listed": 64, "heads": 4, "dim": 32, "context": 512, "hidden": 128, "layer_heads": 4,
        "q_lora": 32, "index_heads": 4, "index_dim": 32, "top_k": 64}


def attention_step(s: dict, rounds: int, repeats: int) -> dict:
    """The sparse step over s["listed"] keys against the dense step over s["keys"], bf16."""
    g = torch.Generator().manual_seed(0)
    N, K, H, D = s["keys"], s["listed"], s["heads"], s["dim"]
    q = torch.randn(1, H, 1, D, generator=g).bfloat16()
    k, v = (torch.randn(1, 1, N, D, generator=g).bfloat16() for _ in range(2))
    listed = torch.randperm(N, generator=g)[:K].sort().values.view(1, 1, K)
    sparse = mh.Mask.sparse(listed) & mh.Mask.causal("bottom_right")
    dense = mh.Mask.causal("bottom_right")
    fns = {"sparse": lambda: mh.attention(q, k, v, sparse), "dense": lambda: mh.attention(q, k, v, dense)}
    with torch.inference_mode():
        ran = {name: str(mh.dispatch(q, k, v, m)).splitlines()[0] for name, m in (("sparse", sparse),
                                                                                 ("dense", dense))}
        exact = mh.attention(q.double(), k.double(), v.double(), sparse, backend="math")
        diff = (fns["sparse"]().double() - exact).abs().max().item()
        ratios, ms = [], {"sparse": [], "dense": []}
        for _ in range(repeats):
            t = compare(fns, rounds=rounds, warmup=2)
            ratios.append(ratio(t["dense"], t["sparse"]))
            for name in ms:
                ms[name].append(t[name].median_s * 1e3)
    return {"case": f"decode step, {K} listed of {N} keys, bf16, H={H}, Hkv=1, D={D}",
            "ms": {n: statistics.median(x) for n, x in ms.items()}, "ratio": statistics.median(ratios),
            "ratios": ratios, "goal": GOAL_STEP, "ran": ran, "max_diff_vs_float64": diff}


def build_layer(s: dict, dtype: torch.dtype):
    """(HF DeepseekV32Attention, its rotary embedding, ours from it), eval, `dtype`, every weight drawn."""
    from transformers import DeepseekV32Config
    from transformers.models.deepseek_v32.modeling_deepseek_v32 import (DeepseekV32Attention,
                                                                        DeepseekV32RotaryEmbedding)

    config = DeepseekV32Config(hidden_size=s["hidden"], num_attention_heads=s["layer_heads"],
                               num_key_value_heads=s["layer_heads"], kv_lora_rank=512 if s is FULL else 64,
                               q_lora_rank=s["q_lora"], qk_nope_head_dim=128 if s is FULL else 16,
                               qk_rope_head_dim=64 if s is FULL else 8, v_head_dim=128 if s is FULL else 16,
                               index_n_heads=s["index_heads"], index_head_dim=s["index_dim"],
                               index_topk=s["top_k"], num_hidden_layers=1, vocab_size=4, n_group=1, topk_group=1,
                               max_position_embeddings=2 * s["context"] + 64, attention_bias=False)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    hf = DeepseekV32Attention(config, layer_idx=0)
    with torch.no_grad():
        for name, param in hf.named_parameters():
            param.normal_(1.0, 0.02) if "norm" in name else param.normal_(0.0, 0.02)
    hf = hf.to(dtype).eval()
    return hf, DeepseekV32RotaryEmbedding(config), mh.MultiHeadLatentAttention.from_module(hf).eval()


def fill(mla, hf, context: torch.Tensor, headroom: int, chunk: int = 2048):
    """Our LatentCache, HF's DynamicCache and two StaticCaches holding the projections of context (1, N, E)."""
    from transformers import DynamicCache, StaticCache

    N, C, R = context.shape[1], mla.kv_lora_rank, mla.qk_rope_head_dim
    ours = mla.new_cache(1, N + headroom)
    rows = []
    for start in range(0, N, chunk):
        x = context[:, start:start + chunk]
        positions = torch.arange(start, start + x.shape[1])
        _, q_rope, latent, k_rope, q_resid = mla._project(x)
        _, k_rope = mla.rope(q_rope, k_rope[:, None], positions)
        _, index_k, _ = mla.indexer.project(x, q_resid, positions)
        ours.append_latent(latent, k_rope[:, 0], None, index_k)
        rows.append((latent, k_rope[:, 0], index_k))
    latent, k_rope, index_k = (torch.cat(parts, 1) for parts in zip(*rows))
    halves = torch.cat((torch.arange(0, R, 2), torch.arange(1, R, 2)))  # HF keeps turned pairs de-interleaved
    keys, values = latent[:, None].clone(), k_rope[:, None, :, halves].clone()
    dynamic = DynamicCache(config=hf.config)
    dynamic.update(keys, values, 0)
    dynamic.update_indexer(index_k.clone(), 0)
    statics = []
    for _ in range(2):
        static = StaticCache(config=hf.config, max_cache_len=N + headroom)
        static.update(keys.clone(), values.clone(), 0)
        static.update_indexer(index_k.clone(), 0)
        statics.append(static)
    return ours, dynamic, statics


def static_step(hf, rotary, cache, x: torch.Tensor) -> torch.Tensor:
    """x (1, 1, E) -> (1, 1, E): HF's step on its StaticCache, the mask over the slots from its length tensor."""
    length = cache.layers[0].cumulative_length
    slots = cache.layers[0].keys.shape[2]
    mask = (torch.arange(slots) <= length).view(1, 1, 1, slots)
    return hf(x, position_embeddings=rotary(x, length.view(1, 1)), attention_mask=mask, cache=cache)[0]


def layer_step(s: dict, rounds: int, repeats: int, compiled: bool) -> dict:
    dtype = torch.bfloat16
    hf, rotary, mla = build_layer(s, dtype)
    headroom = 8 + repeats * (rounds + 4)
    g = torch.Generator().manual_seed(1)
    context = torch.randn(1, s["context"], s["hidden"], generator=g).to(dtype)
    x = torch.randn(1, 1, s["hidden"], generator=g).to(dtype)
    with torch.inference_mode():
        ours, dynamic, (static_eager, static_compiled) = fill(mla, hf, context, headroom)

        def hf_dynamic():
            n = dynamic.get_seq_length()
            mask = torch.ones(1, 1, 1, n + 1, dtype=torch.bool)
            return hf(x, position_embeddings=rotary(x, torch.full((1, 1), n)), attention_mask=mask,
                      cache=dynamic)[0]

        fns = {"ours: absorbed sparse step (MLA + LatentCache)": lambda: mla(x, cache=ours),
               "HF DeepseekV32Attention + DynamicCache (sdpa)": hf_dynamic,
               "HF DeepseekV32Attention + StaticCache (sdpa), eager": lambda: static_step(hf, rotary, static_eager, x)}
        if compiled:
            step = torch.compile(static_step)
            fns["HF DeepseekV32Attention + StaticCache, torch.compile (sdpa)"] = \
                lambda: step(hf, rotary, static_compiled, x)
        first = {name: fn().float() for name, fn in fns.items()}  # one step each, all at N + 1 (compiles)
        ours_name = next(iter(fns))
        diffs = {name: (out - first[ours_name]).abs().max().item() for name, out in first.items()}
        ms, ratios = {name: [] for name in fns}, {name: [] for name in fns}
        for _ in range(repeats):
            t = compare(fns, rounds=rounds, warmup=1)
            for name in fns:
                ms[name].append(t[name].median_s * 1e3)
                ratios[name].append(ratio(t[name], t[ours_name]))
    medians = {name: statistics.median(x) for name, x in ms.items()}
    best = min((n for n in fns if n != ours_name), key=lambda n: medians[n])
    return {"case": f"V3.2 layer decode step, context {s['context']}, top-k {s['top_k']}, bf16", "ms": medians,
            "x_ours": {n: statistics.median(r) for n, r in ratios.items()}, "ratios": ratios, "hf_best": best,
            "ratio": statistics.median(ratios[best]), "goal": GOAL_HF, "max_diff_vs_ours": diffs,
            "ran": str(mh.dispatch(torch.zeros(1, s["layer_heads"], 1, 8), torch.zeros(1, 1, s["context"], 8),
                                   torch.zeros(1, 1, s["context"], 8),
                                   mh.Mask.sparse(torch.zeros(1, 1, s["top_k"], dtype=torch.long)))).splitlines()[0]}


def markdown(result: dict) -> str:
    """The results page (benchmarks/sparse-decode-results.md) from the JSON this script writes."""
    m = result["machine"]
    lines = ["# Sparse decode", "", f"Machine: {m.get('cpu')}, torch {m.get('torch')}, one torch thread, CPU clock; "
             f"load average {', '.join(str(x) for x in m.get('load_average') or ())} (1, 5, 15 min) at the start (a shared machine: the figures are ratios of forms "
             "timed in the same interleaved rounds).", ""]
    for row in result["rows"]:
        lines += [f"## {row['case']}", "", "| form | ms | x ours |", "|---|---|---|"]
        ours = next(iter(row["ms"]))
        for name, value in row["ms"].items():
            lines.append(f"| {name} | {value:.3f} | {value / row['ms'][ours]:.1f} |")
        repeats = row["ratios"] if isinstance(row["ratios"], list) else row["ratios"][row["hf_best"]]
        against = f" against {row['hf_best']}" if "hf_best" in row else ""
        lines += ["", f"Ratio{against}: {row['ratio']:.1f}x (goal >= {row['goal']:.0f}x); per repeat: "
                      + ", ".join(f"{r:.1f}x" for r in repeats) + ".", "", "Ran:", ""]
        ran = row["ran"] if isinstance(row["ran"], dict) else {"sparse": row["ran"]}
        lines += [f"- {name}: {text}" for name, text in ran.items()]
        lines.append("")
    return "\n".join(lines).rstrip("\n")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=None)
    parser.add_argument("--markdown", default=None)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-compile", action="store_true", help="skip HF's compiled StaticCache step")
    parser.add_argument("--tiny", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    set_clock("cpu")
    sizes = TINY if args.tiny else FULL
    rows = [attention_step(sizes, args.rounds, args.repeats)]
    print(json.dumps(rows[-1]), file=sys.stderr)
    rows.append(layer_step(sizes, args.rounds, args.repeats, not args.no_compile))
    result = {"machine": machine.describe(), "rows": rows}
    text = json.dumps(result, indent=1)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(result) + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
