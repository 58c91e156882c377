"""docs/extending.md stays in step with its tests: every ```python <test file> block is an excerpt of that
test, word for word, and every recipe names a test that exists (the tests themselves run the code)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "extending.md"
FENCE = re.compile(r"^```python (tests/\S+\.py)\n(.*?)^```$", flags=re.S | re.M)
RECIPES = {"A new mask kind": "tests/test_core_new_mask_kind.py", "A new backend": "tests/test_core_new_backend.py",
           "A new cache layout": "tests/test_cache_new_layout.py", "A new explain topic": "tests/test_recipe_topic.py",
           "A new check id": "tests/test_recipe_check_id.py"}


def sections() -> dict[str, str]:
    """The doc's "## " sections by title."""
    parts = re.split(r"^## (.+)$", DOC.read_text(), flags=re.M)
    return dict(zip(parts[1::2], parts[2::2]))


EXCERPTS = [pytest.param(path, code, id=f"{path}:{i}") for i, (path, code) in enumerate(FENCE.findall(DOC.read_text()))]


@pytest.mark.parametrize("path, code", EXCERPTS)
def test_each_block_stands_word_for_word_in_the_test_it_names(path, code):
    assert code.strip() and code in (ROOT / path).read_text(), f"docs/extending.md quotes {path} as it no longer is"


@pytest.mark.parametrize("title", list(RECIPES))
def test_each_recipe_quotes_and_names_its_test(title):
    text, test = sections()[title], RECIPES[title]
    assert (ROOT / test).is_file()
    assert f"```python {test}\n" in text and f"Its test, `{test}`" in text


def test_every_recipe_test_is_in_the_doc():
    named = set(RECIPES.values())
    assert {f"tests/{p.name}" for p in (ROOT / "tests").glob("test_recipe_*.py")} <= named
    assert {path for path, _ in FENCE.findall(DOC.read_text())} == named
