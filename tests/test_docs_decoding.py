"""docs/decoding.md runs as written: its code blocks, in order, as one script.

The toy decoder's cached greedy decoding must give the same tokens as recomputing the whole sequence
at every step: for the doc's own ragged batch, and for other seeds, prompts and lengths here.
"""
from __future__ import annotations

import ast
import contextlib
import io
import re
from pathlib import Path

import pytest
import torch

import multihead as mh

DOC = Path(__file__).resolve().parents[1] / "docs" / "decoding.md"


def code_blocks(text: str) -> list[str]:
    """The ```python blocks of a Markdown text, in order."""
    return re.findall(r"^```python\n(.*?)^```", text, flags=re.S | re.M)


@pytest.fixture(scope="module")
def doc():
    """The namespace the doc's blocks leave behind, and what they printed."""
    namespace: dict = {"__name__": "decoding_doc"}
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        for block in code_blocks(DOC.read_text()):
            exec(compile(block, str(DOC), "exec"), namespace)
    return namespace, printed.getvalue()


def test_the_doc_has_the_blocks_it_promises():
    blocks = code_blocks(DOC.read_text())
    assert len(blocks) == 8
    assert any("class ToyDecoder" in b for b in blocks) and any("def generate(" in b for b in blocks)


def test_the_paged_block_prints_shared_pages_and_the_row_it_frees(doc):
    namespace, printed = doc
    assert "[3, 2, 0, 0] 8192\n2\n" in printed  # 2 pages of 16 tokens x 2 heads x (16 + 16) fp32 numbers
    pages = namespace["pages"]
    assert pages.lengths.tolist() == [21, 21, 0] and pages.pages_in_use() == 3


def test_cached_greedy_decoding_of_the_ragged_batch_equals_recomputing(doc):
    namespace, printed = doc
    lines = [line for line in printed.splitlines() if "recomputing" in line or "DIFFERENT" in line]
    assert len(lines) == 3 and all(line.endswith("same as recomputing") for line in lines)
    assert namespace["cached"].shape == (3, 12)


@pytest.mark.parametrize("seed, lengths", [(1, [4, 1, 6, 2]), (2, [9]), (3, [2, 2])])
def test_cached_greedy_decoding_equals_recomputing_for_other_models_and_prompts(doc, seed, lengths):
    namespace, _ = doc
    torch.manual_seed(seed)
    model = namespace["ToyDecoder"](vocab=50, dim=32, heads=4, kv_heads=1).eval()
    lens = torch.tensor(lengths)
    P = max(lengths)
    prompts = torch.randint(1, 50, (len(lengths), P)) * (torch.arange(P) < lens[:, None])
    cached = namespace["generate"](model, prompts, lens, steps=10)
    for b, n in enumerate(lengths):
        assert torch.equal(cached[b], namespace["generate_without_cache"](model, prompts[b, :n], steps=10))


def test_every_option_decodes_like_the_full_forward(doc):
    gaps = doc[0]["gaps"]
    assert set(gaps) == set(doc[0]["options"]) and len(gaps) == 5
    assert all(gap < 1e-5 for gap in gaps.values()), gaps


def test_the_printed_masks_are_the_ones_the_comments_show(doc):
    namespace, _ = doc
    block = next(b for b in code_blocks(DOC.read_text()) if "top_left[0, 0]" in b)
    shown = [ast.literal_eval(line.split("#", 1)[1].split("queries")[0].strip())
             for line in block.splitlines() if line.startswith("print(")]
    assert shown == [namespace["top_left"][0, 0].int().tolist(), namespace["bottom_right"][0, 0].int().tolist()]


def test_the_compiled_loop_made_two_graphs_and_the_eager_tokens(doc):
    namespace, printed = doc
    assert namespace["counter"].frame_count == 2 and "graphs compiled: 2" in printed
    compiled = torch.cat(namespace["tokens"], 1)  # (1, 40)
    eager = namespace["generate_without_cache"](namespace["model"], namespace["prompts"][1], steps=40)
    assert torch.equal(compiled[0], eager)


def test_the_quantized_cache_block_stores_codes_and_scales(doc):
    namespace, printed = doc
    codes = namespace["codes"]
    assert codes.keys.dtype == torch.int8 and codes.lengths.tolist() == [5, 5]
    assert "torch.int8 (2, 2, 32)" in printed and namespace["out"].shape == (2, 5, 64)


def test_the_cache_block_shows_lengths_advancing(doc):
    namespace, printed = doc
    assert namespace["cache"].lengths.tolist() == [6, 6]
    assert "tensor([6, 6])" in printed
    with pytest.raises(mh.AttentionError):
        namespace["attn"](torch.randn(2, 40, 64), cache=namespace["cache"])  # past max_len=32
    assert namespace["cache"].lengths.tolist() == [6, 6]
