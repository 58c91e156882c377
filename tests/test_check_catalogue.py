"""The bug catalogue: the correct variant is multi-head attention, every form of every bug differs
from it, every id has its explain topic and its explanation in English and Chinese."""
from __future__ import annotations

import pytest
import torch

from helpers import reference_mha
from multihead.checker.bugs.catalogue import (BUG_BY_ID, BUGS, FILLS_BLOCKED, NEEDS_CAUSAL, NEEDS_MASK, NEEDS_USER_MASK,
                                        SCALE_FORMS, forms_to_try, reference_variant)
from multihead.checker.roles.assign import Weights
from multihead.checker.bugs.sentences import BUG_TEXT, say
from multihead.explain.topics import TOPICS

REQUIRED = {"reshape-without-transpose", "merge-without-transpose", "softmax-wrong-axis", "missing-scale",
            "scale-by-embed-dim", "scale-after-softmax", "mask-after-softmax", "no-output-projection",
            "causal-off-by-one", "keys-used-as-values", "scores-without-key-transpose",
            "view-on-non-contiguous", "forward-misspelled", "scale-halved", "scale-by-head-dim",
            "mask-wrong-rows", "mask-filled-with-zero"}

def _weights(E=12, H=3, seed=0):
    gen = torch.Generator().manual_seed(seed)
    make = lambda rows, cols: (torch.randn(rows, cols, generator=gen, dtype=torch.float64),  # noqa: E731
                               torch.randn(rows, generator=gen, dtype=torch.float64))
    return Weights(make(E, E), make(E, E), make(E, E), make(E, E), num_heads=H)

def _inputs(B=2, Lq=5, Lk=5, E=12, seed=1):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(B, L, E, generator=gen, dtype=torch.float64) for L in (Lq, Lk, Lk)]

def test_catalogue_has_every_required_id():
    assert {bug.id for bug in BUGS} >= REQUIRED

# A topic planned with its explain page in the same release: until that page lands, its absence skips.
PLANNED_TOPICS = {"keys-vs-values"}


@pytest.mark.parametrize("bug", BUGS, ids=lambda bug: bug.id)
def test_every_topic_exists_in_explain(bug):
    if bug.topic in PLANNED_TOPICS and bug.topic not in TOPICS:
        pytest.skip(f"explain topic {bug.topic} is not in this tree yet")
    assert bug.topic in TOPICS, bug

@pytest.mark.parametrize("bug_id", sorted(BUG_BY_ID))
def test_every_bug_is_explained_in_english_and_chinese(bug_id):
    values = {"method": "farward", "param": "mask", "blocked": "1", "wanted": "0", "claim": "keep", "got": 5,
              "want": 4, "name": "window", "turned": "2-3", "dim": 4}  # what each text's placeholders take
    english, chinese = (say(bug_id, lang, **values) for lang in ("en", "zh"))
    assert english != chinese and len(english) > 30
    assert any("\u4e00" <= ch <= "\u9fff" for ch in chinese)
    assert set(BUG_TEXT) == set(BUG_BY_ID)

@pytest.mark.parametrize("causal", [False, True])
def test_correct_variant_is_multi_head_attention(causal):
    w = _weights()
    xq, xk, xv = _inputs()
    keep = torch.rand(2, 1, 5, 5, generator=torch.Generator().manual_seed(3)) < 0.7
    keep[..., 0] = True
    full_keep = keep & torch.ones(5, 5, dtype=torch.bool).tril() if causal else keep
    got = reference_variant(xq, xk, xv, w, keep, causal=causal)
    want = reference_mha(xq, xk, xv, wq=w.q[0], bq=w.q[1], wk=w.k[0], bk=w.k[1], wv=w.v[0], bv=w.v[1],
                         wo=w.o[0], bo=w.o[1], num_heads=3, keep_mask=full_keep)
    assert torch.allclose(got, want, atol=1e-12, rtol=1e-12)

