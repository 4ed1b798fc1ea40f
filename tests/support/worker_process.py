"""``dueflow worker`` as a child process (JSON logs, stopped by pid), and what it dead-lettered.

The CLI worker is the deployed path: its logs go through the JSON line
handler, its settings through the environment. Tests of what a worker does
with bad input run it this way, not on a thread.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

from dueflow.apps.ops.dlq import DeadLetterEntry, read_dead_letters
from dueflow.config import QueueSpec, Settings
from dueflow.kafka.reading import ops_consumer
from tests.support.emitters import emitter_env

ROOT = Path(__file__).resolve().parents[2]


class WorkerProcess:
    """``python -m dueflow worker --app APP --queues QUEUES`` with ``settings``' cluster,
    topics and queues (``env``: more settings, e.g. ``DUEFLOW_WORKER_CONCURRENCY``)."""

    def __init__(
        self,
        settings: Settings,
        log: Path,
        *,
        app: str,
        queues: str,
        env: dict[str, str] | None = None,
    ) -> None:
        # The queues whole (retry tiers too): DUEFLOW_QUEUES holds names and partitions only.
        config = log.with_suffix(".toml")
        config.write_text("".join(_queue_toml(q) for q in settings.queues))
        extra = {
            "DUEFLOW_CONFIG": str(config),
            "DUEFLOW_WORKER_SESSION_TIMEOUT_MS": "3000",
            "DUEFLOW_WORKER_COMMIT_INTERVAL_MS": "50",
            "PYTHONPATH": str(ROOT),
            **(env or {}),
        }
        full = emitter_env(settings, extra)
        del full["DUEFLOW_QUEUES"]
        self.log = log
        with log.open("wb") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "dueflow", "worker", "--app", app, "--queues", queues],
                env=full,
                cwd=ROOT,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )

    def alive(self) -> bool:
        return self.proc.poll() is None

    def text(self) -> str:
        return self.log.read_text(errors="replace")

    def stop(self) -> None:
        """SIGTERM (SIGKILL after 30 s) to the process group: the CLI and its children."""
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)


def _queue_toml(q: QueueSpec) -> str:
    lines = [
        "[[queues]]",
        f'name = "{q.name}"',
        f"partitions = {q.partitions}",
        f"retry_tiers_ms = {list(q.retry_tiers_ms)}",
        f"idempotency_retention_ms = {q.idempotency_retention_ms}",
    ]
    if q.rate_limit_per_s is not None:
        lines.append(f"rate_limit_per_s = {q.rate_limit_per_s}")
    return "\n".join(lines) + "\n"


def dead_letters(settings: Settings, queue: str) -> list[DeadLetterEntry]:
    """Every record of the queue's DLQ, decoded as ``dueflow dlq list`` decodes it."""
    consumer = ops_consumer(settings)
    try:
        return read_dead_letters(settings, consumer, queue)
    finally:
        consumer.close()


def dead_by_key(settings: Settings, queue: str) -> dict[str, dict[str, Any]]:
    """Decoded DLQ records by idempotency key (the last one of a key)."""
    out: dict[str, dict[str, Any]] = {}
    for e in dead_letters(settings, queue):
        if e.record is not None:
            out[str(e.record["idempotency_key"])] = dict(e.record)
    return out
