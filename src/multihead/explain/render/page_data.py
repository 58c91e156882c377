"""The numbers behind the interactive page's views, as plain JSON-ready data.

An explorer is a grid of rows (a model's layers, or the calls a capture recorded) by heads, with
every head's attention weights; the page draws it as the model view and the head view. A row may
also carry a trace: the real tensors of the walkthrough run on that layer (q, k, v, scores, scaled,
weights, ctx, out) and the walkthrough's checks for each step, in both languages; the page's step
view shows them for one chosen head and query token.

Numbers are rounded to the DECIMALS decimals the page shows and stored flat with their shape:
{"shape": [H, L, L], "data": [...]}, row-major. Of a vector (a token's q, k, v, ctx or out) only the
first SHOWN numbers are kept, the ones the page shows; the scores and weights are kept whole.
Shapes: H heads, Lq/Lk queries/keys, L tokens, D head dim, O output features.
"""
from __future__ import annotations

import math
import re
from typing import Any

import torch

from multihead.explain.story import LANGS, Story
from multihead.explain.walkthrough.steps import tell

DECIMALS = 4
SHOWN = 8
STEP_HEADING = re.compile(r"^(?:Step (\d+) ·|第 (\d+) 步 ·)")


def flat(t: torch.Tensor) -> dict[str, Any]:
    """{"shape": [...], "data": [...]}: t's numbers in row-major order, rounded to DECIMALS decimals;
    -inf (a blocked score) becomes None, as JSON has no infinities."""
    values = t.detach().to("cpu", torch.float64).flatten().tolist()
    return {"shape": list(t.shape), "data": [None if math.isinf(v) or math.isnan(v) else round(v, DECIMALS)
                                             for v in values]}


def step_checks(story: Story) -> dict[int, list[dict[str, Any]]]:
    """The walkthrough's checks grouped by the step whose heading precedes them: {step: [check, ...]}."""
    found: dict[int, list[dict[str, Any]]] = {}
    step = 0
    for block in story.blocks:
        if block.kind == "heading" and (m := STEP_HEADING.match(block.data["text"])):
            step = int(m.group(1) or m.group(2))
        elif block.kind == "check" and step:
            found.setdefault(step, []).append(block.data)
    return found


def trace(setup) -> tuple[dict[str, Any], torch.Tensor]:
    """The walkthrough run on `setup` (told in both languages): batch 0's tensors and each step's checks.

    Returns (trace, weights): trace is {"D", "O", "blocked", "q", "k", "v", "scores", "scaled", "ctx",
    "out", "checks"}: q, k, v, ctx (H, L, SHOWN) and out (L, SHOWN) hold each vector's first numbers
    of D (or O); checks maps a step number to [{"ok", "detail", "en", "zh"}, ...]. weights are the
    walkthrough's attention weights of batch 0, (H, L, L).
    """
    stories = {lang: Story(lang) for lang in LANGS}
    passes = {lang: tell(story, setup) for lang, story in stories.items()}
    t = passes["en"].t
    told = {lang: step_checks(story) for lang, story in stories.items()}
    checks = {}
    for step, english in told["en"].items():
        checks[str(step)] = [{"ok": en["ok"], "detail": en["detail"], "en": en["claim"], "zh": zh["claim"]}
                             for en, zh in zip(english, told["zh"][step], strict=True)]
    blocked = t.get("blocked")
    return {
        "D": setup.module.head_dim,
        "O": t["out"].shape[-1],
        "blocked": None if blocked is None else [int(b) for b in blocked.flatten().tolist()],
        **{name: flat(t[name + "_heads"][0, ..., :SHOWN]) for name in ("q", "k", "v")},
        **{name: flat(t[name][0]) for name in ("scores", "scaled")},
        "ctx": flat(t["ctx"][0, ..., :SHOWN]),
        "out": flat(t["out"][0, :, :SHOWN]),
        "checks": checks,
    }, t["weights"][0]


def weights_row(weights: torch.Tensor, name: str | None = None) -> dict[str, Any]:
    """One row of the grid from attention weights (H, Lq, Lk) or (Lq, Lk)."""
    weights = weights.detach()
    if weights.dim() == 2:
        weights = weights[None]
    return {"name": name, "weights": flat(weights)}


def explorer(title: dict[str, str], tokens: list[str] | None, rows: list[dict[str, Any]],
             start: tuple[int, int, int] = (0, 0, 0), kind: str = "layer") -> dict[str, Any]:
    """An explorer for the page: `rows` of heads (from weights_row, a trace added under "trace"),
    token names (None: numbered), where the views start (row, head, query), and what a row is
    ("layer", "call" of a capture, or "figure" of a topic)."""
    return {"title": title, "tokens": tokens, "rows": rows, "kind": kind,
            "start": {"row": start[0], "head": start[1], "query": start[2]}}


def walkthrough_explorer(setups: list, tokens: list[str], title: dict[str, str], start_row: int = 0,
                         query: int = 0) -> dict[str, Any]:
    """An explorer over the model layers `setups` (one walkthrough Setup per layer, each traced)."""
    rows = []
    for setup in setups:
        traced, weights = trace(setup)
        rows.append({**weights_row(weights), "trace": traced})
    return explorer(title, tokens, rows, (start_row, 0, query))


def figure_explorers(stories: dict[str, Story]) -> list[dict[str, Any]]:
    """One explorer per attention figure of a story (a topic's heatmaps), titled in both languages."""
    found = []
    figures = {lang: [b for b in story.blocks if b.kind == "figure"] for lang, story in stories.items()}
    for en, zh in zip(figures["en"], figures["zh"], strict=True):
        tokens = en.data.get("tokens")
        found.append(explorer({"en": en.data["label"], "zh": zh.data["label"]}, tokens,
                              [weights_row(en.data["weights"])], kind="figure"))
    return found


def record_explorer(record, title: dict[str, str]) -> dict[str, Any]:
    """An explorer over a capture_attention record: one row per recorded call (batch item 0)."""
    rows = [weights_row(call.weights[0], call.module or f"#{i}") for i, call in enumerate(record)]
    return explorer(title, None, rows, kind="call")
