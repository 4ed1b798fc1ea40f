"""Hostile text through every operator output, against the real broker.

Records written by another client (not through dueflow's doors) carry job ids,
keys, task names, handler errors, operator names and schedule ids full of
terminal escapes, NUL, CR/LF, C1 controls, bidi overrides, invalid UTF-8 and
very long strings. A worker (text logs) runs the jobs into the DLQ; then every
command that prints wire data runs, as text and as JSON: no raw control
character reaches its output (text keeps only its own newlines; JSON parses and
gives back the hostile strings exactly), and nothing raises. The status view,
run as a process, is checked the same way, with the Authorization and Origin
checks of state-changing calls.
"""

from __future__ import annotations

import json
import socket
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dueflow import headers as hdr
from dueflow.apps.cli.main import main
from dueflow.apps.ops.dlq import read_dead_letters
from dueflow.apps.ops.queue_admin import create_queue
from dueflow.broker.ports import free_port
from dueflow.config import QueueSpec, Settings
from dueflow.consumers.testing import ExecWriter, exec_headers, make_job
from dueflow.control_chars import escape_text
from dueflow.kafka.clients import make_producer
from dueflow.kafka.pausing import write_queue_control
from dueflow.kafka.reading import ops_consumer
from dueflow.kafka.topics import names
from dueflow.records import codec
from dueflow.records.pause_command import QueueControl
from dueflow.rules.cron import CronSchedule
from dueflow.wall_clock import wall_ms
from tests.conftest import KafkaCluster
from tests.integration.pipeline_support import Pipeline, wait_for
from tests.integration.status_support import outcome, start_view, write_outcomes

QUEUE = "jobs"
ESC = "\x1b[31mred\x1b[0m\x1b]0;title\x07"
HOSTILE_IDS = [
    "id-" + ESC,
    "id-nul\x00x",
    "id-cr\rFAKE LINE",
    "id-lf\ndead letter(s) in queue forged",
    "id-c1\x9b31m\x85",
    "id-bidi\u202eevil\u2066x\u2069",
    "id-ls\u2028x\u2029y",
    "id-long-" + "\x1b" * 300,
]
HOSTILE_ERROR = "boom " + ESC + " \x00\r\n\u202e\x9b " + "x\x1b" * 20_000
HOSTILE_TASK = "task\x1b[2J"
HOSTILE_BY = "op\x1b[5m\u202e\x9b"

# Every character of dueflow.control_chars.CONTROL_CHARS.
RAW = set(map(chr, [*range(0x20), *range(0x7F, 0xA0)])) | set(
    "\u061c\u200e\u200f\u2028\u2029\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
)


def raw_in(text: str, *, keep: str = "") -> set[str]:
    return (set(text) & RAW) - set(keep)


def run(capsys: pytest.CaptureFixture[str], pipeline: Pipeline, *argv: str) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(
        [
            *argv,
            "--bootstrap",
            pipeline.bootstrap,
            "--topic-prefix",
            pipeline.prefix,
            "--config",
            str(pipeline.config),
        ]
    )
    out, err = capsys.readouterr()
    return code, out, err


def check_text(out: str, err: str) -> None:
    assert not raw_in(out, keep="\n"), f"raw control characters in stdout: {out[:2000]!r}"
    assert not raw_in(err, keep="\n"), f"raw control characters in stderr: {err[:2000]!r}"


def check_json(out: str, err: str) -> Any:
    assert not raw_in(out, keep="\n"), f"raw control characters in JSON: {out[:2000]!r}"
    assert not raw_in(err, keep="\n")
    return json.loads(out)


def strings_of(doc: Any) -> set[str]:
    """Every string value and key anywhere in a JSON document."""
    if isinstance(doc, str):
        return {doc}
    if isinstance(doc, dict):
        return set(doc).union(*(strings_of(v) for v in doc.values())) if doc else set()
    if isinstance(doc, list):
        return set().union(*(strings_of(v) for v in doc)) if doc else set()
    return set()


@pytest.fixture
def pipeline(kafka: KafkaCluster, prefix: str, tmp_path: Path) -> Iterator[Pipeline]:
    p = Pipeline(kafka.bootstrap, prefix, tmp_path)
    try:
        yield p
    finally:
        p.stop_all()


