"""The Java, Go and Node clients against the real broker, with a Python emitter and worker.

Each language's example program (``clients/*``, built by ``make clients``) reads
one JSON document of ops and runs them with the client library: it schedules
jobs (JSON and bytes payloads, after a delay and at a time, caller's job ids and
keys, attempts, timeout, labels), cancels one, reschedules one with the legacy
records (a queue not finalized), and gets the SDK's errors for bad input. The
Python worker must run each job exactly once, never before its due time, with
its payload intact; the cancelled job never; the moved job at its new time
only. On a finalized queue, the program cancels, moves and updates jobs due
in seconds and jobs due far beyond the idempotency retention by command, and
waits for each verdict: the cancelled never runs, the moved runs once at its
new time and not before, the updated once with its new payload. Then the same
program writes through a (fake) schema registry: the values are
Confluent-framed and the worker runs them all the same. The one example per
language of docs/clients.md compiles against the client as built.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

from dueflow import headers as hdr
from dueflow import task
from dueflow.config import Settings
from dueflow.consumers import TaskContext, TaskRegistry
from dueflow.kafka.topics import names
from dueflow.producers import Scheduler
from dueflow.records.framing import unframe_job
from tests.conftest import KafkaCluster
from tests.integration.pipeline_support import wait_for
from tests.integration.steering_support import finalize_when_workers_joined, fire
from tests.integration.worker_support import FAST_WORKER, Record, WorkerThread, read_topic
from tests.support.emitters import FAST_EMITTER, SMALL_WHEEL, ensure_topics, threaded_emitter
from tests.support.fake_registry import fake_registry

ROOT = Path(__file__).resolve().parents[2]
QUEUE = "jobs"
WHEEL_DOC = {  # SMALL_WHEEL in the clients' JSON shape
    "near_partitions": SMALL_WHEEL["near_partitions"],
    "near_window_ms": SMALL_WHEEL["near_window_ms"],
    "lookahead_ms": SMALL_WHEEL["lookahead_ms"],
    "levels": [[8, 100], [8, 500], [6, 2000]],
}


def command(language: str) -> list[str]:
    """How to run the example program of ``language`` (built by ``make clients``)."""
    if language == "java":
        classes = ROOT / "clients/java/target/classes"
        classpath = ROOT / "clients/java/target/classpath.txt"
        missing = [p for p in (classes, classpath) if not p.exists()]
        cmd = ["java", "-cp", f"{classes}:{_read(classpath)}", "dev.dueflow.client.cli.DueflowCli"]
    elif language == "go":
        binary = ROOT / "clients/go/bin/dueflow-example"
        missing = [] if binary.exists() else [binary]
        cmd = [str(binary)]
    else:
        script = ROOT / "clients/node/dist/src/cli/example.js"
        missing = [] if script.exists() else [script]
        cmd = ["node", str(script)]
    assert not missing, f"{missing} missing: build the clients first (`make clients`)"
    return cmd


def _read(path: Path) -> str:
    return path.read_text().strip() if path.exists() else ""


def run_ops(
    language: str, settings: Settings, ops: list[dict[str, Any]], **extra: Any
) -> list[Any]:
    """Run the example program of ``language`` on ``ops``; its JSON lines."""
    doc = {
        "bootstrap": settings.bootstrap,
        "prefix": settings.topic_prefix,
        "wheel": WHEEL_DOC,
        "ops": ops,
        **extra,
    }
    done = subprocess.run(
        command(language),
        input=json.dumps(doc),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"{language} example failed:\n{done.stderr}\n{done.stdout}"
    return [json.loads(line) for line in done.stdout.splitlines() if line.strip()]


@dataclass
class Runs:
    """What the handler ran: job id -> [(wall ms at start, payload, key)]."""

    items: dict[str, list[tuple[int, Any, str]]] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def of(self, job_id: str) -> list[tuple[int, Any, str]]:
        with self.lock:
            return list(self.items.get(job_id, []))


RUNS = Runs()


@task("clients.record", queue=QUEUE)
def record(payload: Any, ctx: TaskContext) -> None:
    with RUNS.lock:
        RUNS.items.setdefault(ctx.job_id, []).append(
            (time.time_ns() // 1_000_000, payload, ctx.idempotency_key)
        )


@pytest.fixture
def settings(kafka: KafkaCluster, prefix: str) -> Settings:
    s = kafka.settings(
        prefix,
        queues=[{"name": QUEUE, "partitions": 3, "retry_tiers_ms": [200]}],
        wheel=SMALL_WHEEL,
        emitter=FAST_EMITTER,
        worker=FAST_WORKER,
    )
    ensure_topics(s)
    return s


@pytest.fixture
def pipeline(settings: Settings) -> Iterator[None]:
    with threaded_emitter(settings) as em, WorkerThread(settings, TaskRegistry([record])):
        em.wait_active()
        yield


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def states(s: Scheduler, job_id: str, n: int) -> list[str]:
    """The job's outcome states once it has ``n`` of them (polled)."""
    got = wait_for(
        f"{n} outcomes of {job_id}",
        lambda: (st := s.status(job_id)) is not None and len(st.history) >= n and st,
        40,
    )
    return [h[0] for h in got.history]


