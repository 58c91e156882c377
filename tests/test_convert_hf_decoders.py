"""from_module on transformers' own decoder layers: Llama, Mistral, Qwen2, Qwen3, Gemma 2, Gemma 3, Phi-3, GPT-2,
GPT-NeoX.

Each case builds a two-layer model from a tiny random config with transformers' own classes (nothing
downloads; hidden 64, 4 heads, 2 kv heads where the model has GQA, head dim 16, vocab 100, 128
positions), in HF's eager attention. Its attention weights are drawn larger than HF's init so that
scores spread out and every variant (RoPE, window, softcap, scale, qk norms, biases) moves the output.
Forward hooks capture, inside the model's own forward, each attention layer's input hidden states,
position ids and output. The converted layer, fed the same hidden states, must give the same output
within 1e-5 (fp32):
  - over whole sequences: unpadded, left-padded (Mask.key_padding) and right-padded (Mask.lengths);
  - with multihead's KVCache, prefill then one token at a time, against the HF layer fed with HF's own
    DynamicCache; also for a ragged batch, left-padded in HF as generate() pads, right-padded in ours.
"""
from __future__ import annotations

import copy
import re
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import multihead as mh
from multihead.convert.hf.decoders import MODEL_TYPES
from multihead.positions import RoPE

pytestmark = pytest.mark.models
transformers = pytest.importorskip("transformers")

E, H, HKV, D, VOCAB = 64, 4, 2, 16, 100
WINDOW, B, PROMPT, STEPS = 8, 2, 12, 10  # PROMPT + STEPS > WINDOW: windows drop keys in prefill and decode
LENGTH = PROMPT + STEPS
SHORT = PROMPT - 5  # the ragged batch's second prompt
TOLERANCE = 1e-5
SMALL = dict(hidden_size=E, num_hidden_layers=2, num_attention_heads=H, num_key_value_heads=HKV, head_dim=D,
             vocab_size=VOCAB, max_position_embeddings=128, intermediate_size=2 * E)
GPT2 = dict(n_embd=E, n_layer=2, n_head=H, vocab_size=VOCAB, n_positions=128, bos_token_id=0, eos_token_id=0)
NEOX = dict(hidden_size=E, num_hidden_layers=2, num_attention_heads=H, vocab_size=VOCAB,
            max_position_embeddings=128, intermediate_size=2 * E, rotary_emb_base=500, rotary_pct=0.25)
