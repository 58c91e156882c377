"""The loops users run, measured there: a whole Hugging Face decoder's decode step with each cache, continuous
batching, a DeepSeek V3 model's step, and (loops_attention.py) sparse decode with fresh lists, sparse prefill
and quantized caches.

- Whole-model decode step: a random-weight Llama-like decoder (Sizes.layers layers, E=1024, H=16, Hkv=4,
  D=64), a prompt of N tokens cached once (by sdpa, copied into every cache), then one-token steps with
  attn_implementation "multihead", "sdpa" and "eager", each with a DynamicCache, a StaticCache (eager) and
  a StaticCache under torch.compile (transformers' static-cache recipe: the forward compiled, default mode).
  Rule: multihead at least as fast as sdpa with each cache (1.0x); best against best: multihead at its
  fastest cache against HF at its fastest (goal 1.3x at 4096 tokens, 2x at 16384).
- Continuous batching: generate_batch over R requests of mixed prompt lengths, tokens/s with
  multihead.hf.PAGED against "sdpa" and "paged|eager" (equal tokens asserted; goal 2x the faster).
- DeepSeek V3 (2 layers, random weights): the decode step through use_latent_cache against HF's DynamicCache
  and StaticCache steps (sdpa), goal 30x HF's best.
Which kernel ran comes from mh.trace() on one step of each multihead row.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass

import torch

import multihead.hf as mhf  # registers multihead's names with transformers, which only this suite needs
from multihead.bench.machine import load_average
from multihead.bench.results import SuiteResult, Target
from multihead.bench.suites import loops_attention
from multihead.bench.suites.context import Context
from multihead.bench.timing import compare, ratio
from multihead.capture import trace

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
IMPLS = ("multihead", "sdpa", "eager")
CACHES = ("dynamic", "static", "static compiled")
COLUMNS = ["loop", "case", "implementation", "ms", "tokens/s", "x ours", "ran", "max |diff|"]
GOAL_STEP, GOAL_BEST = 1.0, {4096: 1.3, 16384: 2.0}
GOAL_BATCH, GOAL_LATENT = 2.0, 30.0


@dataclass(frozen=True)
class Sizes:
    prompts: tuple[int, ...] = (4096, 16384)
    dtypes: tuple[str, ...] = ("bf16", "fp32")
    layers: int = 2
    compiled: bool = True
    batch_requests: tuple[int, ...] = (8, 32)
    batch_new: int = 16
    latent_prompt: int = 4096  # 0: no DeepSeek part
    attention: loops_attention.Sizes | None = loops_attention.Sizes()  # None: no attention loops

    @classmethod
    def full(cls) -> Sizes:
        return cls()

    @classmethod
    def quick(cls) -> Sizes:
        return cls(prompts=(1024,), dtypes=("bf16",), batch_requests=(8,), batch_new=8, latent_prompt=1024,
                   attention=loops_attention.Sizes.quick())


def run(ctx: Context, sizes: Sizes) -> SuiteResult:
    result = SuiteResult("loops", "The loops users run: whole HF models with each cache, continuous batching, "
                         "sparse decode with fresh lists, sparse prefill, quantized caches, DeepSeek V3", COLUMNS)
    parts = [(f"model step N={n} {d}", lambda n=n, d=d: model_step(ctx, sizes, n, d, result))
             for d in sizes.dtypes for n in sizes.prompts]
    parts += [(f"continuous batching R={r}", lambda r=r: batching(ctx, sizes, r, result))
              for r in sizes.batch_requests]
    parts += [("DeepSeek V3 step", lambda: latent_step(ctx, sizes, result))] if sizes.latent_prompt else []
    parts += loops_attention.parts(ctx, sizes.attention, result) if sizes.attention is not None else []
    loads = []
    with ctx.bars.task("loops", total=len(parts)) as steps, torch.no_grad():
        for name, part in parts:
            steps.describe(name)
            loads.append(f"{name}: {load_average()}")
            part()
            steps.advance()
    result.notes.append("load average (1, 5, 15 min) at the start of each part: " + "; ".join(loads))
    return result


def llama(sizes: Sizes, dtype: torch.dtype, positions: int):
    """The random-weight Llama-like decoder (eval, `dtype`)."""
    import transformers as tf

    config = tf.LlamaConfig(vocab_size=1024, hidden_size=1024, intermediate_size=2048,
                            num_hidden_layers=sizes.layers, num_attention_heads=16, num_key_value_heads=4,
                            max_position_embeddings=positions, eos_token_id=None)
    torch.manual_seed(0)
    return tf.LlamaForCausalLM._from_config(config, attn_implementation="sdpa", dtype=dtype).eval()


def kernels_ran(fn) -> str:
    """The backends mh.trace() saw in one call of fn, e.g. "decode x2"."""
    with trace() as t:
        fn()
    return ", ".join(f"{name} x{n}" for name, n in t.backends().items()) or "-"


def model_step(ctx: Context, s: Sizes, N: int, dtype: str, result: SuiteResult) -> None:
    """One-token decode steps of the whole model after an N-token prompt, 3 x 3 ways (see the module docstring)."""
    from transformers import DynamicCache, StaticCache

    headroom = 8 + 2 * (ctx.warmup + 2 * ctx.rounds)
    model = llama(s, DTYPES[dtype], N + headroom)
    prompt = torch.randint(3, 1024, (1, N), generator=torch.Generator().manual_seed(0))
    filled = DynamicCache(config=model.config)
    model(prompt, cache=filled)  # sdpa, once: every cache starts from these keys and values
    token = torch.randint(3, 1024, (1, 1), generator=torch.Generator().manual_seed(1))
    fns, ran = {}, {}
    for impl in IMPLS:
        ours = copy.deepcopy(model)  # one model per implementation: switching costs a walk over the modules
        ours.set_attn_implementation(impl)
        for kind in CACHES if s.compiled else CACHES[:2]:
            if kind == "dynamic":
                cache = copy.deepcopy(filled)
            else:
                cache = StaticCache(config=model.config, max_cache_len=N + headroom)
                for i, layer in enumerate(filled.layers):
                    cache.update(layer.keys.clone(), layer.values.clone(), i)
            fns[(impl, kind)] = _stepper(ours, kind, cache, token)
    first = {}
    for key, fn in fns.items():  # a first step each (compiles where compiled), all at N + 1
        first[key] = fn().float()
        if key[0] == "multihead" and key[1] != "static compiled":
            ran[key] = kernels_ran(fn)
        elif key[0] == "multihead":
            ran[key] = "compiled graph (" + ran.get(("multihead", "static"), "-") + " eager)"
    t = compare({f"{i} + {k}": fn for (i, k), fn in fns.items()}, rounds=ctx.rounds, warmup=ctx.warmup,
                budget_s=ctx.budget_s)
    case = f"N={N} {dtype}, {s.layers} layers"
    for (impl, kind) in fns:
        name, ours = f"{impl} + {kind}", t[f"multihead + {kind}"]
        result.rows.append({"loop": "model decode step", "case": case, "implementation": name,
                            "ms": t[name].median_s * 1e3, "tokens/s": 1 / t[name].median_s,
                            "x ours": ratio(t[name], ours), "ran": ran.get((impl, kind), ""),
                            "max |diff|": (first[(impl, kind)] - first[("sdpa", kind)]).abs().max().item()})
    kinds = [k for k in CACHES if ("sdpa", k) in fns]
    for kind in kinds:
        result.targets.append(Target(f"model step N={N} {dtype} {kind}: sdpa / multihead",
                                     ratio(t[f"sdpa + {kind}"], t[f"multihead + {kind}"]), ">=", GOAL_STEP,
                                     note=f"eager / multihead {ratio(t[f'eager + {kind}'], t[f'multihead + {kind}']):.2f}x"))
    ours = min((f"multihead + {k}" for k in kinds), key=lambda n: t[n].median_s)
    theirs = min((f"{i} + {k}" for i in ("sdpa", "eager") for k in kinds), key=lambda n: t[n].median_s)
    result.targets.append(Target(f"model step N={N} {dtype}: HF's best / multihead's best", ratio(t[theirs], t[ours]),
                                 ">=", GOAL_BEST.get(N, 1.0), note=f"ours: {ours}; HF's: {theirs}"))


def _stepper(model, kind: str, cache, token: torch.Tensor):
    """A one-token step of `model` on `cache` (its forward compiled for "static compiled")."""
    forward = torch.compile(model.forward, dynamic=False) if kind == "static compiled" else model.forward
    return lambda: forward(token, cache=cache, use_cache=True).logits


def batching(ctx: Context, s: Sizes, R: int, result: SuiteResult) -> None:
    """generate_batch over R requests of mixed lengths: tokens/s for PAGED, sdpa and paged|eager."""
    import transformers as tf


    model = llama(Sizes(layers=s.layers), torch.float32, 4096)
    g = torch.Generator().manual_seed(3)
    lengths = torch.randint(64, 512, (R,), generator=g).tolist()
    prompts = [torch.randint(3, 1024, (n,), generator=g).tolist() for n in lengths]
    config = tf.GenerationConfig(max_new_tokens=s.batch_new, do_sample=False, eos_token_id=-1, pad_token_id=0)
    pages = tf.ContinuousBatchingConfig(num_blocks=(sum(lengths) + R * s.batch_new) // 64 + 2 * R,
                                        max_batch_tokens=2048, page_size=64)
    tokens = {}

    def run_with(name):
        def go():
            if name == mhf.PAGED:
                mhf.use_paged(model)
            else:
                model.set_attn_implementation(name)
            out = model.generate_batch(prompts, generation_config=config, continuous_batching_config=pages,
                                       warmup=False)
            tokens[name] = [out[k].generated_tokens for k in sorted(out)]
        return go
    names = (mhf.PAGED, "sdpa", "paged|eager")
    t = compare({n: run_with(n) for n in names}, rounds=max(3, ctx.rounds // 2), warmup=0, budget_s=ctx.budget_s)
    ran = kernels_ran(run_with(mhf.PAGED))
    made = R * s.batch_new
    for n in names:
        result.rows.append({"loop": "continuous batching", "case": f"R={R}, prompts 64..511, {s.batch_new} new each, "
                            f"fp32", "implementation": n, "ms": t[n].median_s * 1e3, "tokens/s": made / t[n].median_s,
                            "x ours": ratio(t[n], t[mhf.PAGED]), "ran": ran if n == mhf.PAGED else "",
                            "max |diff|": None if tokens[n] == tokens["paged|eager"] else float("nan")})
    best = min(names[1:], key=lambda n: t[n].median_s)
    result.targets.append(Target(f"continuous batching R={R}: tokens/s {mhf.PAGED} / the faster of sdpa, paged|eager",
                                 ratio(t[best], t[mhf.PAGED]), ">=", GOAL_BATCH,
                                 note=f"faster: {best}; tokens equal to paged|eager's: "
                                      f"{tokens[mhf.PAGED] == tokens['paged|eager']}"))


def latent_step(ctx: Context, s: Sizes, result: SuiteResult) -> None:
    """A DeepSeek V3 model's decode step: use_latent_cache against HF's DynamicCache and StaticCache (sdpa)."""
    import transformers as tf
    from transformers import DynamicCache, StaticCache


    N = s.latent_prompt
    config = tf.DeepseekV3Config(vocab_size=1024, hidden_size=1024, intermediate_size=2048, num_hidden_layers=2,
                                 num_attention_heads=16, num_key_value_heads=16, q_lora_rank=None, kv_lora_rank=512,
                                 qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128, first_k_dense_replace=2,
                                 max_position_embeddings=N + 64, eos_token_id=None)
    torch.manual_seed(0)
    hf = tf.DeepseekV3ForCausalLM._from_config(config, attn_implementation="sdpa").eval()
    ours = copy.deepcopy(hf)
    mhf.use_latent_cache(ours)
    prompt = torch.randint(3, 1024, (1, N), generator=torch.Generator().manual_seed(0))
    token = prompt[:, -1:]
    caches = {"HF + DynamicCache": DynamicCache(config=config), "HF + StaticCache": StaticCache(
        config=config, max_cache_len=N + 64), "ours: use_latent_cache": DynamicCache(config=config)}
    models = {"HF + DynamicCache": hf, "HF + StaticCache": hf, "ours: use_latent_cache": ours}
    for name, cache in caches.items():
        models[name](prompt, cache=cache)
    fns = {name: (lambda m=models[name], c=caches[name]: m(token, cache=c).logits) for name in caches}
    first = {name: fn().float() for name, fn in fns.items()}
    t = compare(fns, rounds=ctx.rounds, warmup=ctx.warmup, budget_s=ctx.budget_s)
    mine = "ours: use_latent_cache"
    for name in fns:
        result.rows.append({"loop": "DeepSeek V3 step", "case": f"N={N} fp32, 2 layers (MLA, C=512)",
                            "implementation": name, "ms": t[name].median_s * 1e3, "tokens/s": 1 / t[name].median_s,
                            "x ours": ratio(t[name], t[mine]),
                            "ran": kernels_ran(fns[name]) if name == mine else "",
                            "max |diff|": (first[name] - first["HF + DynamicCache"]).abs().max().item()})
    best = min(("HF + DynamicCache", "HF + StaticCache"), key=lambda n: t[n].median_s)
    result.targets.append(Target(f"DeepSeek V3 step N={N}: HF's best / use_latent_cache", ratio(t[best], t[mine]),
                                 ">=", GOAL_LATENT, note=f"HF's best: {best} (eager; the whole model, MLP included)"))
