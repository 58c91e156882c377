"""Every bug id's "learn more" pointer names the topic that teaches that very mistake: the table below says,
for each id, its topic and the message in which that topic shows the mistake live (a check computed on
tensors, in English and Chinese). A new id fails here until someone writes its line."""
from __future__ import annotations

from pathlib import Path

import pytest

from multihead.checker import BUGS, check
from multihead.checker.bugs.catalogue import BUG_BY_ID
from multihead.explain import words
from multihead.explain.topics import TOPICS

# bug id -> (topic, the topic's message that shows this mistake)
POINTERS = {
    "reshape-without-transpose": ("reshape-then-transpose", "check.direct-reshape-mixes-heads"),
    "merge-without-transpose": ("combine-heads", "check.reshape-without-transpose-mixes"),
    "softmax-wrong-axis": ("softmax-axis", "check.rows-no-longer-sum"),
    "missing-scale": ("scale-sqrt-dk", "check.unscaled-softmax-saturates-at"),
    "scale-by-embed-dim": ("scale-sqrt-dk", "check.wrong-factors-flatten"),
    "scale-halved": ("scale-sqrt-dk", "check.wrong-factors-flatten"),
    "scale-by-head-dim": ("scale-sqrt-dk", "check.wrong-factors-flatten"),
    "wrong-scale": ("scale-sqrt-dk", "check.wrong-factors-flatten"),
    "scale-after-softmax": ("scale-sqrt-dk", "check.scaling-after-softmax"),
    "mask-after-softmax": ("masked-fill", "check.mask-after-softmax-loses"),
    "mask-filled-with-zero": ("masked-fill", "check.filling-0-instead-does"),
    "mask-wrong-rows": ("heads-in-batch", "check.while-plain-repeat-would"),
    "no-output-projection": ("linear-d-model", "check.w-o-linear-d"),
    "causal-off-by-one": ("masked-fill", "check.causal-keeps-diagonal"),
    "causal-mask-unused": ("masked-fill", "check.masked-fill-document-001"),
    "causal-mask-reversed": ("masked-fill", "check.causal-keeps-diagonal"),
    "keys-used-as-values": ("keys-vs-values", "check.bug-changes-out"),
    "scores-without-key-transpose": ("k-transpose", "check.without-transpose-matmul-refuses"),
    "view-on-non-contiguous": ("view-vs-contiguous", "check.view-fails-runtimeerror-merging"),
    "forward-misspelled": ("farward-typo", "check.calling-model-raises-notimplementederror"),
    "mask-ignored": ("masked-fill", "check.masked-fill-document-001"),
    "mask-sign-flipped": ("masked-fill", "check.sign-flipped"),
    "kv-heads-tiled": ("gqa-memory", "check.tiling-is-wrong"),
    "rope-half-split-on-interleaved": ("rope", "check.layout-matters"),
    "rope-interleaved-on-half-split": ("rope", "check.layout-matters"),
    "cache-positions-not-offset": ("kv-cache", "check.cache-holds-turned-keys"),
    "cache-causal-top-left": ("kv-cache", "check.top-left-sees-key-0"),
    "mla-absorbed-wuk-transposed": ("mla", "check.scores-absorbed"),
    "mask-inverted": ("masked-fill", "check.blocked-positions-get-exactly"),
    "window-off-by-one": ("window-and-sinks", "check.last-w-keys"),
    "qk-norm-wrong-axis": ("where-heads-live", "check.each-head-has-own"),
    "rope-partial-wrong-features": ("rope", "check.layout-matters"),
    "sparse-none-unmasked": ("sparse-attention", "check.minus-one"),
    "topk-wrong-axis": ("sparse-attention", "check.by-hand-picks"),
}


def test_the_table_covers_every_catalogue_id():
    assert set(POINTERS) == set(BUG_BY_ID)


@pytest.mark.parametrize("bug", BUGS, ids=lambda bug: bug.id)
def test_each_id_points_to_the_topic_that_shows_its_mistake(bug):
    topic, message = POINTERS[bug.id]
    assert bug.topic == topic and topic in TOPICS
    for lang in words.LANGS:
        assert message in words.topic_words(lang, topic), (lang, topic, message)


@pytest.mark.parametrize("lang", ["en", "zh"])
def test_the_report_prints_the_pointer(lang):
    report = check(str(Path(__file__).parent / "check_zoo" / "softmax_over_heads.py:MyMHA"), lang=lang)
    assert report.bug == "softmax-wrong-axis" and "multihead explain softmax-axis" in str(report)
