"""The READMEs' code runs, and prints what the READMEs show.

Convention, in README.md and benchmarks/README.md:
- every ```python block runs, top to bottom, each block in a fresh namespace;
- a line `print(...)` followed directly by comment lines `# ...` shows the output of that print:
  each comment line, without its leading "# ", is one printed line (a bare "#" is an empty line);
- the ```python signature block is the module's constructor signature, compared with the code's;
- a ```python snippet block is an excerpt that needs things from outside (a model path, your own data,
  helpers defined in a docs page); it is not run here, and its docs page holds the runnable version.
When the code's output changes on purpose, regenerate the shown output instead of editing it:
    PYTHONPATH=src python tests/test_readme_code.py --write
"""
from __future__ import annotations

import contextlib
import inspect
import io
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ("README.md", "benchmarks/README.md")
FENCE = re.compile(r"^```(\S*)[ \t]*(\S*)[ \t]*$")


@dataclass
class Block:
    """One fenced code block: its info string, and the file's lines [first, end) that hold its code."""

    doc: str
    kind: str  # "python", "python signature", ...
    first: int
    end: int

    def lines(self, text_lines: list[str]) -> list[str]:
        return text_lines[self.first:self.end]


def blocks(doc: str) -> list[Block]:
    """Every fenced block of `doc` (a path relative to the repository root)."""
    lines = (ROOT / doc).read_text().splitlines()
    found, opened = [], None
    for i, line in enumerate(lines):
        match = FENCE.match(line)
        if not match:
            continue
        if opened is None:
            opened = (" ".join(x for x in match.groups() if x), i + 1)
        else:
            found.append(Block(doc, opened[0], opened[1], i))
            opened = None
    return found


@dataclass
class Shown:
    """A print line at `line` (index into the block) and the output shown after it."""

    line: int
    output: list[str]


def shown_outputs(code: list[str]) -> list[Shown]:
    """Each top-level `print(...)` line directly followed by `# ...` lines."""
    found = []
    for i, line in enumerate(code):
        if not line.startswith("print("):
            continue
        j = i + 1
        while j < len(code) and (code[j] == "#" or code[j].startswith("# ")):
            j += 1
        if j > i + 1:
            found.append(Shown(i, [c[2:] for c in code[i + 1:j]]))
    return found


def printed_outputs(code: list[str], shown: list[Shown]) -> list[list[str]]:
    """Run `code`; for each shown print, the lines that print really wrote."""
    namespace: dict = {"__name__": "readme"}
    outputs, start = [], 0
    for s in shown:
        exec(compile("\n".join(code[start:s.line]), "<readme>", "exec"), namespace)
        buffer = io.StringIO()
        with contextlib.redirect_stdout(buffer):
            exec(compile(code[s.line], "<readme>", "exec"), namespace)
        outputs.append(buffer.getvalue().rstrip("\n").split("\n"))
        start = s.line + 1
    exec(compile("\n".join(code[start:]), "<readme>", "exec"), namespace)
    return outputs


def constructor_signature() -> str:
    """`mh.MultiHeadAttention(...)` as the code defines it, without `self`."""
    from multihead import MultiHeadAttention

    sig = inspect.signature(MultiHeadAttention.__init__)
    params = [p.replace(annotation=inspect.Parameter.empty) for p in list(sig.parameters.values())[1:]]
    return "mh.MultiHeadAttention" + str(sig.replace(parameters=params, return_annotation=inspect.Signature.empty)).replace("'", '"')


def flatten(text: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"\(\s+", "(", re.sub(r",\s*\n\s*", ", ", text))).strip()


PYTHON_BLOCKS = [pytest.param(b, id=f"{b.doc}:{b.first}") for doc in DOCS for b in blocks(doc)
                 if b.kind == "python"]


def test_the_convention_finds_code_to_check():
    assert PYTHON_BLOCKS and any(b.kind == "python signature" for b in blocks("README.md"))
    readme = (ROOT / "README.md").read_text().splitlines()
    assert any(shown_outputs(b.values[0].lines(readme)) for b in PYTHON_BLOCKS if b.values[0].doc == "README.md")


@pytest.mark.parametrize("block", PYTHON_BLOCKS)
def test_python_blocks_run_and_print_what_is_shown(block):
    code = block.lines((ROOT / block.doc).read_text().splitlines())
    shown = shown_outputs(code)
    for s, printed in zip(shown, printed_outputs(code, shown)):
        assert printed == s.output, (f"{block.doc} line {block.first + s.line + 1}: {code[s.line]}\n"
                                     "regenerate with: PYTHONPATH=src python tests/test_readme_code.py --write")


def test_readme_shows_the_modules_real_signature():
    readme = (ROOT / "README.md").read_text().splitlines()
    (block,) = [b for b in blocks("README.md") if b.kind == "python signature"]
    assert flatten("\n".join(block.lines(readme))) == flatten(constructor_signature())


def wrap_signature(sig: str, width: int = 104) -> list[str]:
    """The signature over lines of at most `width`, continuation lines aligned after the "("."""
    head, rest = sig.split("(", 1)
    indent = " " * (len(head) + 1)
    lines, current = [], head + "("
    for part in rest.split(", "):
        piece = part if current.endswith("(") else ", " + part
        if len(current) + len(piece) > width and not current.endswith("("):
            lines.append(current + ",")
            current = indent + part
        else:
            current += piece
    return lines + [current]


def regenerate(doc: str) -> bool:
    """Rewrite the shown outputs and the signature in `doc` from what the code does now."""
    path = ROOT / doc
    lines = path.read_text().splitlines()
    for block in reversed(blocks(doc)):  # from the end, so earlier line numbers stay valid
        code = block.lines(lines)
        if block.kind == "python signature":
            code = wrap_signature(constructor_signature())
        elif block.kind == "python":
            shown = shown_outputs(code)
            for s, printed in reversed(list(zip(shown, printed_outputs(code, shown)))):
                comment = [("# " + line).rstrip() for line in printed]
                code[s.line + 1:s.line + 1 + len(s.output)] = comment
        lines[block.first:block.end] = code
    text = "\n".join(lines) + "\n"
    changed = text != path.read_text()
    path.write_text(text)
    return changed


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit(__doc__)
    for doc in DOCS:
        print(f"{doc}: {'updated' if regenerate(doc) else 'unchanged'}")
