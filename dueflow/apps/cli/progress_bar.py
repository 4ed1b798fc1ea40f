"""A progress bar on stderr for long operator commands (rich), or nothing.

Shown only when stderr is a terminal and the output is not ``--json``; the
callback is ``update(done, total)``.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

Update = Callable[[int, int], None]


@contextlib.contextmanager
def progress_bar(description: str, *, enabled: bool) -> Iterator[Update]:
    if not enabled or not sys.stderr.isatty():
        yield lambda _done, _total: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

    with Progress(
        "[progress.description]{task.description}",
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        console=Console(stderr=True),
    ) as bar:
        task = bar.add_task(description, total=None)

        def update(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)

        yield update
