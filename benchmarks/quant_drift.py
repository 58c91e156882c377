"""Output drift of the quantized KV caches (int8, fp8 e4m3) against an fp32 cache, relative to the largest value.

    python benchmarks/quant_drift.py [--out benchmarks/quant-drift.json] [--tiny]

Two kinds of input:
- random: q, k, v standard normal (B=1, H=Hkv=8, D=128), one decode row over N keys, keys and values
  quantized per token and head, `mh.attention` over the codes against fp32 attention over the float keys;
- llama: a small Llama (transformers' LlamaForCausalLM, random weights: hidden 512, 4 layers, 8 heads,
  2 kv heads) runs a random prompt; its layers' attention (`MultiHeadAttention.from_module`, fp32) take
  each layer's real normalised input, prefill N tokens and decode 16 more over a float cache and over
  each quantized cache; drift of every step's attention output, worst layer.
Drift = max |out - out_fp32| / max |out_fp32|; the bf16 cache is measured beside them for scale.
Writes a JSON with the machine and every figure (docs/decoding.md quotes it).
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import multihead as mh
from multihead.bench import machine
from multihead.caches.quantized import Quantized, quantize

KINDS = {"bf16": None, "int8": torch.int8, "fp8": torch.float8_e4m3fn}


def drift(out: torch.Tensor, ref: torch.Tensor) -> float:
    return ((out.float() - ref.float()).abs().max() / ref.float().abs().max()).item()


def random_drift(N: int) -> dict[str, float]:
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 8, n, 128, generator=g) for n in (1, N, N))
    mask = mh.Mask.causal("bottom_right")
    ref = mh.attention(q, k, v, mask)
    found = {"bf16": drift(mh.attention(q, k.bfloat16().float(), v.bfloat16().float(), mask), ref)}
    for name in ("int8", "fp8"):
        kv = KINDS[name]
        keys, values = Quantized(*quantize(k, kv), kv), Quantized(*quantize(v, kv), kv)
        found[name] = drift(mh.attention(q, keys, values, mask), ref)
    return found


def llama_drift(N: int, steps: int = 16) -> dict[str, float]:
    from transformers import LlamaConfig, LlamaForCausalLM  # noqa: PLC0415 (a tool script: HF only here)

    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=512, intermediate_size=1024, num_hidden_layers=4, num_attention_heads=8,
                         num_key_value_heads=2, vocab_size=1000, max_position_embeddings=N + steps)
    model = LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 1000, (1, N + steps), generator=torch.Generator().manual_seed(1))
    found = dict.fromkeys(KINDS, 0.0)
    with torch.no_grad():
        hidden = model(ids, output_hidden_states=True).hidden_states  # (1, N + steps, E) per layer
        for layer, h in zip(model.model.layers, hidden):
            x = layer.input_layernorm(h)  # what the layer's attention reads
            attn = mh.MultiHeadAttention.from_module(layer.self_attn).eval()
            outs = {}
            for name, kv in {"fp32": None, **KINDS}.items():
                dtype = torch.bfloat16 if name == "bf16" else torch.float32
                cache = attn.new_cache(1, N + steps, dtype=dtype, kv_dtype=kv)
                run = attn.to(dtype)
                parts = [run(x[:, :N].to(dtype), cache=cache)] + [run(x[:, t:t + 1].to(dtype), cache=cache)
                                                                   for t in range(N, N + steps)]
                outs[name] = torch.cat(parts, 1)[:, N:]  # the decode steps
                attn.float()
            for name in KINDS:
                found[name] = max(found[name], drift(outs[name], outs["fp32"]))
    return found


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=str(Path(__file__).parent / "quant-drift.json"))
    parser.add_argument("--tiny", action="store_true", help="small sizes (tests)")
    args = parser.parse_args(argv)
    lengths = (256,) if args.tiny else (1024, 16384)
    result = {"machine": machine.describe(), "rows": []}
    for N in lengths:
        result["rows"].append({"input": "random", "N": N, **random_drift(N)})
    result["rows"].append({"input": "llama", "N": lengths[0] if args.tiny else 1024, **llama_drift(lengths[0])})
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    for row in result["rows"]:
        print(row)
    return result


if __name__ == "__main__":
    main()
