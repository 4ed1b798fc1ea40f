"""``dueflow schedule``, ``dueflow cancel`` and ``dueflow cron`` against the real broker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from dueflow import headers as hdr
from dueflow.apps.cli.main import main
from dueflow.config import Settings, load_settings
from dueflow.kafka.clients import make_admin
from dueflow.kafka.topic_admin import TopicAdmin
from dueflow.kafka.topics import names, topic_layout
from dueflow.records import codec
from tests.conftest import KafkaCluster
from tests.integration.records import headers_of, high_watermarks, read_all

WHEEL_ENV = {
    "DUEFLOW_WHEEL_LEVELS": "10x1000,10x5000",
    "DUEFLOW_WHEEL_NEAR_PARTITIONS": "2",
    "DUEFLOW_WHEEL_NEAR_WINDOW_MS": "1500",
    "DUEFLOW_WHEEL_LOOKAHEAD_MS": "200",
}


@pytest.fixture
def env(kafka: KafkaCluster, prefix: str, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    values = {
        **WHEEL_ENV,
        "DUEFLOW_BOOTSTRAP": kafka.bootstrap,
        "DUEFLOW_TOPIC_PREFIX": prefix,
        "DUEFLOW_QUEUES": "default:3,billing:2",
    }
    for key, value in values.items():
        monkeypatch.setenv(key, value)
    return values


@pytest.fixture
def settings(env: dict[str, str]) -> Settings:
    s = load_settings(env=env)
    assert TopicAdmin(make_admin(s), replication_factor=1).ensure(topic_layout(s)).ok
    return s


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    data = json.loads(out) if "--json" in argv and out.strip() else out
    return code, data, err


def test_schedule_json(
    settings: Settings, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    params = tmp_path / "params.json"
    params.write_text('{"to": "a@example.com", "n": [1, 2]}')
    code, data, err = run(
        capsys,
        "schedule",
        "send_email",
        "--payload",
        f"@{params}",
        "--delay",
        "90s",
        "--queue",
        "billing",
        "--job-id",
        "cli-1",
        "--idempotency-key",
        "welcome:a",
        "--max-attempts",
        "3",
        "--backoff",
        "fixed:1s:10s",
        "--timeout",
        "30s",
        "--json",
    )
    assert (code, err) == (0, "")
    assert data["job_id"] == "cli-1"
    assert data["queue"] == "billing"
    assert data["idempotency_key"] == "welcome:a"
    assert data["duplicate"] is False
    assert data["due"].endswith("Z")
    (msg,) = read_all(settings, names(settings).timers)
    assert msg.partition() == data["partition"]
    assert hdr.header_int(headers_of(msg), hdr.DUE) == data["due_ms"]
    value = codec.decode("job", msg.value() or b"")
    assert value["payload"] == b'{"n":[1,2],"to":"a@example.com"}'
    assert (value["max_attempts"], value["timeout_ms"]) == (3, 30_000)

    code, text, _ = run(capsys, "schedule", "ping", "--at", "2031-01-01T09:00:00+01:00")
    assert code == 0
    assert "scheduled job" in text
    assert "due 2031-01-01T08:00:00.000Z" in text


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["--at", "2031-01-01T09:00:00"], "run_at"),
        (["--queue", "reports"], "queue"),
        (["--delay=-5s"], "delay"),
        (["--max-attempts", "0"], "max_attempts"),
        (["--backoff", "linear"], "backoff"),
        (["--payload", "{not json"], "payload"),
        (["--payload", "@/nonexistent/params.json"], "payload"),
        (["--timeout", "forever"], "timeout"),
    ],
)
def test_schedule_bad_input_exits_2_and_writes_nothing(
    settings: Settings, capsys: pytest.CaptureFixture[str], argv: list[str], field: str
) -> None:
    before = high_watermarks(settings, [names(settings).timers])
    code, out, err = run(capsys, "schedule", "t", *argv, "--json")
    assert code == 2
    assert out == ""
    assert err.startswith(f"dueflow: {field}: got ")
    assert "accepted:" in err
    assert high_watermarks(settings, [names(settings).timers]) == before


def test_cancel_json(settings: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    # a job nobody scheduled: not found, written blind to --queue, and exit 1 says so
    code, data, _ = run(
        capsys, "cancel", "job-9", "--queue", "billing", "--idempotency-key", "invoice:9", "--json"
    )
    assert code == 1
    assert (data["job_id"], data["queue"], data["idempotency_key"]) == (
        "job-9",
        "billing",
        "invoice:9",
    )
    assert (data["found"], data["cancelled"]) == (False, True)
    (idem,) = read_all(settings, names(settings).idempotency("billing"))
    assert idem.key() == b"invoice:9"
    assert idem.partition() == data["partition"]
    code, _, err = run(capsys, "cancel", "job-9", "--queue", "nope")
    assert code == 2
    assert "queue" in err
    # without --queue a job that is not known is refused: no queue to guess
    code, _, err = run(capsys, "cancel", "job-10")
    assert code == 2
    assert "give queue= (--queue on the command line)" in err
    # a job scheduled from the shell is found: its queue and key come from its outcomes
    code, job, _ = run(
        capsys,
        "schedule",
        "t",
        "--queue",
        "billing",
        "--delay",
        "1h",
        "--idempotency-key",
        "inv:11",
        "--json",
    )
    assert code == 0
    code, data, _ = run(capsys, "cancel", job["job_id"], "--json")
    assert code == 0
    assert (data["queue"], data["idempotency_key"], data["found"], data["state"]) == (
        "billing",
        "inv:11",
        True,
        "scheduled",
    )
    code, out, _ = run(capsys, "cancel", job["job_id"])
    assert code == 1
    assert "not cancelled: it has cancelled already" in out


def test_cron_commands_json(settings: Settings, capsys: pytest.CaptureFixture[str]) -> None:
    code, added, _ = run(
        capsys,
        "cron",
        "add",
        "nightly",
        "--cron",
        "0 3 * * *",
        "--tz",
        "Europe/Paris",
        "--task",
        "build_report",
        "--payload",
        '{"kind": "daily"}',
        "--misfire",
        "skip",
        "--jitter",
        "1m",
        "--json",
    )
    assert code == 0
    assert (added["schedule_id"], added["misfire"], added["jitter_ms"]) == (
        "nightly",
        "skip",
        60_000,
    )
    assert added["next"].endswith(":00:00.000Z")  # 03:00 Paris is 01:00 or 02:00 UTC
    run(capsys, "cron", "add", "hourly", "--cron", "@hourly", "--tz", "UTC", "--task", "ping")
    code, listed, _ = run(capsys, "cron", "list", "--json")
    assert code == 0
    assert [s["schedule_id"] for s in listed] == ["hourly", "nightly"]
    code, paused, _ = run(capsys, "cron", "pause", "nightly", "--json")
    assert (code, paused["paused"], paused["next"]) == (0, True, None)
    assert paused["version"] > added["version"]
    code, resumed, _ = run(capsys, "cron", "resume", "nightly", "--json")
    assert (code, resumed["paused"]) == (0, False)
    code, updated, _ = run(capsys, "cron", "update", "nightly", "--cron", "0 4 * * *", "--json")
    assert (code, updated["cron"], updated["misfire"]) == (0, "0 4 * * *", "skip")
    code, table, _ = run(capsys, "cron", "list")
    assert "nightly" in table
    assert "Europe/Paris" in table
    code, deleted, _ = run(capsys, "cron", "delete", "nightly", "--json")
    assert (code, deleted) == (0, {"schedule_id": "nightly", "deleted": True})
    code, deleted, _ = run(capsys, "cron", "delete", "nightly", "--json")
    assert (code, deleted["deleted"]) == (1, False)
    code, listed, _ = run(capsys, "cron", "list", "--json")
    assert [s["schedule_id"] for s in listed] == ["hourly"]


@pytest.mark.parametrize(
    ("argv", "field"),
    [
        (["--cron", "61 * * * *", "--tz", "UTC"], "cron"),
        (["--cron", "0 3 * * *", "--tz", "Europe/Pariss"], "timezone"),
        (["--cron", "0 3 * * *", "--tz", "UTC", "--queue", "nope"], "queue"),
        (["--cron", "0 3 * * *", "--tz", "UTC", "--misfire", "maybe"], "misfire"),
        (["--cron", "0 3 * * *", "--tz", "UTC", "--start", "2031-01-01T00:00:00"], "start"),
        # a cron that can never fire: February 30, or an end before its first occurrence
        (["--cron", "0 0 30 2 *", "--tz", "UTC"], "cron"),
        (["--cron", "0 3 * * *", "--tz", "UTC", "--end", "2020-01-01T00:00:00Z"], "end"),
    ],
)
def test_cron_bad_input_exits_2_and_writes_nothing(
    settings: Settings, capsys: pytest.CaptureFixture[str], argv: list[str], field: str
) -> None:
    before = high_watermarks(settings, [names(settings).schedules])
    code, out, err = run(capsys, "cron", "add", "s", "--task", "t", *argv, "--json")
    assert (code, out) == (2, "")
    assert err.startswith(f"dueflow: {field}: got ")
    if field in ("cron", "end"):
        assert argv[1] in err  # the message names the expression
    assert high_watermarks(settings, [names(settings).schedules]) == before


def test_the_installed_command(settings: Settings, env: dict[str, str]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "dueflow", "schedule", "ping", "--delay", "1h", "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["task"] == "ping"
    assert len(read_all(settings, names(settings).timers)) == 1


def _timers_of(settings: Settings, job_id: str) -> list[Any]:
    return [
        m
        for m in read_all(settings, names(settings).timers)
        if hdr.header(headers_of(m), hdr.JOB_ID) == job_id.encode()
    ]


@pytest.mark.timeout(180)
def test_a_job_id_reused_with_other_content_is_reported_across_processes(
    settings: Settings, env: dict[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Each CLI call is a new process with an empty memory: the job id is looked up in
    the cluster (its `scheduled` outcome's content hash), so the second call with
    another payload exits 2 with a message instead of exiting 0 unrun."""
    argv = ["schedule", "send_email", "--job-id", "reused-1", "--delay", "1h"]
    code, out, err = run(capsys, *argv, "--payload", '{"n": 1}')
    assert code == 0, err
    assert out.startswith("scheduled job reused-1 due ")
    # another payload, from a fresh process
    proc = subprocess.run(
        [sys.executable, "-m", "dueflow", *argv, "--payload", '{"n": 2}'],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stdout == ""
    assert proc.stderr.startswith("dueflow: job_id 'reused-1' already exists with other content")
    assert "not scheduled again" in proc.stderr
    # the same payload again: the earlier job, nothing written (exit 0)
    code, data, err = run(capsys, *argv, "--payload", '{"n": 1}', "--json")
    assert code == 0, err
    assert (data["job_id"], data["duplicate"]) == ("reused-1", True)
    # another task under the id: refused too
    code, _out, err = run(capsys, "schedule", "other_task", "--job-id", "reused-1")
    assert code == 2
    assert "task 'send_email'" in err
    assert len(_timers_of(settings, "reused-1")) == 1

    # The SDK behaves the same with check_existing_ids (off by default: it costs a
    # lookup per call with a job id the client does not remember).
    from dueflow.errors import ConflictError
    from dueflow.producers.aio import AsyncScheduler
    from dueflow.producers.scheduler import Scheduler

    with Scheduler(settings, check_existing_ids=True) as s:
        with pytest.raises(ConflictError):
            s.schedule("send_email", {"n": 3}, job_id="reused-1", delay="1h")
        assert s.schedule("send_email", {"n": 1}, job_id="reused-1", delay="1h").duplicate

    async def from_asyncio() -> None:
        async with AsyncScheduler(settings, check_existing_ids=True) as a:
            with pytest.raises(ConflictError):
                await a.schedule("send_email", {"n": 4}, job_id="reused-1")
            assert (await a.schedule("send_email", {"n": 1}, job_id="reused-1")).duplicate

    import asyncio

    asyncio.run(from_asyncio())
    assert len(_timers_of(settings, "reused-1")) == 1
