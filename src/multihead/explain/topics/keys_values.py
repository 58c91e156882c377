"""Keys and values: the keys decide where a query looks, the values decide what it fetches, and using
the keys as the values (the checker's bug `keys-used-as-values`) changes the output without an error.

Shapes: B batch, H heads, L tokens (queries and keys), D head dim.
"""
from __future__ import annotations

import math

import torch

import multihead as mh
from multihead.explain.story import Story
from multihead.explain.topics.base import Say, diff_text, max_diff, topic

TOKENS = ["the", "cat", "sat", "on", "it"]


def heads_of(attn: mh.MultiHeadAttention, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v (B, H, L, D) of `attn` on x (B, L, E), split into heads the usual way."""
    B, L, _ = x.shape
    H, D = attn.num_heads, attn.head_dim
    return tuple(proj(x).view(B, L, H, D).transpose(1, 2)   # (B, H, L, D)
                 for proj in (attn.q_proj, attn.k_proj, attn.v_proj))


def attention_weights(q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """softmax(q kᵀ / √D) (B, H, Lq, Lk): made from the queries and the keys alone."""
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)


def keys_as_values(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The bug: the weights multiply the keys instead of the values, (B, H, Lq, D). v is ignored."""
    return attention_weights(q, k) @ k


def recorded_weights(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(output, weights) of mh.attention(q, k, v), the weights as capture_attention records them."""
    with mh.capture_attention() as record:
        out = mh.attention(q, k, v)
    return out, record[0].weights


def tied_module(attn: mh.MultiHeadAttention) -> mh.MultiHeadAttention:
    """A copy of `attn` whose value projection is its key projection (Wv = Wk)."""
    tied = mh.MultiHeadAttention(attn.embed_dim, attn.num_heads, bias=False).double()
    tied.load_state_dict(attn.state_dict())
    with torch.no_grad():
        tied.v_proj.weight.copy_(attn.k_proj.weight)
    return tied


@topic("keys-vs-values")
def keys_vs_values(story: Story, say: Say) -> None:
    torch.manual_seed(0)
    L, E, H = len(TOKENS), 8, 2
    attn = mh.MultiHeadAttention(E, H, bias=False).double()
    x = torch.randn(1, L, E, dtype=torch.float64)                   # (B, L, E)
    q, k, v = heads_of(attn, x)                                     # (B, H, L, D) each
    say.text("text.roles")
    say.code("code.roles")

    say.heading("heading.keys")
    out, weights = recorded_weights(q, k, v)
    other_v = torch.randn_like(v)
    out_other, weights_other = recorded_weights(q, k, other_v)
    story.figure(say("label.weights"), weights[0], tokens=TOKENS)
    say.check("check.weights-from-q-and-k", max_diff(weights, attention_weights(q, k)) < 1e-6,
              diff_text(weights, attention_weights(q, k).float()))
    say.check("check.new-values-same-weights", torch.equal(weights, weights_other) and max_diff(out, out_other) > 0.1,
              say("detail.out-moved", diff=max_diff(out, out_other)))
    _, weights_new_keys = recorded_weights(q, torch.randn_like(k), v)
    say.check("check.new-keys-new-weights", max_diff(weights, weights_new_keys) > 0.01,
              diff_text(weights, weights_new_keys))

    say.heading("heading.values")
    one_hot = torch.eye(L, dtype=torch.float64).expand(1, H, L, L)   # value j = the j-th unit vector
    say.code("code.one-hot")
    fetched = mh.attention(q, k, one_hot)                           # (B, H, L, L)
    say.check("check.one-hot-fetches-weights", max_diff(fetched, attention_weights(q, k)) < 1e-12,
              diff_text(fetched, attention_weights(q, k)))
    say.check("check.out-is-weighted-average", max_diff(out, attention_weights(q, k) @ v) < 1e-12,
              diff_text(out, attention_weights(q, k) @ v))

    say.heading("heading.bug")
    say.code("code.bug")
    wrong = keys_as_values(q, k, v)
    say.check("check.bug-same-shape", wrong.shape == out.shape, f"{say('shape')} {tuple(wrong.shape)}")
    say.check("check.bug-changes-out", max_diff(wrong, out) > 0.1, diff_text(wrong, out))
    say.check("check.bug-equals-keys-passed-as-values", max_diff(wrong, mh.attention(q, k, k)) < 1e-12,
              diff_text(wrong, mh.attention(q, k, k)))
    tied = tied_module(attn)
    tq, tk, tv = heads_of(tied, x)
    say.check("check.bug-hidden-when-tied", max_diff(keys_as_values(tq, tk, tv), mh.attention(tq, tk, tv)) < 1e-12,
              diff_text(keys_as_values(tq, tk, tv), mh.attention(tq, tk, tv)))
    say.text("text.checker")