def test_correct_variant_with_shared_key_value_heads():
    """4 query heads, 2 kv heads: the same as 4 full heads whose k/v rows repeat each kv head twice."""
    w = _weights(E=12, H=4)
    D = 3
    shared = Weights(w.q, (w.k[0][:2 * D], w.k[1][:2 * D]), (w.v[0][:2 * D], w.v[1][:2 * D]), w.o, num_heads=4)
    assert shared.num_kv_heads == 2
    rows = ((torch.arange(4) // 2)[:, None] * D + torch.arange(D)).flatten()  # query head h reads kv head h // 2
    xq, xk, xv = _inputs()
    want = reference_mha(xq, xk, xv, wq=w.q[0], bq=w.q[1], wk=shared.k[0][rows], bk=shared.k[1][rows],
                         wv=shared.v[0][rows], bv=shared.v[1][rows], wo=w.o[0], bo=w.o[1], num_heads=4)
    torch.testing.assert_close(reference_variant(xq, xk, xv, shared, None), want, atol=1e-12, rtol=1e-12)


@pytest.mark.parametrize("form", [form for bug in BUGS for form in bug.forms])
def test_every_form_differs_from_the_correct_maths(form):
    w = _weights()
    E, H = 12, 3
    D = E // H
    square = form == "scores-q-times-k"  # q @ k only runs when L == D
    xq, xk, xv = _inputs(Lq=D if square else 5, Lk=D if square else 6)
    keep = None
    if form in NEEDS_MASK | NEEDS_USER_MASK | set(FILLS_BLOCKED):  # batch row b blocks its last b + 1 keys
        keep = torch.ones(2, 1, xq.shape[1], xk.shape[1], dtype=torch.bool)
        keep[0, ..., -1:] = False
        keep[1, ..., -2:] = False
    causal = form in NEEDS_CAUSAL
    if causal:
        xk, xv = xk[:, : xq.shape[1]], xv[:, : xq.shape[1]]
    if form == "kv-heads-tiled":  # only shows with 2 or more kv heads, each shared by a group
        w = _weights(E=12, H=4)
        w = Weights(w.q, (w.k[0][:6], w.k[1][:6]), (w.v[0][:6], w.v[1][:6]), w.o, num_heads=4)
    right = reference_variant(xq, xk, xv, w, keep, causal=causal)
    if form == "merge-by-view":
        with pytest.raises(RuntimeError, match="view size is not compatible"):
            reference_variant(xq, xk, xv, w, keep, causal=causal, mistake=form)
        return
    wrong = reference_variant(xq, xk, xv, w, keep, causal=causal, mistake=form, fill=-1e9)
    assert wrong.shape == right.shape
    assert (wrong - right).abs().max() > 1e-3

def test_forms_to_try_leave_out_what_cannot_show():
    plain = forms_to_try(has_mask=False, causal=False)
    assert not (set(plain) & (NEEDS_MASK | NEEDS_USER_MASK | NEEDS_CAUSAL))
    assert set(forms_to_try(has_mask=True, causal=True)) >= NEEDS_MASK | NEEDS_USER_MASK | NEEDS_CAUSAL
    assert not set(forms_to_try(has_mask=False, causal=True)) & NEEDS_USER_MASK
    assert "skip-output-projection" in plain
    assert not set(plain) & set(SCALE_FORMS)  # scales are measured (scale.py), not tried one by one


def test_every_message_has_both_languages_with_the_same_placeholders():
    import string

    from multihead.checker.bugs import sentences as text

    for table in (text.MESSAGES, text.CONVENTION_TEXT, text.BUG_TEXT, text.MASK_TEXT, text.ROLE_TEXT, text.STAGE_TEXT):
        for key, (english, chinese) in table.items():
            fields = [{name for _, name, _, _ in string.Formatter().parse(t) if name} for t in (english, chinese)]
            assert fields[0] == fields[1], key
            assert any("\u4e00" <= ch <= "\u9fff" for ch in chinese), key
