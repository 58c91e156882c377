"""What a suite returns: rows for its table, and the targets it checks."""
from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass(frozen=True)
class Target:
    """One goal: `value` compared with `goal` by `op` ("<=" or ">="); `met` None = not measured."""

    name: str
    value: float | None
    op: str
    goal: float
    note: str = ""

    @property
    def met(self) -> bool | None:
        if self.value is None:
            return None
        return self.value <= self.goal if self.op == "<=" else self.value >= self.goal

    def to_json(self) -> dict:
        return {**asdict(self), "met": self.met}


@dataclass
class SuiteResult:
    """A suite's table (`columns` name the keys of each row, in order), targets and notes."""

    suite: str
    title: str
    columns: list[str]
    rows: list[dict] = field(default_factory=list)
    targets: list[Target] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return {
            "title": self.title,
            "rows": self.rows,
            "targets": [t.to_json() for t in self.targets],
            "notes": self.notes,
        }