LLAMA3_ROPE = {"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32, "rope_theta": 10000.0}
PHI3_LONGROPE = {"rope_type": "longrope", "rope_theta": 10000.0, "long_factor": [1.0 + 0.5 * i for i in range(D // 4)],
                 "short_factor": [1.0 + 0.1 * i for i in range(D // 4)]}
SLIDING_FROM_LAYER_1 = dict(use_sliding_window=True, sliding_window=WINDOW, max_window_layers=1)

# What a converted layer must carry, unless a case says otherwise. window and scale: per layer (None:
# none / 1/sqrt(D)); rope: (kind, base, rotary dim) or None; bias: (q, k, v have one, o has one).
PLAIN = {"kv_heads": HKV, "rope": ("default", 10000.0, D), "window": (None, None), "softcap": None,
         "scale": (None, None), "qk_norm": False, "bias": (False, False), "gate": False, "differential": False,
         "chunk_size": None, "temperature": False}
# Llama 4 counts chunks and query temperature from each row's first buffer slot, pads included, where ours
# counts each sequence's own positions: equal unpadded and right-padded, not left-padded.
COUNTS_PADS = ("llama4",)
GPT2_CARRIES = {"kv_heads": H, "rope": None, "bias": (True, True)}
# case -> (config class, its arguments, what differs from PLAIN)
CASES = {
    "llama": ("LlamaConfig", SMALL, {}),
    "llama-bias-linear-rope": ("LlamaConfig", dict(SMALL, attention_bias=True, rope_parameters={
        "rope_type": "linear", "factor": 2.0, "rope_theta": 500.0}),
        {"bias": (True, True), "rope": ("linear", 500.0, D)}),
    # max_position_embeddings 16 < LENGTH: dynamic NTK grows the base while decoding past it
    "llama-dynamic-rope": ("LlamaConfig", dict(SMALL, max_position_embeddings=16, rope_parameters={
        "rope_type": "dynamic", "factor": 2.0, "rope_theta": 10000.0}), {"rope": ("dynamic", 10000.0, D)}),
    "llama-llama3-rope": ("LlamaConfig", dict(SMALL, rope_parameters=LLAMA3_ROPE), {"rope": ("llama3", 10000.0, D)}),
    "mistral": ("MistralConfig", dict(SMALL, sliding_window=WINDOW), {"window": (WINDOW, WINDOW)}),
    "qwen2": ("Qwen2Config", dict(SMALL, **SLIDING_FROM_LAYER_1), {"window": (None, WINDOW), "bias": (True, False)}),
    "qwen3": ("Qwen3Config", dict(SMALL, **SLIDING_FROM_LAYER_1), {"window": (None, WINDOW), "qk_norm": True}),
    "gemma2": ("Gemma2Config", dict(SMALL, query_pre_attn_scalar=24, sliding_window=WINDOW,
                                    attn_logit_softcapping=3.0),
               {"window": (WINDOW, None), "softcap": 3.0, "scale": (24 ** -0.5,) * 2}),
    # sliding layer 0 turns with the local base, full layer 1 with the global one; norms scale by 1 + weight
    "gemma3": ("Gemma3TextConfig", dict(SMALL, query_pre_attn_scalar=24, sliding_window=WINDOW,
                                        layer_types=["sliding_attention", "full_attention"], rope_parameters={
                                            "sliding_attention": {"rope_type": "default", "rope_theta": 500.0},
                                            "full_attention": {"rope_type": "default", "rope_theta": 20000.0}}),
               {"window": (WINDOW, None), "scale": (24 ** -0.5,) * 2, "qk_norm": True,
                "rope": [("default", 500.0, D), ("default", 20000.0, D)]}),
    # full-attention layers only (the linear-attention ones are not attention); an output gate, partial rotary
    "qwen3_next": ("Qwen3NextConfig", dict(SMALL, layer_types=["full_attention"] * 2, partial_rotary_factor=0.5,
                                           num_experts=2, num_experts_per_tok=1, moe_intermediate_size=16,
                                           shared_expert_intermediate_size=16),
                   {"qk_norm": True, "rope": ("default", 10000.0, D // 2), "gate": True}),
    "diffllama": ("DiffLlamaConfig", dict(SMALL, lambda_std_dev=0.3), {"differential": True}),
    # layer 0: interleaved RoPE, weightless qk norm, chunks of 5; layer 1: NoPE with query temperature
    "llama4": ("Llama4TextConfig", dict(SMALL, intermediate_size_mlp=2 * E, num_local_experts=2,
                                        interleave_moe_layer_step=2, no_rope_layers=[1, 0], attention_chunk_size=5,
                                        floor_scale=4, attn_scale=0.5, use_qk_norm=True,
                                        rope_parameters={"rope_type": "default", "rope_theta": 10000.0}),
               {"rope": [("default", 10000.0, D), None], "qk_norm": [True, False], "chunk_size": [5, None],
                "temperature": [False, True]}),
    # one qkv_proj cut unevenly (GQA); LongRoPE on half of each head: past 16 positions the long factors turn
    "phi3": ("Phi3Config", dict(SMALL, original_max_position_embeddings=16, partial_rotary_factor=0.5, pad_token_id=0,
                                rope_parameters=PHI3_LONGROPE), {"rope": ("longrope", 10000.0, D // 2)}),
    "gpt2": ("GPT2Config", GPT2, GPT2_CARRIES),
    # layer i divides the scores by i + 1 as well: layer 0 keeps 1/sqrt(D), layer 1 has half of it
    "gpt2-scaled-by-layer": ("GPT2Config", dict(GPT2, scale_attn_by_inverse_layer_idx=True,
                                                reorder_and_upcast_attn=True),
                             dict(GPT2_CARRIES, scale=(None, D ** -0.5 / 2))),
    "gpt_neox": ("GPTNeoXConfig", NEOX, {"kv_heads": H, "rope": ("default", 500.0, 4), "bias": (True, True)}),
}


def build(case: str):
    """The case's model (AutoModel: no LM head), eager attention, eval mode, sharpened attention weights."""
    torch.manual_seed(0)
    config_class, arguments, _ = CASES[case]
    config = getattr(transformers, config_class)(**arguments)
    model = transformers.AutoModel.from_config(config, attn_implementation="eager").eval()
    with torch.no_grad():
        for layer in attention_layers(model):
            for name, p in layer.named_parameters():
                if p.dim() == 2:
                    p.normal_(0.0, 0.2)  # HF's std 0.02 would leave every score near 0
                elif "norm" in name:
                    p.copy_(1.0 + 0.2 * torch.randn_like(p))
                else:
                    p.normal_(0.0, 0.3)
    return model


def attention_layers(model) -> list[torch.nn.Module]:
    """layer.self_attn (Llama family), layer.attn (GPT-2) or layer.attention (GPT-NeoX) of every layer."""
    layers = model.h if hasattr(model, "h") else model.layers
    return [next(getattr(layer, name) for name in ("self_attn", "attn", "attention") if hasattr(layer, name))
            for layer in layers]


@dataclass
class Captured:
    """One call of one HF attention layer: hidden (B, L, E) in, positions (B, L), output (B, L, E)."""

    hidden: torch.Tensor
    positions: torch.Tensor | None
    output: torch.Tensor


def run_hf(model, calls: list[dict], use_cache: bool = False) -> list[list[Captured]]:
    """Run model(**call) for each call (threading one DynamicCache through when use_cache) and return,
    per attention layer, what each call passed through it."""
    captured = [[] for _ in attention_layers(model)]  # [layer][call]

    def hook(index):
        def record(module, args, kwargs, output):
            hidden = args[0] if args else kwargs["hidden_states"]
            captured[index].append(Captured(hidden, kwargs.get("position_ids"), output[0]))
        return record

    layers = attention_layers(model)
    handles = [layer.register_forward_hook(hook(i), with_kwargs=True) for i, layer in enumerate(layers)]
    cache = transformers.DynamicCache(config=model.config) if use_cache else None
    try:
        with torch.no_grad():
            for call in calls:
                model(**call, past_key_values=cache, use_cache=use_cache)
    finally:
        for handle in handles:
            handle.remove()
    assert all(len(layer_calls) == len(calls) for layer_calls in captured)
    return captured


def token_ids(length: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (B, length), generator=torch.Generator().manual_seed(1))


def padded(padding: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(HF attention_mask (B, LENGTH), 1 = token, position_ids (B, LENGTH)): sequence 1 has 5 pads, or none.
    Left padding counts positions from each first token, as generate() does."""
    keep = torch.ones(B, LENGTH, dtype=torch.long)
    if padding == "left":
        keep[1, :5] = 0
    elif padding == "right":
        keep[1, -5:] = 0
    positions = (keep.cumsum(-1) - 1).clamp(min=0) if padding == "left" else torch.arange(LENGTH).expand(B, -1)
    return keep, positions


def report(case: str, what: str, diff: float) -> None:
    print(f"max |ours - HF| {case:24s} {what:28s} {diff:.2e}")  # shown with pytest -s
    assert diff <= TOLERANCE, f"{case} {what}: {diff:.2e} > {TOLERANCE}"


@pytest.mark.parametrize("padding", ["none", "left", "right"])
@pytest.mark.parametrize("case", CASES)
def test_layer_matches_hf_inside_the_full_forward(case, padding):
    if padding == "left" and case in COUNTS_PADS:
        pytest.skip("this family counts positions from the first buffer slot, pads included (see COUNTS_PADS)")
    model = build(case)
    keep, positions = padded(padding)
    captured = run_hf(model, [dict(input_ids=token_ids(LENGTH), attention_mask=keep, position_ids=positions)])
    masks = {"none": None, "left": mh.Mask.key_padding(keep == 0), "right": mh.Mask.lengths(keep.sum(-1))}
    valid = keep.bool()  # padded queries' outputs mean nothing in either
    worst = 0.0
    for layer, (call,) in zip(attention_layers(model), captured):
        ours = mh.MultiHeadAttention.from_module(layer)
        with torch.no_grad():
            out = ours(call.hidden, positions=positions if call.positions is None else call.positions,
                       mask=masks[padding])
        worst = max(worst, (out - call.output)[valid].abs().max().item())
    report(case, f"full forward, {padding} pad", worst)


@pytest.mark.parametrize("case", CASES)
def test_cache_decode_matches_hf_with_its_dynamic_cache(case):
    model = build(case)
    ids = token_ids(LENGTH)
    calls = [dict(input_ids=ids[:, :PROMPT])] + [dict(input_ids=ids[:, t:t + 1]) for t in range(PROMPT, LENGTH)]
    worst = 0.0
    for layer, layer_calls in zip(attention_layers(model), run_hf(model, calls, use_cache=True)):
        ours = mh.MultiHeadAttention.from_module(layer)
        cache = ours.new_cache(B, LENGTH)
        with torch.no_grad():
            for call in layer_calls:  # prefill, then one token per step; positions come from the cache
                worst = max(worst, (ours(call.hidden, cache=cache) - call.output).abs().max().item())
    report(case, "KV cache, prefill + decode", worst)


def _left_to_right(x: torch.Tensor, pads: torch.Tensor) -> torch.Tensor:
    """(B, L, ...) left-padded -> right-padded: row b rolled back by its pads[b]."""
    return torch.stack([row.roll(-int(p), dims=0) for row, p in zip(x, pads)])


@pytest.mark.parametrize("case", CASES)
def test_ragged_cache_decode_matches_hf_left_padded(case):
    """HF: prompts left-padded, positions counted from each first token, the mask grown each step.
    Ours: the same prompts right-padded, prefilled with Mask.lengths(lens, query_lens=lens)."""
    if case in COUNTS_PADS:
        pytest.skip("this family counts positions from the first buffer slot, pads included (see COUNTS_PADS)")
    model = build(case)
    ids = token_ids(LENGTH)
    lens = torch.tensor([PROMPT, SHORT])
    pads = PROMPT - lens
    keep = (torch.arange(PROMPT) >= pads[:, None]).long()  # (B, PROMPT), 0 = left pad
    calls = [dict(input_ids=ids[:, :PROMPT], attention_mask=keep, position_ids=(keep.cumsum(-1) - 1).clamp(min=0))]
    calls += [dict(input_ids=ids[:, PROMPT + t:PROMPT + t + 1], position_ids=(lens + t)[:, None],
                   attention_mask=torch.cat([keep, torch.ones(B, t + 1, dtype=torch.long)], dim=1))
              for t in range(STEPS)]
    valid = torch.arange(PROMPT) < lens[:, None]  # (B, PROMPT) in ours' right-padded layout
    worst = 0.0
    for layer, (prefill, *steps) in zip(attention_layers(model), run_hf(model, calls, use_cache=True)):
        ours = mh.MultiHeadAttention.from_module(layer)
        cache = ours.new_cache(B, LENGTH)
        with torch.no_grad():
            out = ours(_left_to_right(prefill.hidden, pads), cache=cache, mask=mh.Mask.lengths(lens, query_lens=lens))
            worst = max(worst, (out - _left_to_right(prefill.output, pads))[valid].abs().max().item())
            for call in steps:
                worst = max(worst, (ours(call.hidden, cache=cache) - call.output).abs().max().item())
        assert torch.equal(cache.lengths, lens + STEPS)
    report(case, "KV cache, ragged batch", worst)


def _carried(mod: mh.MultiHeadAttention) -> dict:
    """What a converted layer carries, in the shape of PLAIN (window and scale: this layer's own)."""
    rope = None if mod.rope is None else (mod.rope.scaling.kind, mod.rope.base, mod.rope.rotary_dim)
    return {"kv_heads": mod.num_kv_heads, "rope": rope, "window": mod.window, "softcap": mod.softcap,
            "scale": mod.scale, "qk_norm": mod.q_norm is not None,
            "bias": (mod.q_proj.bias is not None, mod.out_proj.bias is not None),
            "gate": isinstance(mod, mh.GatedMultiHeadAttention),
            "differential": isinstance(mod, mh.DifferentialAttention), "chunk_size": mod.chunk_size,
            "temperature": mod.temperature is not None}


def _without(variant: str, mod: mh.MultiHeadAttention) -> mh.MultiHeadAttention:
    """A copy of `mod` with one carried-over variant turned off (plain_rope: unscaled, all D features)."""
    mod = copy.deepcopy(mod)
    if variant == "plain_rope":
        mod.rope = RoPE(mod.head_dim, base=mod.rope.base)
    elif variant == "qk_norm":
        mod.q_norm = mod.k_norm = None
    elif variant == "bias":
        for proj in (mod.q_proj, mod.k_proj, mod.v_proj):
            proj.bias = None
    elif variant == "gate":
        mod.gate_heads = lambda merged, query: merged
    elif variant == "differential":  # lambda 0: the second map of each pair no longer subtracts
        mod.lambda_full = lambda dtype: torch.zeros((), dtype=dtype)
    else:
        setattr(mod, variant, None)
    return mod


@pytest.mark.parametrize("case", CASES)
def test_converted_layers_carry_each_variant_and_each_one_matters(case):
    """Every variant the config sets is on the converted layer, and turning any one of them off moves
    the output well away from HF's: the equality tests above would catch a converter that dropped it."""
    model = build(case)
    captured = run_hf(model, [dict(input_ids=token_ids(LENGTH))])
    expected = dict(PLAIN, **CASES[case][2])
    for index, (layer, (call,)) in enumerate(zip(attention_layers(model), captured)):
        ours = mh.MultiHeadAttention.from_module(layer)
        want = dict(expected, window=expected["window"][index], scale=expected["scale"][index])
        want = {key: value[index] if isinstance(value, list) else value for key, value in want.items()}  # per layer
        got = _carried(ours)
        assert got == want, f"layer {index}"
        assert ours.causal and ours.batch_first and not ours.training
        present = [name for name in ("rope", "window", "softcap", "scale", "qk_norm", "gate", "differential",
                                     "chunk_size", "temperature") if got[name]]
        present += ["bias"] if got["bias"][0] else []
        present += ["plain_rope"] if got["rope"] and got["rope"] != ("default", got["rope"][1], D) else []
        for variant in present:
            with torch.no_grad():
                moved = (_without(variant, ours)(call.hidden) - call.output).abs().max().item()
            assert moved > 1e-2, f"layer {index} without {variant} moved only {moved:.1e}"


# --- what does not convert ----------------------------------------------------------------------

def _one_layer(config_class: str, **arguments):
    config = getattr(transformers, config_class)(**arguments)
    return attention_layers(transformers.AutoModel.from_config(config, attn_implementation="eager"))[0]


def test_other_models_with_the_same_projection_names_are_refused():
    """Cohere names q_proj ... o_proj too but turns interleaved pairs: its conventions are not Llama's."""
    layer = _one_layer("CohereConfig", **{k: v for k, v in SMALL.items() if k != "head_dim"})
    with pytest.raises(mh.AttentionError, match="'cohere' model; expected one of"):
        mh.MultiHeadAttention.from_module(layer)


def test_rope_kinds_multihead_does_not_compute_are_refused():
    layer = _one_layer("LlamaConfig", **SMALL)
    layer.config.rope_parameters = {"rope_type": "ntk-by-parts", "factor": 2.0, "rope_theta": 10000.0}  # a kind to come
    with pytest.raises(mh.AttentionError, match="rope_parameters.*ntk-by-parts"):
        mh.MultiHeadAttention.from_module(layer)


def test_bidirectional_sliding_window_is_refused():
    layer = _one_layer("Gemma2Config", **dict(SMALL, sliding_window=WINDOW, use_bidirectional_attention=True))
    with pytest.raises(mh.AttentionError, match="bidirectional with a sliding window of 8"):
        mh.MultiHeadAttention.from_module(layer)


def test_gpt2_cross_attention_is_refused():
    from transformers.models.gpt2.modeling_gpt2 import GPT2Attention

    layer = GPT2Attention(transformers.GPT2Config(**GPT2), is_cross_attention=True, layer_idx=0)
    with pytest.raises(mh.AttentionError, match="cross-attention"):
        mh.MultiHeadAttention.from_module(layer)


def test_qk_norms_must_be_a_pair_of_plain_rms_norms():
    from transformers.models.gemma3.modeling_gemma3 import Gemma3RMSNorm

    layer = _one_layer("Qwen3Config", **SMALL)
    layer.q_norm = Gemma3RMSNorm(D)  # scales by (1 + weight): not what Qwen3's norms do
    with pytest.raises(mh.AttentionError, match="q_norm .Gemma3RMSNorm. does not compute"):
        mh.MultiHeadAttention.from_module(layer)
    layer.q_norm = None
    with pytest.raises(mh.AttentionError, match="only one of q_norm / k_norm"):
        mh.MultiHeadAttention.from_module(layer)


def test_a_whole_decoder_layer_is_not_attention():
    config = transformers.LlamaConfig(**SMALL)
    block = transformers.AutoModel.from_config(config).layers[0]
    with pytest.raises(mh.AttentionError, match="cannot recognise LlamaDecoderLayer"):
        mh.MultiHeadAttention.from_module(block)


# --- docs/hf-decoders.md cannot drift -------------------------------------------------------------

DOC = Path(__file__).resolve().parents[1] / "docs" / "hf-decoders.md"


def test_docs_table_lists_exactly_the_models_that_convert():
    listed = re.findall(r"^\| `(\w+)` \|", DOC.read_text(), flags=re.M)
    assert listed == [*MODEL_TYPES, "gpt2", "gpt_neox"]
    tested = {transformers.AutoConfig.for_model(t).model_type for t in listed}  # every row is a real model type
    assert tested == {getattr(transformers, config_class).model_type for config_class, _, _ in CASES.values()}


def test_docs_example_prints_what_the_page_shows(capsys):
    code, shown = re.search(r"```python\n(.*?)```\n```\n(.*?)```", DOC.read_text(), flags=re.S).groups()
    exec(compile(code, str(DOC), "exec"), {})
    assert capsys.readouterr().out == shown
