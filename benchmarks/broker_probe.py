"""Where a local broker's CPU goes during a measured run: by thread, and by request.

The broker is most of the pipeline's CPU at a steady rate, and that CPU follows
its requests more than its records (librdkafka sends one ProduceRequest per
partition; every transaction adds its own requests). Two readings explain it:

- :func:`thread_cpu_s`: CPU seconds of the broker's threads so far, by kind of
  thread (the request path, JIT compilers, GC, group coordinator, transaction
  markers, ...), from ``/proc/<pid>/task``: cheap, always taken.
- :class:`BrokerRequests`: the broker's request counts by API (JMX
  ``RequestsPerSec``), read by ``benchmarks/java/BrokerRequests.java``
  attached to the broker's JVM; opt-in (``--broker-requests``), as its JVM
  takes about a second of CPU to start.

The pure parts (:func:`thread_kind`, :func:`request_rates`) are unit-tested.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from benchmarks.proc_cpu import stat_cpu_s

JAVA_SOURCE = Path(__file__).parent / "java" / "BrokerRequests.java"

# Thread names of a Kafka 4.x broker (as the kernel keeps them: 15 characters),
# and the kind each one is counted as. Request handlers and network threads
# share their first 15 characters ("data-plane-kafk"): one kind, the request path.
_KINDS = (
    ("data-plane-kafk", "requests"),
    ("C1 CompilerThre", "jit"),
    ("C2 CompilerThre", "jit"),
    ("GC Thread", "gc"),
    ("G1 ", "gc"),
    ("VM Thread", "gc"),
    ("group-coordinat", "group coordinator"),
    ("TxnMarkerSender", "transaction markers"),
    ("AddPartitionsTo", "transaction verification"),
)

# Sub-kinds the broker also counts under ``Fetch``: left out of the total.
_SUBCOUNTS = frozenset({"FetchConsumer", "FetchFollower"})


def thread_kind(name: str) -> str:
    """The kind of a broker thread by its (15-character, kernel-truncated) name (pure)."""
    for prefix, kind in _KINDS:
        if name.startswith(prefix):
            return kind
    return "other"


def thread_cpu_s(pid: int) -> dict[str, float]:
    """CPU seconds (user + sys) of process ``pid``'s threads so far, by :func:`thread_kind`.

    Threads that ended are not counted, so take the difference of two readings
    of a long-lived process (a broker's threads live as long as it does)."""
    out: dict[str, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            spent = stat_cpu_s((task / "stat").read_text())
        except OSError:  # the thread ended
            continue
        kind = thread_kind(name)
        out[kind] = out.get(kind, 0.0) + spent
    return out


def cpu_delta(before: Mapping[str, float], after: Mapping[str, float]) -> dict[str, float]:
    """``after - before`` by kind, kinds that took no CPU left out (pure)."""
    out = {k: v - before.get(k, 0.0) for k, v in after.items()}
    return {k: v for k, v in out.items() if v > 0}


def request_rates(
    before: Mapping[str, int], after: Mapping[str, int], seconds: float
) -> dict[str, float]:
    """Requests per second by API between two readings of the counts, busiest first,
    and their ``total`` (``FetchConsumer``/``FetchFollower`` are also in ``Fetch``:
    shown, not added again) (pure)."""
    if seconds <= 0:
        raise ValueError(f"request_rates: seconds must be > 0, got {seconds}")
    rates = {
        api: (count - before.get(api, 0)) / seconds
        for api, count in after.items()
        if count > before.get(api, 0)
    }
    total = sum(v for api, v in rates.items() if api not in _SUBCOUNTS)
    ordered = dict(sorted(rates.items(), key=lambda kv: -kv[1]))
    return {"total": round(total, 1), **{k: round(v, 1) for k, v in ordered.items()}}


class BrokerRequests:
    """A reader of a local broker's request counts (see the module docstring).

    ``with BrokerRequests(pid) as reader: before = reader.counts(); ...``."""

    def __init__(self, pid: int) -> None:
        self._pid = pid
        self._proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> BrokerRequests:
        java = shutil.which("java")
        if java is None:
            raise RuntimeError("broker requests: no `java` on PATH")
        self._proc = subprocess.Popen(
            [java, str(JAVA_SOURCE), str(self._pid)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._read()  # "{}" once attached
        return self

    def counts(self) -> dict[str, int]:
        """The broker's cumulative request counts by API, now."""
        assert self._proc is not None, "use `with`"
        stdin = self._proc.stdin
        assert stdin is not None
        stdin.write("\n")
        stdin.flush()
        return {str(k): int(v) for k, v in self._read().items()}

    def _read(self) -> dict[str, Any]:
        assert self._proc is not None, "use `with`"
        stdout = self._proc.stdout
        assert stdout is not None
        line = stdout.readline()
        if not line:
            raise RuntimeError(f"broker requests: the JMX reader of pid {self._pid} ended")
        found: dict[str, Any] = json.loads(line)
        return found

    def __exit__(self, *exc: object) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.stdin is not None:
            proc.stdin.close()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()
