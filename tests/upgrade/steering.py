"""Steps and checks of the upgrade to steerable jobs (``test_upgrade_steering.py``).

:class:`Steer` runs ``tests/upgrade/steer.py`` with one release's interpreter:
it schedules groups of jobs and cancels, reschedules or updates them with that
release's SDK (the previous one writes the records of the release before, the
current one commands once the queue is finalized). Every job it touches is
left out of the common verdict (``stage.exempt``) and judged by the checks
here, from the ledger (which run, when, with which payload ``tag``), the SDK's
answers, the exec and timer topics, and the status views.

To see what a job's timers do at any horizon without waiting for it,
:func:`fire_all` writes every timer of the job into its exec partition as the
wheel would fire it once due (``df-due`` now): those :func:`capture` kept
before the emitter fired and deleted them, and those in the timer topic now.
Then a marker job goes behind them in the same partitions: when the marker has
run, the worker has judged every record in front of it.
"""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from dueflow import headers as hdr
from dueflow.consumers.testing import ExecWriter, make_job
from dueflow.kafka.reading import Span, ops_consumer, partitions_of, read_spans, watermarks
from dueflow.kafka.topics import names
from dueflow.records import codec
from dueflow.rules.partitioning import partition_for_key
from tests.integration.pipeline_support import wait_for
from tests.integration.worker_support import Record, read_topic
from tests.upgrade.deployment import QUEUE, Deployment
from tests.upgrade.ledger import Run
from tests.upgrade.scenario import Stage

HERE = Path(__file__).resolve().parent
STEER_SCRIPT = HERE / "steer.py"
TASK = "upgrade-job"
DAY_MS = 86_400_000
# What the previous release's tools say of an outcome of version 3.
NO_OUTCOME_V3 = "no released version 3 of schema dueflow.Outcome"
OUTCOME_V3 = b"dueflow.Outcome/3"


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class Steer:
    """``release``'s SDK does the operations ``plan(stage)`` makes (see
    ``tests/upgrade/steer.py``); what it answered is in :func:`facts`."""

    name: str
    release: str
    plan: Callable[[Stage], list[dict[str, Any]]]

    def run(self, stage: Stage) -> None:
        d = stage.deployment
        release = stage.release(self.release)
        ops = self.plan(stage)
        plan_path = d.tmp / f"steer-{self.name}.json"
        plan_path.write_text(json.dumps(ops))
        out = d.tmp / "steer.jsonl"
        done = subprocess.run(
            [
                *(str(release.python), str(STEER_SCRIPT), "--plan", str(plan_path)),
                *("--out", str(out), "--sdk", release.name),
            ],
            env=d.env(release),
            cwd=d.tmp,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert done.returncode == 0, f"steer {self.name} ({release.name}):\n{done.stderr[-4000:]}"
        stage.exempt.update(f["job_id"] for f in facts(stage))

    def __repr__(self) -> str:
        return f"Steer({self.name!r}, {self.release})"


def facts(stage: Stage) -> list[dict[str, Any]]:
    """Every line the steer script wrote, in order."""
    path = stage.deployment.tmp / "steer.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.endswith("}")]


def group(stage: Stage, name: str) -> list[dict[str, Any]]:
    """The jobs the steer script scheduled in group ``name``."""
    return [f for f in facts(stage) if f["type"] == "job" and f["group"] == name]


def ids(stage: Stage, name: str) -> list[str]:
    return [f["job_id"] for f in group(stage, name)]


def answers(stage: Stage, op: str, job_ids: Iterable[str], sdk: str) -> dict[str, dict[str, Any]]:
    """The last answer of ``sdk``'s SDK to ``op`` for each job (its line)."""
    want = set(job_ids)
    out: dict[str, dict[str, Any]] = {}
    for f in facts(stage):
        if f["type"] == op and f["job_id"] in want and f["sdk"] == sdk:
            out[f["job_id"]] = f
    assert set(out) == want, f"no {op} answer of {sdk} for {sorted(want - set(out))}"
    return out


def runs_of(stage: Stage, job_ids: Iterable[str]) -> dict[str, list[Run]]:
    """Each job's runs (not redriven), in order."""
    out: dict[str, list[Run]] = {j: [] for j in job_ids}
    for run in stage.deployment.ledger.runs():
        if run.job_id in out and not run.redriven:
            out[run.job_id].append(run)
    return out


# ----------------------------------------------------------------- firing timers


def read_now(d: Deployment, topic: str) -> list[Record]:
    """Every committed record of ``topic`` from each partition's low to its last stable
    offset now (the emitter deletes timer records as it fires them: a reader that waits
    to catch up with the partitions' ends can wait for its deadline)."""
    consumer = ops_consumer(d.settings)
    out: list[Record] = []

    def take(msg: Any) -> None:
        pairs = msg.headers() or []
        out.append(
            Record(
                str(msg.topic()),
                int(msg.partition()),
                int(msg.offset()),
                msg.key(),
                msg.value(),
                {k: v for k, v in pairs if isinstance(v, bytes)},
                msg.timestamp()[1],
            )
        )

    try:
        parts = partitions_of(consumer, topic)
        marks = watermarks(consumer, topic, parts)
        read_spans(consumer, [Span(topic, p, lo, hi) for p, (lo, hi) in marks.items()], take)
    finally:
        consumer.close()
    return out


