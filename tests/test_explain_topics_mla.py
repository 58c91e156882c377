"""The facts behind the mla topic, tested directly: cache bytes from the formulas, and a broken absorption
shows up as failed checks."""
from __future__ import annotations

import torch

from multihead.explain.story import Story
from multihead.explain.topics import TOPICS
from multihead.explain.topics.models import latent as mla_topic
from multihead.layers.latent import MultiHeadLatentAttention


def test_cache_bytes_per_token_follow_the_formulas():
    got = mla_topic.per_token_bytes(torch.float32)
    D = 2048 // 16
    assert got == {"MHA (Hkv = 16)": 2 * 16 * D * 4, "GQA (Hkv = 4)": 2 * 4 * D * 4, "MQA (Hkv = 1)": 2 * D * 4,
                   "MLA": (512 + 64) * 4}


def test_a_transposed_w_uk_fails_the_proof(monkeypatch):
    def wrong_halves(self):
        w_uk, w_uv = original(self)
        flipped = w_uk.flip(1)  # rows of W_UK in the wrong order: a learner's mix-up of the head layout
        return flipped, w_uv

    original = MultiHeadLatentAttention.up_weights
    monkeypatch.setattr(MultiHeadLatentAttention, "up_weights", wrong_halves)
    story = Story()
    TOPICS["mla"].run(story)
    failed = " | ".join(story.failed_checks)
    assert "absorb=True" in failed and "one token at a time" in failed  # the module's two forms disagree