def write_hostile_records(settings: Settings) -> None:
    """As another client would: exec records, a raw DLQ record, a control record, a
    registry record and a schedule, every one carrying hostile text."""
    writer = ExecWriter(settings)
    jobs = [
        make_job("explode", {"message": HOSTILE_ERROR}, queue=QUEUE, job_id=j, key="key-" + j)
        for j in HOSTILE_IDS
    ]
    jobs.append(make_job(HOSTILE_TASK, {}, queue=QUEUE, job_id="id-task-" + ESC))
    writer.write(jobs)
    # Not a job at all: invalid UTF-8 in key, headers and value.
    bad = make_job("explode", {}, queue=QUEUE, job_id="id-undecodable")
    headers = [(k, v) for k, v in exec_headers(bad) if k not in (hdr.JOB_ID, hdr.TASK)]
    headers += [(hdr.JOB_ID, b"\xff\xfe\x1b[31m"), (hdr.TASK, b"\xc3\x28\x9b")]
    writer.write_raw(QUEUE, b"\xff\x1b[2J\xfe", b"\xff\x00\x1b[31mnot avro", headers)
    writer.flush()

    producer = make_producer(settings)
    producer.produce(
        names(settings).dlq(QUEUE),
        b"\xff\x1b]0;x\x07 not a dead letter",
        b"\xfe\x1b[2J",
        headers=[(hdr.JOB_ID, b"\x1b[31m\xff"), ("df-other", b"\x9b\xc2\x9b")],
    )
    schedule = CronSchedule(
        schedule_id="sched-" + ESC + "\u202e",
        cron="0 3 * * *",
        timezone="UTC",
        queue=QUEUE,
        task="explode",
        payload=b"{}",
        version=1,
        created_ms=wall_ms(),
        updated_ms=wall_ms(),
        labels={"team\x1b[1m": "ops\u202e"},
    )
    producer.produce(
        names(settings).schedules,
        codec.encode("schedule", schedule.to_record()),
        schedule.schedule_id.encode(),
        headers=[
            (hdr.SCHEDULE_VERSION, b"1"),
            (hdr.SCHEMA, codec.schema_header("schedule")),
        ],
    )
    assert producer.flush(30) == 0
    now = wall_ms()
    write_outcomes(
        settings,
        [
            outcome(
                "id-outcome-" + ESC,
                "dead",
                at_ms=now,
                queue=QUEUE,
                task="explode",
                attempt=1,
                error_type="Err\x1b[1m",
                error=HOSTILE_ERROR,
                worker="w\x1b[2J\u202e",
                trace_id="t\x00\x9b",
            )
        ],
    )
    create_queue(settings, QueueSpec("hostq", 1), by=HOSTILE_BY, now_ms=now)


def dead_letters(settings: Settings) -> list[Any]:
    consumer = ops_consumer(settings)
    try:
        return read_dead_letters(settings, consumer, QUEUE, timeout_s=30)
    finally:
        consumer.close()


