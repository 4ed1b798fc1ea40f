"""The operator console's API on the status view as a process, against the real broker."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from dueflow.apps.cli.main import main
from dueflow.broker.ports import free_port
from dueflow.config import Settings
from dueflow.model import Backoff, BackoffKind
from dueflow.producers.scheduler import Scheduler
from tests.conftest import KafkaCluster
from tests.integration.pipeline_support import QUEUE, Pipeline, scrape, wait_for
from tests.integration.status_support import (
    ViewProcess,
    ensure_topics,
    outcome,
    start_view,
    write_outcomes,
)
from tests.integration.test_status_page import pipeline  # noqa: F401 (a fixture)


@pytest.fixture
def settings(kafka: KafkaCluster, prefix: str) -> Settings:
    s = kafka.settings(prefix, queues="default:3,billing:3")
    ensure_topics(s)
    return s


@pytest.fixture
def view(settings: Settings, tmp_path: Path) -> Iterator[ViewProcess]:
    proc = start_view(
        settings,
        port=free_port(),
        data_dir=tmp_path / "data",
        log_path=tmp_path / "view.log",
        queues="default:3,billing:3",
    )
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


def find(view: ViewProcess, **params: str) -> dict[str, Any]:
    status, doc = view.get("/api/jobs?" + urllib.parse.urlencode(params))
    assert status == 200, doc
    return dict(doc)


def ids(doc: dict[str, Any]) -> list[str]:
    return [j["job_id"] for j in doc["jobs"]]


@pytest.mark.timeout(120)
def test_find_jobs_by_state_queue_task_due_prefix_and_error(
    settings: Settings, view: ViewProcess
) -> None:
    t = int(time.time() * 1000)
    records = []
    for i in range(30):
        jid = f"inv-{i:03d}"
        queue = "billing" if i % 2 else "default"
        task = "charge" if i % 3 == 0 else "send_invoice"
        records.append(
            outcome(jid, "scheduled", at_ms=t + i, queue=queue, task=task, due_ms=t + i * 60_000)
        )
        if i % 5 == 0:
            records.append(
                outcome(
                    jid,
                    "dead",
                    at_ms=t + 1000 + i,
                    queue=queue,
                    task=task,
                    attempt=3,
                    error_type="ConnectionError",
                    error=f"<script>alert({i})</script> card declined by bank {i}.",
                )
            )
    write_outcomes(settings, records)
    view.wait_job("inv-025", "dead")
    # The job file is written once the view's changelog records are stored.
    deadline = time.monotonic() + 30
    while len(find(view, id_prefix="inv-")["jobs"]) < 30 and time.monotonic() < deadline:
        time.sleep(0.2)

    dead = find(view, state="dead")
    assert ids(dead) == ["inv-025", "inv-020", "inv-015", "inv-010", "inv-005", "inv-000"]
    assert "history" not in dead["jobs"][0]
    assert ids(find(view, state="dead", queue="billing")) == ["inv-025", "inv-015", "inv-005"]
    assert ids(find(view, state="dead", task="charge")) == ["inv-015", "inv-000"]
    assert ids(find(view, error="declined by bank 20.")) == ["inv-020"]
    assert ids(find(view, error="<script>alert(5)")) == ["inv-005"]
    assert ids(find(view, error="connectionerror", state="dead", queue="default")) == [
        "inv-020",
        "inv-010",
        "inv-000",
    ]
    window = find(
        view, due_from=str(t + 10 * 60_000), due_to=str(t + 13 * 60_000), state="scheduled"
    )
    assert ids(window) == ["inv-012", "inv-011"]  # 010 is dead
    # Newest change first: the dead ones (changed later) lead.
    assert ids(find(view, id_prefix="inv-01")) == [
        "inv-015",
        "inv-010",
        *[f"inv-{i:03d}" for i in (19, 18, 17, 16, 14, 13, 12, 11)],
    ]

    # Pages of 7 cover every job once, newest first.
    seen: list[str] = []
    params = {"limit": "7"}
    while True:
        page = find(view, **params)
        seen.extend(ids(page))
        if page["next"] is None:
            break
        params = {"limit": "7", "before": page["next"]}
    assert sorted(seen) == sorted(f"inv-{i:03d}" for i in range(30))
    assert len(seen) == 30

    status, bad = view.get("/api/jobs?state=exploded")
    assert status == 400
    assert bad["field"] == "state"
    status, bad = view.get("/api/jobs?due_from=tomorrow")
    assert status == 400
    assert "due_from" in bad["error"]


OPERATOR = "operator-token-of-the-console-test"
VIEWER = "viewer-token-of-the-console-test"


def call(
    view: ViewProcess, method: str, path: str, body: dict[str, Any] | None = None, token: str = ""
) -> tuple[int, dict[str, Any]]:
    headers = {"Content-Type": "application/json"}
    if token:
        headers["Authorization"] = f"Bearer {token}"
    data = None if method == "GET" else json.dumps(body or {}).encode()
    req = urllib.request.Request(view.url + path, method=method, data=data, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return int(resp.status), dict(json.loads(resp.read()))
    except urllib.error.HTTPError as exc:
        return int(exc.code), dict(json.loads(exc.read()))


# The retried job's one retry: fixed, no jitter, longer than the top tier (a retry timer).
# Long enough that the job still waits while the test reads it three ways.
RETRY_DELAY_MS = 15_000


@pytest.mark.timeout(300)
def test_actions_run_the_sdk_code_on_the_real_pipeline(
    pipeline: Pipeline,  # noqa: F811 (the fixture imported above)
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Cancel, run now, reschedule, pause/resume a cron schedule, through the API with
    the operator's bearer token; the viewer reads and is refused every action. A job
    whose first attempt fails shows, while it waits, when its next attempt is due (the
    API, ``Scheduler.status``, ``dueflow job``), and that attempt runs then, not before."""
    p = pipeline
    port, em_port = free_port(), free_port()
    env = {
        "DUEFLOW_OBSERVABILITY_STATUS_TOKEN": OPERATOR,
        "DUEFLOW_OBSERVABILITY_STATUS_VIEWER_TOKEN": VIEWER,
    }
    started = p.start(
        "view", "status-view", "--port", str(port), "--data-dir", str(tmp_path / "d"), env=env
    )
    view = ViewProcess(started.popen, port, started.log_path, OPERATOR)
    p.emitter(em_port)
    p.worker(free_port())
    view.wait_ready()
    wait_for(
        "an active emitter",
        lambda: (s := scrape(em_port)) is not None and s.value("dueflow_emitter_leader") == 1,
    )
    with Scheduler(p.settings, scheduled_outcomes=True) as s:
        to_cancel = s.schedule("ok", {"n": 1}, queue=QUEUE, delay=3600)
        to_run = s.schedule("ok", {"n": 2}, queue=QUEUE, delay=3600)
        to_move = s.schedule("ok", {"n": 3}, queue=QUEUE, delay=3600)
        retried = s.schedule(
            "flaky",
            {"n": 4},
            queue=QUEUE,
            delay=0,
            backoff=Backoff(BackoffKind.FIXED, base_ms=RETRY_DELAY_MS, jitter=False),
        )
        s.add_schedule(
            "nightly", cron="30 2 * * *", timezone="Europe/Berlin", task="ok", queue=QUEUE
        )

    def job_state(job_id: str) -> dict[str, Any]:
        return call(view, "GET", f"/jobs/{job_id}", token=VIEWER)[1]

    def reaches(job_id: str, state: str) -> dict[str, Any]:
        found: dict[str, Any] = wait_for(
            f"{job_id} {state}", lambda: (v := job_state(job_id)).get("state") == state and v, 90
        )
        return found

    for job in (to_cancel, to_run, to_move):
        reaches(job.job_id, "scheduled")

    # The flaky job's first attempt failed: while it waits, its next attempt's due time.
    def retrying() -> dict[str, Any] | None:
        status, page = call(view, "GET", f"/api/jobs/{retried.job_id}", token=VIEWER)
        assert status == 200 or status == 404, page
        return page if status == 200 and page["job"]["state"] == "retrying" else None

    waiting = wait_for("the failed job retrying", retrying, 90)
    next_due = waiting["job"]["next_due_ms"]
    (failed,) = [e for e in waiting["timeline"] if e["state"] == "retrying"]
    assert failed["attempt"] == 1
    assert next_due == failed["at_ms"] + RETRY_DELAY_MS  # the retry's due time
    assert failed["next_due_ms"] == next_due
    assert waiting["timeline"][-1] == {"state": "retry_due", "attempt": 2, "at_ms": next_due}
    assert [(a["attempt"], a["retry_due_ms"]) for a in waiting["attempts"]] == [(1, next_due)]
    assert waiting["job"]["due_ms"] == retried.due_ms  # the job's own due time stays
    asking = replace(
        p.settings,
        observability=replace(
            p.settings.observability, status_url=view.url, status_viewer_token=VIEWER
        ),
    )
    with Scheduler(asking) as s:
        st = s.status(retried.job_id)
    assert st is not None
    assert (st.source, st.state, st.next_due_ms) == ("status-view", "retrying", next_due)
    # dueflow job: --json has it; the text says when, as a date, and how far it is
    monkeypatch.setenv("DUEFLOW_OBSERVABILITY_STATUS_TOKEN", VIEWER)
    common = ["--bootstrap", p.bootstrap, "--topic-prefix", p.prefix, "--url", view.url]
    assert main(["job", retried.job_id, *common, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["job"]["next_due_ms"] == next_due
    assert main(["job", retried.job_id, *common]) == 0
    when = datetime.fromtimestamp(next_due / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]
    (row,) = [ln for ln in capsys.readouterr().out.splitlines() if "next attempt due" in ln]
    assert f"{when}Z (" in row, row  # (in 14s)

    # Reads need a token now; the viewer reads, and may not act.
    assert call(view, "GET", f"/api/jobs/{to_cancel.job_id}")[0] == 401
    status, page = call(view, "GET", f"/api/jobs/{to_cancel.job_id}", token=VIEWER)
    assert status == 200
    assert page["job"]["state"] == "scheduled"
    status, refused = call(view, "POST", f"/api/jobs/{to_cancel.job_id}/cancel", token=VIEWER)
    assert status == 403
    assert "viewer" in refused["error"]

    # A pending job's payload, read from its timer: operators only (the default).
    status, found = call(view, "GET", f"/api/jobs/{to_move.job_id}/payload", token=OPERATOR)
    assert status == 200, found
    assert json.loads(found["payload"]["text"]) == {"n": 3}
    assert call(view, "GET", f"/api/jobs/{to_move.job_id}/payload", token=VIEWER)[0] == 403

    status, done = call(view, "POST", f"/api/jobs/{to_cancel.job_id}/cancel", token=OPERATOR)
    assert status == 200, done
    assert done["done"] is True
    reaches(to_cancel.job_id, "cancelled")
    # Cancelling a cancelled job: no second cancellation (the SDK's answer).
    status, again = call(
        view,
        "POST",
        f"/api/jobs/{to_cancel.job_id}/cancel",
        {"again": True},
        token=OPERATOR,
    )
    assert status == 200
    assert again["done"] is False

    status, done = call(view, "POST", f"/api/jobs/{to_run.job_id}/run-now", token=OPERATOR)
    assert done["done"] is True, done
    ran = reaches(to_run.job_id, "succeeded")
    assert ran["started_ms"] < to_run.due_ms  # run now, not in an hour

    later = int(time.time() * 1000) + 2 * 3600_000
    status, moved = call(
        view,
        "POST",
        f"/api/jobs/{to_move.job_id}/reschedule",
        {"run_at": str(later)},
        token=OPERATOR,
    )
    assert moved["done"] is True, moved
    wait_for(
        "the new due time in the view",
        lambda: abs(job_state(to_move.job_id).get("due_ms", 0) - later) < 2000,
    )

    status, paused = call(view, "POST", "/api/schedules/nightly/pause", token=OPERATOR)
    assert paused["paused"] is True, paused
    with Scheduler(p.settings) as s:
        stored = s.get_schedule("nightly")
        assert stored is not None
        assert stored.paused
    status, resumed = call(view, "POST", "/api/schedules/nightly/resume", token=OPERATOR)
    assert resumed["paused"] is False
    status, unknown = call(view, "POST", "/api/schedules/nope/pause", token=OPERATOR)
    assert status == 400
    assert unknown["field"] == "schedule"

    # Watch: the cron schedule's next three runs in its zone, the emitter's leader.
    def watched() -> dict[str, Any] | None:
        doc = call(view, "GET", "/api/watch", token=VIEWER)[1]
        crons = [c for c in doc.get("schedules") or [] if c["schedule_id"] == "nightly"]
        return doc if crons and not crons[0]["paused"] and doc["emitter"]["leader"] else None

    doc = wait_for("the watch document", watched, 60)
    (nightly,) = [c for c in doc["schedules"] if c["schedule_id"] == "nightly"]
    assert len(nightly["next_runs"]) == 3
    assert all("T02:30:00+0" in r for r in nightly["next_runs"])
    assert doc["queues"][QUEUE]["ended"] >= 1

    # The retried job ran its second attempt at its retry's due time, not before.
    done = reaches(retried.job_id, "succeeded")
    assert done["attempts"] == 2
    assert done["started_ms"] >= next_due
    assert "next_due_ms" not in done

    actions = call(view, "GET", "/api/actions", token=VIEWER)[1]["actions"]
    assert [a["action"] for a in actions][::-1] == [
        "cancel",
        "cancel",
        "run-now",
        "reschedule",
        "pause schedule",
        "resume schedule",
        "pause schedule",
    ]
    assert all(a["who"].startswith("bearer token (operator") for a in actions)

    # The audit log: one line per action, in order, with the caller and the result;
    # the viewer's refused cancel too; neither token anywhere in the log.
    text = started.log_path.read_text(errors="replace")
    logged = [json.loads(line) for line in text.splitlines() if line.startswith("{")]
    audit = [e for e in logged if e["event"] == "console.action"]
    assert [(e["action"], e["target"], e["result"]) for e in audit] == [
        ("cancel", to_cancel.job_id, "done"),
        ("cancel", to_cancel.job_id, "not done"),
        ("run-now", to_run.job_id, "done"),
        ("reschedule", to_move.job_id, "done"),
        ("pause schedule", "nightly", "done"),
        ("resume schedule", "nightly", "done"),
        ("pause schedule", "nope", "refused"),
    ]
    assert {(e["role"], e["credential"]) for e in audit} == {("operator", "bearer operator token")}
    assert audit[3]["params"] == {"run_at": str(later)}
    (refused,) = [e for e in logged if e["event"] == "console.action_refused"]
    assert (refused["role"], refused["credential"], refused["status"]) == (
        "viewer",
        "bearer viewer token",
        403,
    )
    assert OPERATOR not in text
    assert VIEWER not in text
