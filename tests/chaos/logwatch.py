"""What the chaos suite's processes said: their JSON log events, on the real clock.

Every child logs one JSON object per line (``observability.log_format =
"json"``) into its own file. :class:`LogWatch` reads each file from where it
stopped last time and keeps the process events (``emitter is active``,
``partitions assigned``, ``emitter fenced``, ...; not the per-job lines). A
skewed child stamps its lines with its skewed clock, so every event's time is
moved back by the child's skew: ``at_ms`` is on the machine's real clock.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol


class LoggingChild(Protocol):
    @property
    def pid(self) -> int: ...

    log_path: Path
    skew_ms: int


@dataclass(frozen=True, slots=True)
class LogEvent:
    at_ms: int  # real wall-clock ms (the line's ``ts`` less the process's skew)
    name: str
    level: str
    fields: dict[str, Any]


def parse_ts_ms(ts: str) -> int:
    """``2026-11-29T13:00:49.597Z`` -> epoch ms."""
    return round(datetime.fromisoformat(ts.replace("Z", "+00:00")).timestamp() * 1000)


def parse_line(line: str, *, skew_ms: int = 0) -> LogEvent | None:
    """One log line as an event; None for job lines and anything that is no JSON event."""
    if not line.startswith("{") or '"event":"job.' in line:  # orjson's compact lines: fast
        return None
    try:
        obj = json.loads(line)
        at = parse_ts_ms(obj["ts"]) - skew_ms
        name = str(obj["event"])
    except (ValueError, KeyError, TypeError):
        return None
    if name.startswith("job."):
        return None
    return LogEvent(at, name, str(obj.get("level", "")), obj)


class LogWatch:
    """Incremental reader of the children's logs."""

    def __init__(self) -> None:
        self._offsets: dict[Path, int] = {}
        self._partial: dict[Path, str] = {}
        self._events: dict[Path, list[LogEvent]] = {}

    def events(self, child: LoggingChild) -> list[LogEvent]:
        """Every process event ``child`` has logged so far, oldest first."""
        path = child.log_path
        seen = self._events.setdefault(path, [])
        try:
            with path.open("rb") as f:
                f.seek(self._offsets.get(path, 0))
                chunk = f.read()
        except OSError:
            return seen
        if not chunk:
            return seen
        self._offsets[path] = self._offsets.get(path, 0) + len(chunk)
        text = self._partial.pop(path, "") + chunk.decode(errors="replace")
        lines = text.split("\n")
        if lines[-1]:
            self._partial[path] = lines[-1]  # an unfinished line: the rest comes later
        for line in lines[:-1]:
            ev = parse_line(line, skew_ms=child.skew_ms)
            if ev is not None:
                seen.append(ev)
        return seen

    def first(self, child: LoggingChild, name: str, *, since_ms: int) -> LogEvent | None:
        """The first event called ``name`` at or after ``since_ms``."""
        for ev in self.events(child):
            if ev.name == name and ev.at_ms >= since_ms:
                return ev
        return None

    def since(self, child: LoggingChild, since_ms: int) -> list[LogEvent]:
        return [ev for ev in self.events(child) if ev.at_ms >= since_ms]