LANGUAGES = ["java", "go", "node"]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("language", LANGUAGES)
def test_jobs_from_each_client_run_once_on_time_with_their_payload(
    language: str, settings: Settings, pipeline: None
) -> None:
    ids = {name: f"{language}-{name}-{now_ms()}" for name in ("json", "bytes", "cancel", "move")}
    raw = bytes([0, 255, 16, 206, 10, 13])
    start = now_ms()
    ops: list[dict[str, Any]] = [
        {
            "op": "schedule",
            "request": {
                "task": "clients.record",
                "queue": QUEUE,
                "payload": {"json": {"lang": language, "text": "héllo ✓", "n": [1, 2.5]}},
                "delay_ms": 2_000,
                "job_id": ids["json"],
                "idempotency_key": f"key:{ids['json']}",
                "labels": {"from": language},
                "max_attempts": 3,
                "timeout_ms": 10_000,
            },
        },
        {
            "op": "schedule",
            "request": {
                "task": "clients.record",
                "queue": QUEUE,
                "payload": {"bytes_hex": raw.hex()},
                "run_at_ms": start + 3_000,
                "job_id": ids["bytes"],
            },
        },
        {
            "op": "schedule",
            "request": {
                "task": "clients.record",
                "queue": QUEUE,
                "delay_ms": 5_000,
                "job_id": ids["cancel"],
            },
        },
        {"op": "legacy_cancel", "job": 2},
        {
            "op": "schedule",
            "request": {
                "task": "clients.record",
                "queue": QUEUE,
                "payload": {"json_text": '{"moved":true}'},
                "delay_ms": 8_000,
                "job_id": ids["move"],
            },
        },
        {"op": "legacy_reschedule", "job": 3, "run_at_ms": start + 4_000},
        {"op": "schedule", "request": {"task": "bad task", "queue": QUEUE}},
        {"op": "schedule", "request": {"task": "clients.record", "queue": "nope"}},
        {"op": "schedule", "request": {"task": "clients.record", "queue": QUEUE, "delay_ms": -1}},
    ]
    out = run_ops(language, settings, ops)
    assert len(out) == len(ops), out
    json_job, bytes_job, _cancelled, _cancel_ack, scheduled_move, moved = out[:6]
    assert [o["error"]["field"] for o in out[6:]] == ["task", "queue", "delay"]
    assert "dueflow queue create nope" in out[7]["error"]["message"]
    assert moved["job_id"] == ids["move"]
    assert moved["due_ms"] == start + 4_000 < scheduled_move["due_ms"]

    for job_id in (ids["json"], ids["bytes"], ids["move"]):
        wait_for(f"{job_id} ran", lambda: bool(RUNS.of(job_id)), 40)  # noqa: B023
    with Scheduler(settings) as s:
        # moved earlier: it ran at its new time; the old timer's delivery came later
        # and was skipped as a duplicate (its key is done). The client writes the
        # `rescheduled` outcome once the new timer is acknowledged: on a slow machine
        # the job is due by then and may have run first.
        moved_states = states(s, ids["move"], 4)
        assert moved_states[0] == "scheduled", moved_states
        assert sorted(moved_states) == ["duplicate", "rescheduled", "scheduled", "succeeded"]
        assert moved_states.index("succeeded") < moved_states.index("duplicate"), moved_states
        # the worker skipped the cancelled job's delivery
        assert states(s, ids["cancel"], 3) == ["scheduled", "cancelled", "cancelled"]
        assert states(s, ids["json"], 2) == ["scheduled", "succeeded"]
        assert states(s, ids["bytes"], 2) == ["scheduled", "succeeded"]
    assert RUNS.of(ids["cancel"]) == []
    for job in (json_job, bytes_job, moved):
        (run,) = RUNS.of(job["job_id"])  # exactly once
        assert run[0] >= job["due_ms"], f"{job['job_id']} started {job['due_ms'] - run[0]} ms early"
    assert RUNS.of(ids["json"])[0][1:] == (
        {"lang": language, "text": "héllo ✓", "n": [1, 2.5]},
        f"key:{ids['json']}",
    )
    assert RUNS.of(ids["bytes"])[0][1:] == (raw, ids["bytes"])
    assert RUNS.of(ids["move"])[0][1] == {"moved": True}
    assert json_job["due_ms"] - json_job["created_ms"] == 2_000
    assert bytes_job["due_ms"] == start + 3_000


