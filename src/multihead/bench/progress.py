"""Progress bars on stderr (rich), so stdout keeps only the tables and the JSON line."""
from __future__ import annotations

from contextlib import contextmanager


class Steps:
    """Advances one rich progress task; a no-op when progress is off."""

    def __init__(self, progress=None, task=None):
        self._progress, self._task = progress, task

    def advance(self, n: int = 1) -> None:
        if self._progress is not None:
            self._progress.advance(self._task, n)

    def describe(self, text: str) -> None:
        if self._progress is not None:
            self._progress.update(self._task, description=text)

    def finish(self) -> None:
        if self._progress is not None:
            total = self._progress.tasks[self._task].total or 0
            self._progress.update(self._task, completed=total)


class Bars:
    """One bar per suite: `with bars.task("shootout", total=12) as steps: steps.advance()`."""

    def __init__(self, enabled: bool = True):
        self._progress = None
        if enabled:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

            self._progress = Progress(TextColumn("{task.description:<34}"), BarColumn(),
                                      MofNCompleteColumn(), TimeElapsedColumn(),
                                      console=Console(stderr=True), transient=False)

    def __enter__(self) -> Bars:
        if self._progress is not None:
            self._progress.start()
        return self

    def __exit__(self, *exc) -> None:
        if self._progress is not None:
            self._progress.stop()

    @contextmanager
    def task(self, name: str, total: int):
        steps = Steps()
        if self._progress is not None:
            steps = Steps(self._progress, self._progress.add_task(name, total=total))
        try:
            yield steps
        finally:
            steps.finish()
