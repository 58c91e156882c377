"""Verify the held-out zoo itself, without `multihead check`: every case marked PASS equals the float64
reference (reference.py) on its own weights; every buggy case differs from it (or raises), and the same
file with its recorded fix applied equals it. This is what makes the expected verdicts facts.

    python benchmarks/check_heldout/verify.py [NAME ...]

Each case is built from the hints a learner would pass (--init / --config), in float64, eval mode, with
every parameter redrawn (so that zero biases or unit norm weights cannot hide a mistake).

Another held-out zoo laid out the same way reuses this verification: `compare`, `verify` and `main` take the
zoo's manifest, its folder of stored cases, its readers (adapters) and its call styles.
"""
from __future__ import annotations

import importlib.util
import json
import sys
import tempfile
import tomllib
import types
from pathlib import Path

import torch

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from adapters import ADAPTERS, Plan  # noqa: E402
from reference import attend, mha, mla  # noqa: E402
from zoo_files import CASES, fixed_source, write_cases  # noqa: E402

MANIFEST = HERE / "manifest.toml"
B, L, LK = 2, 7, 5  # batch, length, and the key length of cross-attention calls


def load_manifest(manifest: Path = MANIFEST) -> list[dict]:
    """The cases, in manifest order."""
    return tomllib.loads(manifest.read_text(encoding="utf-8"))["case"]