DAY_MS = 86_400_000
CENTURY_MS = 100 * 365 * DAY_MS


def _job(job_id: str, *, delay_ms: int, payload: Any) -> dict[str, Any]:
    return {
        "op": "schedule",
        "request": {
            "task": "clients.record",
            "queue": QUEUE,
            "payload": {"json": payload},
            "delay_ms": delay_ms,
            "job_id": job_id,
        },
    }


@pytest.mark.timeout(240)
@pytest.mark.parametrize("language", LANGUAGES)
def test_commands_from_each_client_steer_jobs_at_any_horizon_on_a_finalized_queue(
    language: str, settings: Settings, pipeline: None
) -> None:
    """Cancel, move and update by command, from the language's client: jobs due in
    seconds (the worker then runs them) and jobs due 30 days and a century out (the
    legacy records refuse anything past 7 days); each verdict waited for is right."""
    finalize_when_workers_joined(settings, QUEUE)
    tag = f"{language}-{now_ms()}"
    ids = {
        name: f"{tag}-{name}"
        for name in ("cancel", "move", "update", "far-cancel", "far-move", "far-update")
    }
    start = now_ms()
    # later than the job's due time (10 s after the program scheduled it) also when the
    # program took 15 s to start (a JVM on a loaded machine took more than 10)
    moved_to = start + 25_000
    far_due_ms = CENTURY_MS  # delay of the far jobs: due in a century
    # later than the far job's due time, however long the program takes to start
    far_moved_to = start + far_due_ms + DAY_MS
    ops: list[dict[str, Any]] = [
        _job(ids["cancel"], delay_ms=10_000, payload={"n": "cancel"}),
        _job(ids["move"], delay_ms=10_000, payload={"n": "move"}),
        _job(ids["update"], delay_ms=10_000, payload={"n": "old"}),
        _job(ids["far-cancel"], delay_ms=30 * DAY_MS, payload={"n": "far"}),
        _job(ids["far-move"], delay_ms=far_due_ms, payload={"n": "far"}),
        _job(ids["far-update"], delay_ms=far_due_ms, payload={"n": "far"}),
        {"op": "cancel", "job": 0, "wait_ms": 30_000, "by": "e2e"},
        {"op": "reschedule", "job": 1, "run_at_ms": moved_to, "wait_ms": 30_000},
        {
            "op": "update",
            "job": 2,
            "payload": {"json": {"n": "new", "lang": language}},
            "wait_ms": 30_000,
            "expect_version": "",
        },
        {"op": "cancel", "job": 3, "wait_ms": 30_000, "command_id": f"{tag}-own-id"},
        {"op": "reschedule", "job": 4, "run_at_ms": far_moved_to, "wait_ms": 30_000},
        {
            "op": "update",
            "ref": {"job_id": ids["far-update"], "queue": QUEUE},  # by id alone
            "payload": {"bytes_hex": "00ff"},
            "wait_ms": 30_000,
        },
        # refusals carry their code: cancelled already; the version changed
        {"op": "cancel", "job": 3, "wait_ms": 30_000},
        {
            "op": "update",
            "job": 5,
            "payload": {"json": 1},
            "wait_ms": 30_000,
            "expect_version": "",
        },
        # a move earlier is refused at the door, naming the field
        {"op": "reschedule", "job": 4, "run_at_ms": start, "wait_ms": 1_000},
    ]
    out = run_ops(language, settings, ops)
    assert len(out) == len(ops), out
    jobs = {name: out[i] for i, name in enumerate(ids)}
    verdicts = [o.get("verdict") for o in out[6:14]]
    assert [v and (v["state"], v["code"]) for v in verdicts] == [
        ("cancelled", ""),
        ("rescheduled", ""),
        ("updated", ""),
        ("cancelled", ""),
        ("rescheduled", ""),
        ("updated", ""),
        ("refused", "cancelled"),
        ("refused", "changed"),
    ], out[6:]
    assert verdicts[1]["due_ms"] == moved_to
    assert verdicts[4]["due_ms"] == far_moved_to
    assert out[9]["command_id"] == f"{tag}-own-id"
    for o in out[6:14]:
        assert o["job_id"] in ids.values()
        assert o["partition"] in range(3)
    assert all(len(o["command_id"]) == 32 for i, o in enumerate(out[6:14]) if i != 3)
    assert out[14]["error"]["field"] == "run_at", out[14]
    assert jobs["far-cancel"]["due_ms"] > start + 7 * DAY_MS

    wait_for(f"{ids['move']} ran", lambda: bool(RUNS.of(ids["move"])), 60)
    wait_for(f"{ids['update']} ran", lambda: bool(RUNS.of(ids["update"])), 30)
    with Scheduler(settings) as s:
        # the cancelled job's timer came and was skipped (after its due time)
        wait_for(
            f"the delivery of {ids['cancel']}",
            lambda: (st := s.status(ids["cancel"])) is not None and len(st.history) >= 3,
            30,
        )
    assert RUNS.of(ids["cancel"]) == []
    (moved,) = RUNS.of(ids["move"])  # once
    assert moved[0] >= moved_to, f"moved job started {moved_to - moved[0]} ms early"
    assert moved[1] == {"n": "move"}
    (updated,) = RUNS.of(ids["update"])  # once, with the new payload
    assert updated[1] == {"n": "new", "lang": language}
    assert updated[0] >= jobs["update"]["due_ms"]
    for name in ("far-cancel", "far-move", "far-update"):
        assert RUNS.of(ids[name]) == []

    # The far jobs come due (as the wheel fires them in 30 days and in 2126): the
    # cancelled one is skipped; the moved and the updated one are written again by
    # their worker, due at the new time, carrying the command's id as their version.
    timers = names(settings).timers
    far = [ids["far-cancel"], ids["far-move"], ids["far-update"]]
    fire(settings, _first_timers(settings, timers, far, versioned=False), due_now=True)
    steered = {ids["far-move"]: out[10], ids["far-update"]: out[11]}
    new_timers = _first_timers(settings, timers, list(steered), versioned=True)
    for t in new_timers:
        job_id = t.headers[hdr.JOB_ID].decode()
        assert t.headers[hdr.VERSION].decode() == steered[job_id]["command_id"]
        want_due = (
            verdicts[4]["due_ms"] if job_id == ids["far-move"] else jobs["far-update"]["due_ms"]
        )
        assert int(t.headers[hdr.DUE]) == want_due
    fire(settings, new_timers, due_now=True)
    wait_for("the moved and updated far jobs ran", lambda: all(RUNS.of(j) for j in steered), 30)
    with Scheduler(settings) as s:
        wait_for(
            f"the delivery of {ids['far-cancel']}",
            lambda: (st := s.status(ids["far-cancel"])) is not None and len(st.history) >= 3,
            30,
        )
    assert RUNS.of(ids["far-cancel"]) == []
    (far_moved,) = RUNS.of(ids["far-move"])  # once
    assert far_moved[1] == {"n": "far"}
    (far_updated,) = RUNS.of(ids["far-update"])  # once, with the new payload
    assert far_updated[1] == bytes([0, 255])


