"""Continuous batching on multihead: multihead.hf.PAGED, transformers' generate_batch, equal tokens to paged|eager."""
from __future__ import annotations

import pytest
import torch
import transformers as tf

import multihead as mh
import multihead.hf
from hf_models import VOCAB, tiny_model
from multihead.hf.paged import paged_attention


class Module(torch.nn.Module):
    is_causal = True


def packed(lengths_q, lengths_k, H=4, Hkv=2, D=8, dtype=torch.float32):
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, H, sum(lengths_q), D, generator=g, dtype=torch.float64).to(dtype)
    k, v = (torch.randn(1, Hkv, sum(lengths_k), D, generator=g, dtype=torch.float64).to(dtype) for _ in range(2))
    cu = lambda n: torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32)  # noqa: E731
    return q, k, v, cu(lengths_q), cu(lengths_k)


def reference(q, k, v, cu_q, cu_k, window=None):
    """Each request alone, in float64: causal bottom-right (and a window) within its own keys."""
    out = []
    for r in range(len(cu_q) - 1):
        qr, kr, vr = q[:, :, cu_q[r]:cu_q[r + 1]].double(), k[:, :, cu_k[r]:cu_k[r + 1]].double(), \
            v[:, :, cu_k[r]:cu_k[r + 1]].double()
        kr, vr = (t.repeat_interleave(q.shape[1] // k.shape[1], dim=1) for t in (kr, vr))
        Lq, Lk = qr.shape[2], kr.shape[2]
        i, j = torch.arange(Lq)[:, None] + Lk - Lq, torch.arange(Lk)[None]
        keep = (j <= i) & ((j > i - window) if window else True)
        s = (qr @ kr.transpose(-1, -2) / q.shape[-1] ** 0.5).masked_fill(~keep, float("-inf"))
        out.append((s.softmax(-1) @ vr).transpose(1, 2))
    return torch.cat(out, dim=1)  # (1, Tq, H, D)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
@pytest.mark.parametrize("window", [None, 7])
def test_packed_requests_each_attend_their_own_keys_causal_bottom_right(dtype, tol, window):
    lengths_q, lengths_k = [1, 5, 1, 0, 3], [90, 5, 2100, 4, 70]  # decode steps, a prompt, a chunk, an idle request
    q, k, v, cu_q, cu_k = packed(lengths_q, lengths_k, dtype=dtype)
    out, weights = paged_attention(Module(), q, k, v, None, scaling=q.shape[-1] ** -0.5, sliding_window=window,
                                   cu_seq_lens_q=cu_q, cu_seq_lens_k=cu_k, max_length_q=5, max_length_k=2100)
    assert weights is None and out.shape == (1, sum(lengths_q), 4, 8) and out.dtype == dtype
    assert (out.double() - reference(q, k, v, cu_q, cu_k, window)).abs().max() < tol


def test_lengths_that_do_not_fit_the_packed_tensors_raise():
    q, k, v, cu_q, cu_k = packed([1, 2], [4, 2])
    with pytest.raises(mh.AttentionError, match="cu_seq_lens"):
        paged_attention(Module(), q, k, v, None, cu_seq_lens_q=cu_q, cu_seq_lens_k=cu_k[:-1])
    with pytest.raises(mh.AttentionError, match="only 1 keys"):
        paged_attention(Module(), q, k, v, None, cu_seq_lens_q=cu_q, cu_seq_lens_k=torch.tensor([0, 5, 6]))
    with pytest.raises(mh.AttentionError, match="transformers model"):
        multihead.hf.use_paged(torch.nn.Linear(2, 2))


def test_generate_batch_on_multihead_gives_paged_eagers_tokens():
    model = tiny_model("llama")
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in (70, 9, 66)]
    config = tf.GenerationConfig(max_new_tokens=4, do_sample=False, eos_token_id=-1, pad_token_id=0)
    pages = tf.ContinuousBatchingConfig(num_blocks=16, max_batch_tokens=256, page_size=32)  # sized, not from RAM
    tokens = {}
    for name in ("paged|eager", multihead.hf.PAGED):
        if name == multihead.hf.PAGED:
            assert multihead.hf.use_paged(model) is model
        else:
            model.set_attn_implementation(name)
        with mh.trace() as t:
            out = model.generate_batch(prompts, generation_config=config, continuous_batching_config=pages,
                                     warmup=False)
        assert model.config._attn_implementation == name
        tokens[name] = [out[key].generated_tokens for key in sorted(out)]
    assert tokens["paged|eager"] == tokens[multihead.hf.PAGED] and all(len(t) == 4 for t in tokens["paged|eager"])
    steps = [r for r in t if r.dims[2] == 1]
    assert {r.backend for r in steps if r.dims[3] >= 64} == {"decode"} and len(t) == 2 * (3 + 3 * 3)
