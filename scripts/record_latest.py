"""Records a `make test-latest` run: its counts, the releases it ran against, the date and the command.

    python scripts/record_latest.py RESULTS.xml RECORD.json COMMAND

RESULTS.xml is pytest's --junitxml report. Run it with the interpreter that ran the tests, so that the
versions it records are the ones the tests imported. RECORD.json keeps one entry per (transformers
version, command), the newest first; a rerun replaces its own entry.
"""
from __future__ import annotations

import datetime
import json
import platform
import sys
import xml.etree.ElementTree as ET
from importlib import metadata
from pathlib import Path

PACKAGES = ("transformers", "torch", "huggingface_hub", "tokenizers", "safetensors", "peft", "onnx", "onnxruntime",
            "onnxscript")


def counts(results: Path) -> dict:
    """passed / failed / errors / skipped and the failing tests' ids, from a junit XML report."""
    cases = ET.parse(results).getroot().iter("testcase")
    tally = {"passed": 0, "failed": 0, "errors": 0, "skipped": 0, "not_passed": []}
    for case in cases:
        outcome = next((child.tag for child in case if child.tag in ("failure", "error", "skipped")), "passed")
        key = {"failure": "failed", "error": "errors", "skipped": "skipped", "passed": "passed"}[outcome]
        tally[key] += 1
        if key in ("failed", "errors"):
            tally["not_passed"].append(f"{case.get('classname', '')}::{case.get('name', '')}")
    return tally


def versions() -> dict:
    """The installed version of each package the `models` tests run, or None where one is missing."""
    found = {}
    for name in PACKAGES:
        try:
            found[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            found[name] = None
    return found


def record(results: Path, record_file: Path, command: str, today: str | None = None) -> dict:
    """Add this run to `record_file` (replacing an earlier run of the same transformers and command)."""
    entry = {"date": today or datetime.date.today().isoformat(), "command": command,
             "python": platform.python_version(), "machine": platform.machine(), "versions": versions(),
             **counts(results)}
    runs = json.loads(record_file.read_text())["runs"] if record_file.exists() else []
    same = (entry["versions"]["transformers"], command)
    runs = [entry] + [run for run in runs if (run["versions"]["transformers"], run["command"]) != same]
    record_file.write_text(json.dumps({"runs": runs}, indent=1) + "\n")
    return entry


def summary(run: dict) -> str:
    """The run in two lines: what ran against what, with its counts; and its command."""
    return (f"transformers {run['versions']['transformers']}, on {run['date']}: {run['passed']} passed, "
            f"{run['failed']} failed, {run['errors']} errors, {run['skipped']} skipped\ncommand: {run['command']}")


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    done = record(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])
    print(summary(done))
    print(f"recorded in {sys.argv[2]}")