@pytest.mark.timeout(300)
def test_no_raw_control_character_reaches_any_cli_output(
    pipeline: Pipeline, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = pipeline.settings
    write_hostile_records(settings)
    worker = pipeline.start(
        "worker",
        "worker",
        "--app",
        "tests.integration.hostile_app",
        "--queues",
        QUEUE,
        "--metrics-port",
        str(free_port()),
        "--log-format",
        "text",
    )
    # every job dead-lettered: the hostile ones, the unknown task, the undecodable one,
    # and the record another client wrote to the DLQ itself
    expected = len(HOSTILE_IDS) + 3
    wait_for(
        "every hostile job in the DLQ",
        lambda: len(dead_letters(settings)) >= expected,
        120,
    )
    entries = dead_letters(settings)
    write_queue_control(
        settings, QueueControl(QUEUE, paused=True, by=HOSTILE_BY, at_ms=wall_ms(), reason=ESC)
    )

    # --- dlq list / show / redrive --dry-run
    code, out, err = run(capsys, pipeline, "dlq", "list", "--queue", QUEUE, "--limit", "0")
    assert code == 0, err
    check_text(out, err)
    for job_id in HOSTILE_IDS:
        assert escape_text(job_id) in out
    assert f"{len(entries)} dead letter(s) in queue {QUEUE}" in out.splitlines()[-1]
    code, out, err = run(
        capsys, pipeline, "dlq", "list", "--queue", QUEUE, "--limit", "0", "--json"
    )
    listed = check_json(out, err)
    assert set(HOSTILE_IDS) <= {e["job_id"] for e in listed["entries"]}
    for entry in entries:
        for fmt in ((), ("--json",)):
            code, out, err = run(capsys, pipeline, "dlq", "show", entry.ref, "--queue", QUEUE, *fmt)
            assert code == 0, err
            if fmt:
                shown = check_json(out, err)
                if entry.job_id in HOSTILE_IDS:
                    assert shown["job_id"] == entry.job_id
                    assert HOSTILE_ERROR[:100] in shown["error_message"]
            else:
                check_text(out, err)
    for fmt in ((), ("--json",)):
        code, out, err = run(
            capsys, pipeline, "dlq", "redrive", "--queue", QUEUE, "--all", "--dry-run", *fmt
        )
        assert code == 0, err
        (check_json if fmt else check_text)(out, err)

    # --- job (Kafka-direct), status
    for job_id in [HOSTILE_IDS[0], HOSTILE_IDS[3], "id-outcome-" + ESC]:
        code, out, err = run(capsys, pipeline, "job", job_id, "--kafka")
        assert code == 0, err
        check_text(out, err)
        assert escape_text(job_id) in out
        code, out, err = run(capsys, pipeline, "job", job_id, "--kafka", "--json")
        assert check_json(out, err)["job"]["job_id"] == job_id
    for fmt in ((), ("--json",)):
        code, out, err = run(capsys, pipeline, "status", "--kafka", *fmt)
        assert code == 0, err
        (check_json if fmt else check_text)(out, err)

    # --- queue list / describe, cron list, replay --dry-run
    for argv in (
        ["queue", "list"],
        ["queue", "describe", QUEUE],
        ["queue", "describe", "hostq"],
        ["cron", "list"],
        ["replay", "--topic", names(settings).exec(QUEUE), "--from", "0", "--dry-run"],
    ):
        code, out, err = run(capsys, pipeline, *argv)
        assert code == 0, (argv, err)
        check_text(out, err)
        code, out, err = run(capsys, pipeline, *argv, "--json")
        assert code == 0, (argv, err)
        doc = check_json(out, err)
        if argv[:2] == ["queue", "list"]:
            assert HOSTILE_BY in strings_of(doc)
            assert ESC in strings_of(doc)
        if argv[0] == "cron":
            assert "sched-" + ESC + "\u202e" in strings_of(doc)

    # --- the worker's console (text logs) never wrote one raw either
    log = worker.log_path.read_bytes().decode("utf-8", "surrogateescape")
    assert "id-" in log
    assert not raw_in(log, keep="\n"), repr(log[:2000])


def _raw_request(port: int, head: bytes) -> tuple[int, bytes]:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    raw = b"".join(chunks)
    status_line, _, rest = raw.partition(b"\r\n")
    return int(status_line.split()[1]), rest.partition(b"\r\n\r\n")[2]


@pytest.mark.timeout(240)
def test_the_running_status_view_escapes_and_refuses_what_it_cannot_read(
    kafka: KafkaCluster,
    prefix: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    pipeline = Pipeline(kafka.bootstrap, prefix, tmp_path)
    settings = pipeline.settings
    now = wall_ms()
    hostile = "id-view-" + ESC + "\u202e\x00"
    write_outcomes(
        settings,
        [
            outcome(hostile, "scheduled", at_ms=now, queue=QUEUE, task="explode", due_ms=now),
            outcome(
                hostile,
                "dead",
                at_ms=now + 1,
                queue=QUEUE,
                task="explode",
                attempt=1,
                error_type="E\x1b[1m",
                error=HOSTILE_ERROR,
                worker="w\x9b",
            ),
        ],
    )
    token = "status-view-token-of-the-tests"
    view = start_view(
        settings,
        port=free_port(),
        data_dir=tmp_path / "data",
        log_path=tmp_path / "view.log",
        queues=f"{QUEUE}:3",
        token=token,
    )
    try:
        view.wait_ready()
        quoted = urllib.parse.quote(hostile, safe="")
        wait_for("the hostile job in the view", lambda: view.get(f"/jobs/{quoted}")[0] == 200, 60)
        for path in (f"/jobs/{quoted}", "/api/overview", "/queues"):
            with urllib.request.urlopen(view.url + path, timeout=10) as resp:
                body = resp.read().decode()
            assert not raw_in(body), (path, body[:1000])
            doc = json.loads(body)
            if path.startswith("/jobs/"):
                assert doc["job_id"] == hostile
                assert doc["last_error"]["message"].startswith(HOSTILE_ERROR[:100])
        # the CLI through the view: text and JSON
        for argv in (["job", hostile], ["status"]):
            capsys.readouterr()
            code = main([*argv, "--url", view.url, "--bootstrap", kafka.bootstrap])
            out, err = capsys.readouterr()
            assert code == 0, err
            check_text(out, err)
            capsys.readouterr()
            code = main([*argv, "--url", view.url, "--bootstrap", kafka.bootstrap, "--json"])
            out, err = capsys.readouterr()
            check_json(out, err)

        # Authorization it cannot read: 401, not 500, and no traceback in its log.
        for authorization in (b"Bearer \xff\xfe", b"Bearer \xe9t\xe9", b"Basic !!!"):
            status, body = _raw_request(
                view.port,
                b"POST /dlq/%s/redrive HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nAuthorization: %s\r\n"
                b"Content-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n"
                b"\r\n{}" % (QUEUE.encode(), view.port, authorization),
            )
            assert status == 401, body
            assert "token" in json.loads(body)["error"]
        # the whole origin: the page is http, an https origin of the same host:port is not it
        for origin, expected in ((b"https://127.0.0.1:%d", 403), (b"http://127.0.0.1:%d", 200)):
            status, body = _raw_request(
                view.port,
                b"POST /dlq/%s/redrive HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nOrigin: %s\r\n"
                b"Authorization: Bearer %s\r\nContent-Type: application/json\r\n"
                b"Content-Length: 2\r\nConnection: close\r\n\r\n{}"
                % (QUEUE.encode(), view.port, origin % view.port, token.encode()),
            )
            assert status == expected, body
        log = view.log()
        assert "Traceback" not in log, log
        assert "Error handling request" not in log, log
    finally:
        view.stop()


@pytest.mark.timeout(120)
def test_the_clients_refuse_such_names_against_the_broker(pipeline: Pipeline) -> None:
    """The doors of tests/unit/test_name_doors.py, with the real clients: nothing is
    written, the error names the field and shows the value escaped."""
    import asyncio

    from dueflow.errors import InvalidInput
    from dueflow.producers.aio import AsyncScheduler
    from dueflow.producers.scheduler import Scheduler

    settings = pipeline.settings
    hostile = HOSTILE_IDS[0]
    with Scheduler(settings) as s:
        for call in (
            lambda: s.schedule("explode", job_id=hostile, queue=QUEUE),
            lambda: s.schedule("explode", idempotency_key=hostile, queue=QUEUE),
            lambda: s.cancel(hostile, queue=QUEUE),
            lambda: s.add_schedule(
                hostile, cron="* * * * *", timezone="UTC", task="explode", queue=QUEUE
            ),
        ):
            with pytest.raises(InvalidInput) as info:
                call()
            assert escape_text(hostile) in str(info.value)
            assert not raw_in(str(info.value))
        bulk = s.schedule_many([{"task": "explode", "job_id": hostile, "queue": QUEUE}])
        assert bulk.failed == 1
        assert bulk.errors[0].field == "job_id"

    async def from_asyncio() -> None:
        async with AsyncScheduler(settings) as a:
            with pytest.raises(InvalidInput, match="job_id"):
                await a.schedule("explode", job_id=hostile, queue=QUEUE)
            with pytest.raises(InvalidInput, match="idempotency_key"):
                await a.schedule("explode", idempotency_key="k\u202e", queue=QUEUE)

    asyncio.run(from_asyncio())
    from tests.integration.records import read_all

    assert read_all(settings, names(settings).timers) == []
