"""Reading a chaos run's evidence (I/O edge) for the pure judge in :mod:`tests.chaos.verdict`.

From Kafka, with the operator tools' reader (read_committed, assign-only,
never commits: records of aborted or open transactions are never read), every
partition from its low to its last stable offset:

- ``<prefix>.outcomes``: every committed outcome (:class:`Outcome`); the
  writer's pid comes from the outcome's ``worker`` field (``host:pid``), so
  the judge can correct the record timestamp by that process's clock skew
  (a log-append timestamp is the broker's: no pid);
- ``<prefix>.dlq.<queue>``: the dead letters (:class:`DeadLetter`);
- ``<prefix>.exec.<queue>``: what was fired (:class:`Fire`), redriven and
  replayed records marked.

From the ledger: runs and effects; from the workload: the accepted jobs, the
commands that steered some of them, and the schedules; from the fault driver:
its fault log (``kind``, ``at_ms``, ``until_ms``, ``pids``) and the clock
skews (pid -> ms ahead); from the
handlers' task specs and the queue's tiers: each task's retry plan; from each
worker process's JSON log: when it dropped its uncommitted work
(:class:`Dropped`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from pathlib import Path
from typing import Any

import orjson
from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME

from dueflow import headers as hdr
from dueflow.apps.ops.dlq import read_dead_letters as read_dlq_entries
from dueflow.config import Settings
from dueflow.consumers.registry import spec_of
from dueflow.errors import UndecodableRecord
from dueflow.kafka.reading import Span, ops_consumer, partitions_of, read_spans, watermarks
from dueflow.kafka.topics import names
from dueflow.records import codec
from dueflow.rules.backoff import compute_backoff
from dueflow.timeutil import to_utc_ms
from tests.chaos import handlers
from tests.chaos.facts import DeadLetter, Dropped, Evidence, Fault, Fire, Outcome, RetryPlan
from tests.chaos.ledger import Ledger
from tests.chaos.workload import Workload
from tests.integration.records import settle

TASKS = (
    handlers.chaos_ok,
    handlers.chaos_flaky,
    handlers.chaos_doomed,
    handlers.chaos_permanent,
    handlers.chaos_cron,
)


def read_topic(settings: Settings, topic: str, take: Callable[[Any], None]) -> int:
    """Call ``take(message)`` for every committed record of every partition of ``topic``."""
    consumer = ops_consumer(settings)
    try:
        parts = partitions_of(consumer, topic)
        marks = watermarks(consumer, topic, parts)
        spans = [Span(topic, p, low, high) for p, (low, high) in marks.items()]
        return read_spans(consumer, spans, take)
    finally:
        consumer.close()


def worker_pid(worker: str | None) -> int | None:
    """The pid in an outcome's ``worker`` field (``host:pid``); None when there is none."""
    _host, sep, pid = (worker or "").rpartition(":")
    return int(pid) if sep and pid.isdigit() else None


def read_outcomes(settings: Settings) -> list[Outcome]:
    """Every committed outcome (undecodable records are left out)."""
    found: list[Outcome] = []

    def take(msg: Any) -> None:
        try:
            version = codec.parse_schema_header(
                hdr.header(msg.headers(), hdr.SCHEMA), expected="outcome"
            )
            out = codec.decode("outcome", msg.value() or b"", writer_version=version)
        except UndecodableRecord:
            return
        kind, ts = msg.timestamp()
        found.append(
            Outcome(
                key=out["idempotency_key"],
                job_id=out["job_id"],
                state=out["state"],
                attempt=int(out["attempt"]),
                ts_ms=int(ts),
                pid=None if kind == TIMESTAMP_LOG_APPEND_TIME else worker_pid(out.get("worker")),
                offset=int(msg.offset()),
            )
        )

    read_topic(settings, names(settings).outcomes, take)
    return found


def read_dead_letters(settings: Settings, queue: str) -> list[DeadLetter]:
    """Every committed dead letter of ``queue``."""
    consumer = ops_consumer(settings)
    try:
        entries = read_dlq_entries(settings, consumer, queue)
    finally:
        consumer.close()
    out = []
    for e in entries:
        job_headers = (e.record or {}).get("job_headers") or {}
        redriven = hdr.REDRIVEN_AT in job_headers or hdr.header(e.headers, hdr.REDRIVEN_AT)
        out.append(
            DeadLetter(
                key=e.idempotency_key or "?",
                job_id=e.job_id,
                reason=e.reason,
                attempts=e.attempts,
                redriven=bool(redriven),
            )
        )
    return out


