"""The package's layers, read from its source: the core never imports a tool, nothing imports in a
function, there are no import cycles, and `import multihead` loads the core alone."""
from __future__ import annotations

import ast
import json
import pathlib
import subprocess
import sys

SRC = pathlib.Path(__file__).resolve().parents[1] / "src"
TOOLS = ("multihead.explain", "multihead.checker", "multihead.bench", "multihead.convert", "multihead.hf",
         "multihead.parallel", "multihead.compat", "multihead.textbook")
FACADE = ("multihead", "multihead.cli", "multihead.__main__", "multihead.doors")  # may reach the tools


def module_files() -> dict[str, pathlib.Path]:
    found = {}
    for path in (SRC / "multihead").rglob("*.py"):
        rel = path.relative_to(SRC).with_suffix("")
        found[".".join(rel.parts[:-1] if rel.name == "__init__" else rel.parts)] = path
    return found


MODULES = module_files()


def imported(name: str, node: ast.Import | ast.ImportFrom) -> list[str]:
    """The multihead modules an import statement in module `name` loads."""
    if isinstance(node, ast.Import):
        return [a.name for a in node.names if a.name.split(".")[0] == "multihead"]
    base = node.module or ""
    if node.level:
        parts = name.split(".")
        if not MODULES[name].name == "__init__.py":
            parts = parts[:-1]
        base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
    if base.split(".")[0] != "multihead":
        return []
    return [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]


def imports_of(name: str) -> tuple[set[str], list[tuple[str, int]]]:
    """(modules imported at the top of `name`, [(module, line)] imported inside a function)."""
    top, nested = set(), []

    def visit(node, in_function: bool):
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                continue  # read by type checkers only
            if isinstance(child, (ast.Import, ast.ImportFrom)):
                for target in imported(name, child):
                    if in_function:
                        nested.append((target, child.lineno))
                    else:
                        top.add(target)
            visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))

    visit(ast.parse(MODULES[name].read_text()), False)
    return top, nested


GRAPH = {name: imports_of(name) for name in MODULES}


def is_core(name: str) -> bool:
    return not name.startswith(TOOLS) and name not in FACADE


def test_the_core_never_imports_a_tool():
    crossings = [(name, target) for name, (top, nested) in GRAPH.items() if is_core(name)
                 for target in top | {t for t, _ in nested} if target.startswith(TOOLS)]
    assert crossings == []


def test_no_module_imports_multihead_inside_a_function():
    nested = [f"{MODULES[name].relative_to(SRC)}:{line} imports {target}"
              for name, (_, found) in GRAPH.items() for target, line in found]
    assert nested == []


def test_there_are_no_import_cycles():
    """Tarjan's strongly connected components over every import, top-level or not."""
    edges = {name: top | {t for t, _ in nested} for name, (top, nested) in GRAPH.items()}
    order, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(v):
        order[v] = low[v] = len(order)
        stack.append(v)
        on_stack.add(v)
        for w in edges[v]:
            if w not in order:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], order[w])
        if low[v] == order[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for name in edges:
        if name not in order:
            visit(name)
    assert cycles == []


def test_import_multihead_loads_the_core_alone():
    code = ("import json, sys, multihead; "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('multihead'))))")
    loaded = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                       check=True).stdout)
    assert [m for m in loaded if not is_core(m) and m not in FACADE] == []
    assert set(loaded) <= set(MODULES)


def test_the_tools_still_arrive_as_attributes():
    import multihead as mh

    assert callable(mh.check) and callable(mh.explain)
    assert mh.compat.MultiheadAttention.__name__ == "MultiheadAttention"
    assert mh.textbook.ReshapeTransposeHeads.__name__ == "ReshapeTransposeHeads"
    assert "check" in dir(mh)