def timers_of(d: Deployment, job_ids: Iterable[str]) -> dict[str, list[Record]]:
    """Every record of each job in the timer topic now."""
    want = {j.encode(): j for j in job_ids}
    out: dict[str, list[Record]] = {j: [] for j in want.values()}
    for r in read_now(d, names(d.settings).timers):
        job = want.get(r.headers.get(hdr.JOB_ID, b""))
        if job is not None:
            out[job].append(r)
    return out


def fire(d: Deployment, timers: Iterable[Record], writer: ExecWriter) -> set[int]:
    """Write ``timers`` to the exec topic as the emitter fires them once due (``df-due``
    now); the partitions written."""
    at = now_ms()
    exec_partitions = d.settings.queue(QUEUE).partitions
    written: set[int] = set()
    for t in timers:
        headers = hdr.replace(list(t.headers.items()), [(hdr.DUE, at)])
        headers = hdr.fired(
            headers, fired_at=str(at).encode(), source=hdr.source_of(t.topic, t.partition, t.offset)
        )
        if hdr.PARTITION in t.headers:
            partition = int(t.headers[hdr.PARTITION])
        else:
            partition = partition_for_key(t.key or b"", exec_partitions)
        writer.write_raw(QUEUE, t.key, t.value, headers, partition=partition)
        written.add(partition)
    return written


def judged(stage: Stage, partitions: Iterable[int], writer: ExecWriter) -> None:
    """A marker job behind what was written to each of ``partitions``; returns once every
    marker ran (the records in front of it were judged). Markers are exempt."""
    markers = []
    for p in sorted(set(partitions)):
        job = make_job(TASK, {"kind": "ok", "work_ms": 1, "tag": "marker"}, queue=QUEUE)
        writer.write([job], partition=p)
        markers.append(job.job_id)
    writer.flush()
    stage.exempt.update(markers)
    ledger = stage.deployment.ledger
    wait_for(
        "the markers behind the fired timers ran",
        lambda: {r.job_id for r in ledger.runs()} >= set(markers),
        60,
    )


def capture(stage: Stage) -> None:
    """Keep every timer of the steered jobs in the timer topic now (the emitter deletes
    a slot's records once it fired them)."""
    kept: dict[str, list[Record]] = stage.notes.setdefault("timers", {})
    for job_id, timers in timers_of(stage.deployment, stage.exempt).items():
        seen = {(t.partition, t.offset) for t in kept.get(job_id, [])}
        kept.setdefault(job_id, []).extend(t for t in timers if (t.partition, t.offset) not in seen)


def fire_all(stage: Stage, job_ids: Iterable[str]) -> dict[str, list[Record]]:
    """Fire every timer of ``job_ids`` (captured, or in the timer topic now) and wait until
    they were judged; the timers fired."""
    d = stage.deployment
    job_ids = list(job_ids)
    kept: dict[str, list[Record]] = stage.notes.get("timers", {})
    timers = timers_of(d, job_ids)
    for job_id in job_ids:
        seen = {(t.partition, t.offset) for t in timers[job_id]}
        timers[job_id] += [t for t in kept.get(job_id, []) if (t.partition, t.offset) not in seen]
    assert all(timers.values()), {j: len(t) for j, t in timers.items()}
    writer = ExecWriter(d.settings)
    partitions = fire(d, [t for ts in timers.values() for t in ts], writer)
    judged(stage, partitions, writer)
    return timers


# ----------------------------------------------------------------- status views


def view_state(d: Deployment, app_id: str, job_id: str) -> str | None:
    """A job's state in status view ``app_id`` (None: unknown to it)."""
    import urllib.error
    import urllib.request

    port = d.status_view(app_id).metrics_port
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/jobs/{job_id}", timeout=5) as r:
            return str(json.loads(r.read())["state"])
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise


def outcome_versions(d: Deployment) -> dict[bytes, int]:
    """How many outcome records of each ``df-schema`` the outcomes topic holds."""
    out: dict[bytes, int] = {}
    for r in read_topic(d.settings, names(d.settings).outcomes):
        schema = r.headers.get(hdr.SCHEMA, b"")
        out[schema] = out.get(schema, 0) + 1
    return out


def quarantined(d: Deployment) -> list[Record]:
    return read_topic(d.settings, names(d.settings).quarantine)


def outcome_states(d: Deployment, job_ids: Iterable[str]) -> dict[str, list[str]]:
    """Each job's outcome states, in the order of its partition."""
    want = set(job_ids)
    out: dict[str, list[str]] = {j: [] for j in want}
    for r in read_topic(d.settings, names(d.settings).outcomes):
        job = (r.key or b"").decode(errors="replace")
        if job not in want:
            continue
        version = codec.parse_schema_header(r.headers.get(hdr.SCHEMA), expected="outcome")
        out[job].append(codec.decode("outcome", r.value or b"", writer_version=version)["state"])
    return out