def _first_timers(
    settings: Settings, topic: str, job_ids: list[str], *, versioned: bool, timeout: float = 30
) -> list[Record]:
    """The first timer of each of ``job_ids`` in ``topic``, with a ``df-version`` (one
    its worker wrote) or without (the client's), read until there is one of each (the
    emitter may have placed a far timer again: a job can have several copies). Read
    without waiting for the end of the topic, which the active emitter keeps moving."""
    consumer = Consumer(
        settings.client_config(
            **{
                "group.id": f"reader-{uuid.uuid4().hex}",
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
                "auto.offset.reset": "earliest",
            }
        )
    )
    first: dict[str, Record] = {}
    try:
        md = consumer.list_topics(topic, timeout=10)
        consumer.assign(
            [TopicPartition(topic, p, OFFSET_BEGINNING) for p in md.topics[topic].partitions]
        )
        deadline = time.monotonic() + timeout
        while len(first) < len(job_ids):
            assert time.monotonic() < deadline, (
                f"timers of {job_ids} in {topic}: found {list(first)}"
            )
            for msg in consumer.consume(1000, 0.2):
                raw = (msg.headers() or []) if msg.error() is None else []
                pairs = list(raw.items()) if isinstance(raw, dict) else list(raw)
                headers = {k: v for k, v in pairs if isinstance(v, bytes)}
                job = (headers.get(hdr.JOB_ID) or b"").decode()
                if job in job_ids and job not in first and (hdr.VERSION in headers) == versioned:
                    first[job] = Record(
                        topic,
                        msg.partition() or 0,
                        msg.offset() or 0,
                        msg.key(),
                        msg.value(),
                        headers,
                        msg.timestamp()[1],
                    )
    finally:
        consumer.close()
    return list(first.values())


