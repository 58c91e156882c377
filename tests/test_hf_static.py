"""StaticCache (eager and compiled): the keep mask over the static slots is read as lengths, so the decode step
runs the decode kernel, and the tokens and logits equal eager's."""
from __future__ import annotations

import pytest
import torch

import multihead as mh
import multihead.hf  # noqa: F401  (registers "multihead")
from hf_models import VOCAB, switch, tiny_model
from multihead.hf.masks import hf_mask

PROMPT, NEW = 80, 6  # the decode kernel takes calls from 64 keys on


def prompt(B: int = 2) -> torch.Tensor:
    return torch.randint(3, VOCAB, (B, PROMPT), generator=torch.Generator().manual_seed(1))


def greedy(model, implementation: str, **options):
    switch(model, implementation)
    out = model.generate(prompt(), max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, pad_token_id=0,
                         attention_mask=torch.ones(2, PROMPT, dtype=torch.long), cache_implementation="static",
                         output_logits=True, return_dict_in_generate=True, **options)
    return out.sequences, torch.stack(out.logits)  # (B, PROMPT + NEW), (NEW, B, V)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-4), (torch.bfloat16, 0.1)])
def test_static_cache_steps_run_the_decode_kernel_with_eagers_tokens_and_logits(dtype, tol):
    model = tiny_model("llama").to(dtype)
    tokens, logits = greedy(model, "eager")
    with mh.trace() as t:
        ours, our_logits = greedy(model, "multihead")
    assert torch.equal(ours, tokens)
    assert (our_logits.float() - logits.float()).abs().max() < tol
    steps = [r for r in t if r.dims[2] == 1]
    assert len(steps) == 2 * (NEW - 1) and {r.backend for r in steps} == {"decode"}
    assert {r.dims[3] for r in steps} == {PROMPT + NEW - 1}  # every static slot is passed; lengths keep the real ones


def test_the_static_slots_mask_keeps_what_hfs_mask_keeps_with_a_tensor_offset():
    from transformers import masking_utils as hf
    for q_offset, Lq in ((0, 5), (7, 1), (7, 3)):
        mask = hf_mask(2, Lq, 16, torch.tensor(q_offset), 0, hf.causal_mask_function)
        expected = hf.sdpa_mask(2, Lq, 16, q_offset, 0, hf.causal_mask_function, allow_is_causal_skip=False)
        keep, _ = mask.materialize(2, 1, Lq, 16)
        assert torch.equal(keep.expand(2, 1, Lq, 16), expected.expand(2, 1, Lq, 16))
        assert mask.normal_form().intervals_only


def test_compiled_static_cache_runs_the_decode_kernel_in_its_graph_with_eagers_tokens():
    """transformers' static-cache recipe: model.forward compiled, generate(cache_implementation="static")."""
    model = tiny_model("llama")
    tokens, logits = greedy(model, "eager")
    switch(model, "multihead")
    graphs = []

    def keep_graph(gm, inputs):
        graphs.append(gm.code)
        return gm.forward

    torch._dynamo.reset()
    model.forward = torch.compile(model.forward, backend=keep_graph, dynamic=False)
    ours, our_logits = greedy(model, "multihead")
    assert torch.equal(ours, tokens) and (our_logits - logits).abs().max() < 1e-4
    steps = [code for code in graphs if "multihead.decode_step" in code]
    assert steps and not any("scaled_dot_product_attention" in code for code in steps)