def load_target(path: Path, name: str):
    spec = importlib.util.spec_from_file_location(f"heldout_{path.stem}_{id(path)}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, name)


def build(case: dict, path: Path):
    """The case's class built as the learner would (or its function)."""
    target = load_target(path, case["target"])
    if case.get("kind", "module") == "function":
        return target
    if case.get("config"):
        module = target(types.SimpleNamespace(**json.loads(case["config"])))
    else:
        module = target(**json.loads(case.get("init") or "{}"))
    return module


def redraw(module: torch.nn.Module, seed: int) -> None:
    """Every parameter redrawn in float64: unit-initialised ones (norm weights) around 1, the rest around 0."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in module.parameters():
            noise = torch.randn(param.shape, generator=gen, dtype=torch.float64)
            centre = 1.0 if param.dim() == 1 and bool((param == 1).all()) else 0.0
            param.copy_(centre + 0.3 * noise if centre else 0.15 * noise)


def materialise(module: torch.nn.Module) -> None:
    """Give lazy layers their shapes with one float32 call, as a learner's first call would."""
    if not any(isinstance(m, torch.nn.modules.lazy.LazyModuleMixin) for m in module.modules()):
        return
    z = torch.zeros(1, 2, 32)
    module(z, z, z, None)


def first(out):
    return out[0] if isinstance(out, tuple) else out


def keep_mask(batch: int, lk: int) -> torch.Tensor:
    """(B, Lk) 1/0 key padding: the second sequence has its last two keys padded."""
    keep = torch.ones(batch, lk, dtype=torch.long)
    keep[1, -2:] = 0
    return keep


def run_calls(target, plan: Plan, gen: torch.Generator) -> list[tuple[str, torch.Tensor, torch.Tensor]]:
    """(what, case output, reference output) for every call its call style makes."""
    call, w, spec = plan.call, plan.weights, plan.spec
    x = torch.randn(B, L, 32, generator=gen, dtype=torch.float64)
    results = []
    if call in ("x", "x_cached_layer_past"):
        results.append(("x", first(target(x)), mha(x, x, w, spec)))
    elif call == "mla":
        results.append(("x", first(target(x)), mla(x, w, spec)))
    elif call == "mla_absorb_flag":
        results.append(("x", first(target(x)), mla(x, w, spec)))
        results.append(("x, absorb=True", first(target(x, absorb=True)), mla(x, w, spec)))
    elif call == "x_mask4_keep":
        keep = keep_mask(B, L)[:, None, None, :]
        results.append(("x", first(target(x)), mha(x, x, w, spec)))
        results.append(("x + (B, 1, 1, L) 0 = blocked", first(target(x, attention_mask=keep)),
                        mha(x, x, w, spec, keep.bool())))
    elif call == "x_kpm":
        padding = keep_mask(B, L) == 0
        results.append(("x", first(target(x)), mha(x, x, w, spec)))
        results.append(("x + (B, L) True = padding", first(target(x, key_padding_mask=padding)),
                        mha(x, x, w, spec, ~padding[:, None, None, :])))
    elif call == "x_context_keep":
        context = torch.randn(B, LK, 32, generator=gen, dtype=torch.float64)
        keep = keep_mask(B, LK).bool()
        results.append(("x, context", first(target(x, context)), mha(x, context, w, spec)))
        results.append(("x, context + (B, Lk) True = keep", first(target(x, context, keep)),
                        mha(x, context, w, spec, keep[:, None, None, :])))
    elif call == "x_additive_shared":
        keep = torch.rand(L, L, generator=gen) < 0.6
        keep |= torch.eye(L, dtype=torch.bool)
        additive = torch.zeros(L, L, dtype=torch.float64).masked_fill(~keep, float("-inf"))
        results.append(("x", first(target(x)), mha(x, x, w, spec)))
        results.append(("x + additive (L, L) mask", first(target(x, additive)), mha(x, x, w, spec, keep[None, None])))
    elif call in ("x_keep_bl", "x_keep_bl_cached"):
        keep = keep_mask(B, L)
        results.append(("x", first(target(x)), mha(x, x, w, spec)))
        results.append(("x + (B, L) 1 = keep mask", first(target(x, attention_mask=keep)),
                        mha(x, x, w, spec, keep[:, None, None, :].bool())))
    elif call == "x_additive4d":
        keep = torch.ones(L, L, dtype=torch.bool).tril()[None, None] & keep_mask(B, L)[:, None, None, :].bool()
        additive = torch.zeros(B, 1, L, L, dtype=torch.float64).masked_fill(~keep, torch.finfo(torch.float64).min)
        results.append(("x", first(target(x)), mha(x, x, w, spec)))
        results.append(("x + 4-D additive mask", first(target(x, attention_mask=additive)), mha(x, x, w, spec, keep)))
    elif call in ("qkv_mask3", "qkv_valid_lens"):
        xq = x[:, :L]
        xk = torch.randn(B, LK, 32, generator=gen, dtype=torch.float64)
        xv = torch.randn(B, LK, 32, generator=gen, dtype=torch.float64)
        keep = keep_mask(B, LK)
        reference = mha(xq, xk, w, spec, keep[:, None, None, :].bool(), xv=xv)
        if call == "qkv_valid_lens":
            got = target(xq, xk, xv, keep.sum(-1))
        else:
            got = target(xq, xk, xv, keep[:, None, :].expand(B, L, LK))
        results.append(("q, k, v", first(target(xq, xk, xv, None)), mha(xq, xk, w, spec, xv=xv)))
        results.append(("q, k, v + mask", first(got), reference))
    elif call == "fn_qkv_mask":
        q, k, v = (torch.randn(B, 4, n, 8, generator=gen, dtype=torch.float64) for n in (L, LK, LK))
        keep = keep_mask(B, LK)[:, None, None, :].bool()
        results.append(("q, k, v", target(q, k, v), attend(q, k, v, torch.ones(1, 1, L, LK, dtype=torch.bool), spec)))
        results.append(("q, k, v + mask", target(q, k, v, keep), attend(q, k, v, keep, spec)))
    elif call == "fn_course":
        weights = [0.15 * torch.randn(32, 32, generator=gen, dtype=torch.float64) for _ in range(4)]
        w = {role: (weight, None) for role, weight in zip("qkvo", weights)}
        spec.heads = 4
        results.append(("x", target(32, 4, *weights, x), mha(x, x, w, spec)))
    else:
        raise ValueError(f"unknown call style {call!r}")
    results += cached_calls(target, plan, x)
    return results


def cached_calls(target, plan: Plan, x: torch.Tensor) -> list:
    """A prompt of 4 tokens, then single steps, through the case's cache: the rows of its full forward."""
    if plan.call not in ("x_keep_bl_cached", "x_cached_layer_past"):
        return []
    full = first(target(x))
    if plan.call == "x_keep_bl_cached":
        out, past = target(x[:, :4], use_cache=True)
        rows = [out]
        for t in range(4, L):
            out, past = target(x[:, t:t + 1], past_key_value=past, use_cache=True)
            rows.append(out)
    elif plan.call == "x_cached_layer_past":
        out, past = target(x[:, :4], use_cache=True)
        rows = [out]
        for t in range(4, L):
            out, past = target(x[:, t:t + 1], layer_past=past, use_cache=True)
            rows.append(out)
    return [("prompt 4 + single cached steps", torch.cat(rows, dim=1), full)]


def compare(case: dict, path: Path, adapters: dict = ADAPTERS, calls=run_calls) -> tuple[float, str]:
    """Largest |case - reference| over every call (inf if it raised), and what was compared; `adapters` read
    the case's weights, `calls(target, plan, gen)` makes the calls of its call style."""
    gen = torch.Generator().manual_seed(0)
    worst, notes = 0.0, []
    try:
        target = build(case, path)
        if isinstance(target, torch.nn.Module):
            materialise(target)
            target = target.double().eval()
            redraw(target, seed=1)
        plan = adapters[case["adapter"]](target)
        with torch.no_grad():  # outputs only (FlexAttention on CPU has no backward)
            results = calls(target, plan, gen)
        for what, got, want in results:
            error = (got - want).abs().max().item() if got.shape == want.shape else float("inf")
            error = float("inf") if error != error else error  # NaN
            worst = max(worst, error)
            notes.append(f"{what}: {error:.1e}")
    except Exception as exc:  # a buggy case may raise; that is a difference too
        return float("inf"), f"raised {type(exc).__name__}: {exc}"
    return worst, "; ".join(notes)


def patched(case: dict, folder: Path, stored: Path = CASES) -> Path:
    """The case's file with its recorded fix applied (each old text must occur exactly once)."""
    path = folder / "fixed" / case["file"]
    path.parent.mkdir(exist_ok=True)
    path.write_text(fixed_source(case, stored), encoding="utf-8")
    return path


def verify(case: dict, folder: Path, stored: Path = CASES, adapters: dict = ADAPTERS,
           calls=run_calls) -> tuple[bool, str]:
    """Whether the case is what the manifest says, and the measured errors."""
    tolerance = case.get("tol", 1e-9)
    written = write_cases([case], folder / "as-written", stored) / case["file"]
    error, notes = compare(case, written, adapters, calls)
    if case["expected"] == "PASS":
        return error <= tolerance, f"max error {error:.1e} (tolerance {tolerance:.0e}); {notes}"
    if not case.get("fix"):
        return False, "a buggy case needs a recorded fix"
    fixed_error, fixed_notes = compare(case, patched(case, folder, stored), adapters, calls)
    ok = error > 1e-6 and fixed_error <= tolerance
    return ok, f"as written {error:.1e} ({notes}); fixed {fixed_error:.1e} ({fixed_notes})"


def main(names: list[str], manifest: Path = MANIFEST, stored: Path = CASES, adapters: dict = ADAPTERS,
         calls=run_calls) -> int:
    torch.set_num_threads(1)
    cases = [c for c in load_manifest(manifest) if not names or c["name"] in names]
    failures = 0
    with tempfile.TemporaryDirectory() as folder:
        for case in cases:
            ok, notes = verify(case, Path(folder), stored, adapters, calls)
            failures += not ok
            print(f"{'ok  ' if ok else 'FAIL'} {case['name']:24s} {case['expected']:32s} {notes}")
    print(f"{len(cases) - failures} of {len(cases)} cases verified")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
