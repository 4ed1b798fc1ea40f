"""What the demo shows while it runs: live progress bars (rich), events, the summary.

On a terminal the bars update in place with a status line under them;
elsewhere (CI logs, a pipe) a plain progress line is printed every few
seconds. Events (the kill, the takeover) are printed as they happen.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from types import TracebackType

from rich.console import Console, Group
from rich.live import Live
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn
from rich.table import Table
from rich.text import Text

from demo.summary import DemoSummary

BARS = ("scheduled", "fired", "executed", "retried", "dead")


@dataclass(frozen=True, slots=True)
class Bar:
    done: int
    total: int


class ProgressView:
    """Bars for ``BARS`` plus a status line; a plain line every ``plain_every_s`` off a tty."""

    def __init__(self, console: Console, *, plain_every_s: float = 5.0) -> None:
        self.console = console
        self.live_mode = console.is_terminal
        self.plain_every_s = plain_every_s
        self._started = time.monotonic()
        self._last_plain = 0.0
        self.progress = Progress(
            TextColumn("[bold]{task.description:>10}"),
            BarColumn(bar_width=40),
            MofNCompleteColumn(),
            TextColumn("{task.fields[note]}"),
            console=console,
        )
        self.tasks: dict[str, TaskID] = {
            name: self.progress.add_task(name, total=1, note="") for name in BARS
        }
        self.status = Text("")
        self._live: Live | None = None

    def __enter__(self) -> ProgressView:
        if self.live_mode:
            self._live = Live(
                Group(self.progress, self.status), console=self.console, refresh_per_second=8
            )
            self._live.__enter__()
        return self

    def __exit__(
        self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self._live is not None:
            self._live.__exit__(et, e, tb)
            self._live = None

    def event(self, text: str) -> None:
        elapsed = time.monotonic() - self._started
        self.console.print(f"[dim]{elapsed:6.1f}s[/dim]  {text}")

    def update(self, bars: dict[str, Bar], notes: dict[str, str], status: str) -> None:
        for name, bar in bars.items():
            self.progress.update(
                self.tasks[name],
                completed=bar.done,
                total=max(bar.total, bar.done, 1),
                note=notes.get(name, ""),
            )
        self.status.plain = status
        now = time.monotonic()
        if not self.live_mode and now - self._last_plain >= self.plain_every_s:
            self._last_plain = now
            line = "  ".join(f"{n} {b.done}/{b.total}" for n, b in bars.items())
            self.console.print(f"{now - self._started:6.1f}s  {line}  | {status}")


def summary_table(summary: DemoSummary) -> Table:
    table = Table(title="dueflow demo: summary", show_header=False, title_justify="left")
    table.add_column("what", style="bold")
    table.add_column("value")
    bad = {"lost": summary.lost > 0, "duplicates": summary.duplicates > 0}
    for what, value in summary.rows():
        style = "red" if bad.get(what) else ("green" if what in bad else "")
        table.add_row(what, Text(value, style=style))
    verdict = (
        Text("OK: nothing lost, nothing duplicated", style="bold green")
        if summary.ok
        else Text("FAILED: jobs lost or duplicated", style="bold red")
    )
    table.add_row("verdict", verdict)
    return table