@pytest.mark.timeout(240)
@pytest.mark.parametrize("language", LANGUAGES)
def test_framed_values_through_a_schema_registry_run_as_plain_ones(
    language: str, settings: Settings, pipeline: None
) -> None:
    job_id = f"{language}-framed-{now_ms()}"
    with fake_registry() as (url, registry):
        out = run_ops(
            language,
            settings,
            [
                {
                    "op": "schedule",
                    "request": {
                        "task": "clients.record",
                        "queue": QUEUE,
                        "payload": {"json": {"framed": language}},
                        "delay_ms": 1_000,
                        "job_id": job_id,
                    },
                }
            ],
            registry_url=url,
        )
    subject = f"{settings.topic_prefix}.timers-value"
    job_avsc = (ROOT / "schemas/dueflow/schemas/job.avsc").read_text()
    assert list(registry.subjects) == [subject]
    (schema_id,) = registry.subjects[subject]
    assert json.loads(registry.schemas[schema_id]) == json.loads(job_avsc)
    wait_for(f"{job_id} ran", lambda: RUNS.of(job_id), 40)
    (run,) = RUNS.of(job_id)
    assert run[1] == {"framed": language}
    assert run[0] >= out[0]["due_ms"]
    # the emitter forwarded the framed value and its headers unchanged (every copy: a
    # fire may be repeated, and the workers run it once)
    fired = [
        r
        for r in read_topic(settings, names(settings).exec(QUEUE))
        if r.headers.get(hdr.JOB_ID) == job_id.encode()
    ]
    assert fired
    for copy in fired:
        schema = copy.headers.get(hdr.SCHEMA)
        assert schema == b"dueflow.Job/1+confluent"
        assert copy.value is not None
        assert copy.value[:5] == b"\x00" + schema_id.to_bytes(4, "big")
        assert unframe_job(copy.value, schema)[1:] == (b"dueflow.Job/1", schema_id)


def _doc_block(language: str) -> str:
    """The one code block of ``language`` in docs/clients.md."""
    doc = (ROOT / "docs/clients.md").read_text()
    blocks: list[str] = re.findall(rf"```{language}\n(.*?)```", doc, flags=re.DOTALL)
    assert len(blocks) == 1, f"docs/clients.md should have one {language} example"
    return blocks[0]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("language", LANGUAGES)
def test_the_examples_of_the_clients_page_compile(language: str, tmp_path: Path) -> None:
    """docs/clients.md shows one example per language: each compiles against the
    client as built (javac, go vet, tsc)."""
    if language == "java":
        lines = _doc_block("java").splitlines()
        imports = [line for line in lines if line.startswith("import ")]
        body = [line for line in lines if not line.startswith("import ")]
        source = "\n".join(
            [*imports, "public class Example { public static void main(String[] a) {", *body, "}}"]
        )
        (tmp_path / "Example.java").write_text(source)
        built = ROOT / "clients/java/target"
        classpath = f"{built / 'classes'}:{_read(built / 'classpath.txt')}"
        cmd = ["javac", "-d", str(tmp_path), "-cp", classpath, str(tmp_path / "Example.java")]
        cwd = tmp_path
    elif language == "go":
        (tmp_path / "main.go").write_text(_doc_block("go"))
        go_mod = (ROOT / "clients/go/go.mod").read_text()
        requires = go_mod[go_mod.index("require") :]
        (tmp_path / "go.mod").write_text(
            "module example\n\ngo 1.26.0\n\nrequire dueflow.dev/client v0.1.0\n\n"
            f"replace dueflow.dev/client => {ROOT / 'clients/go'}\n\n{requires}"
        )
        (tmp_path / "go.sum").write_text((ROOT / "clients/go/go.sum").read_text())
        cmd = ["go", "vet", "-mod=mod", "."]
        cwd = tmp_path
    else:
        ts = _doc_block("ts").replace('"@dueflow/client"', '"../src/index"')
        head, rest = ts.split("\n", 1)
        wrapped = f"{head}\n\nexport async function example(): Promise<void> {{\n{rest}}}\n"
        node = ROOT / "clients/node"
        (node / "test" / "docs_example.ts").write_text(wrapped)
        cmd = ["npx", "tsc", "-p", ".", "--noEmit"]
        cwd = node
    try:
        done = subprocess.run(
            cmd, cwd=cwd, capture_output=True, text=True, timeout=180, check=False
        )
    finally:
        (ROOT / "clients/node/test/docs_example.ts").unlink(missing_ok=True)
    assert done.returncode == 0, (
        f"the {language} example of docs/clients.md:\n{done.stdout}{done.stderr}"
    )