def read_fires(settings: Settings, queue: str) -> list[Fire]:
    """Every committed record of ``queue``'s exec topic."""
    found: list[Fire] = []

    def take(msg: Any) -> None:
        headers = msg.headers()
        if hdr.is_command(headers):
            return  # a command to the partition's owner: not a fire
        resent = hdr.header(headers, hdr.REDRIVEN_AT) or hdr.header(headers, hdr.REPLAYED_FROM)
        key = (msg.key() or b"").decode("utf-8", "replace")
        found.append(Fire(key, hdr.header_text(headers, hdr.JOB_ID) or key, resent is not None))

    read_topic(settings, names(settings).exec(queue), take)
    return found


# Worker log events after which its uncommitted work is forgotten
# (consumers/dueflow/consumers/connection.py, rebalance.py).
DROP_EVENTS = ("worker restarting queue", "partitions lost")


def read_drops(pid: int, log: Path) -> list[Dropped]:
    """When worker ``pid`` dropped its uncommitted work, from its JSON log lines."""
    found = []
    try:
        lines = log.read_bytes().splitlines()
    except FileNotFoundError:
        return []
    for line in lines:
        if not line.startswith(b"{"):
            continue
        with contextlib.suppress(ValueError):
            doc = orjson.loads(line)
            if doc.get("event") not in DROP_EVENTS:
                continue
            at = to_utc_ms(datetime.fromisoformat(doc["ts"].replace("Z", "+00:00")), field="ts")
            cause = str(doc.get("reason", "")).split(":", 1)[0]
            since = doc.get("in_doubt_since_ms")
            found.append(
                Dropped(
                    pid,
                    at,
                    f"{doc['event']}: {cause}" if cause else doc["event"],
                    since if isinstance(since, int) else None,
                )
            )
    return found


def retry_plans(settings: Settings, queue: str) -> tuple[dict[str, RetryPlan], RetryPlan]:
    """Each chaos task's retry plan (its spec, else the job default and the queue's tiers),
    and the default plan. A jittered backoff counts its shortest wait (0)."""
    tiers = tuple(settings.queue(queue).retry_tiers_ms)
    attempts = settings.worker.default_max_attempts

    def plan(max_attempts: int, policy: Any) -> RetryPlan:
        delays = tuple(
            compute_backoff(attempt=n, policy=policy, tiers_ms=tiers, rand=0.0)
            for n in range(1, max(2, max_attempts))
        )
        return RetryPlan(max_attempts, delays)

    plans = {}
    for fn in TASKS:
        spec = spec_of(fn)
        assert spec is not None, fn
        plans[spec.name] = plan(spec.max_attempts or attempts, spec.backoff)
    return plans, plan(attempts, None)


def faults_from_log(entries: Iterable[Mapping[str, Any]]) -> list[Fault]:
    return [Fault.from_log(e) for e in entries]


def gather(
    settings: Settings,
    ledger: Ledger,
    workload: Workload,
    *,
    queue: str,
    faults: Iterable[Mapping[str, Any]] = (),
    skews: Mapping[Any, Any] | None = None,
    emitter_pids: Iterable[int] = (),
    worker_logs: Mapping[int, Path] | None = None,
    full: bool = True,
) -> Evidence:
    """Everything the judge needs, read now; ``full=False`` reads only the outcomes
    (what :func:`tests.chaos.verdict.unfinished` needs, cheap enough to poll)."""
    plans, default = retry_plans(settings, queue)
    if full:
        # The last commits' markers may not be written yet; wait a little for them.
        n = names(settings)
        settle(settings, [n.outcomes, n.dlq(queue), n.exec(queue)])
    return Evidence(
        accepted=list(workload.accepted),
        steered=list(workload.steered),
        cron=list(workload.cron),
        runs=ledger.runs() if full else [],
        effects=ledger.effects() if full else {},
        effect_conflicts=ledger.conflicts() if full else 0,
        outcomes=read_outcomes(settings),
        dead_letters=read_dead_letters(settings, queue) if full else [],
        fires=read_fires(settings, queue) if full else [],
        faults=faults_from_log(faults),
        dropped=[d for pid, log in (worker_logs or {}).items() for d in read_drops(pid, log)]
        if full
        else [],
        skews={int(pid): int(ms) for pid, ms in (skews or {}).items()},
        plans=plans,
        default_plan=default,
        emitter_pids=frozenset(emitter_pids),
    )
