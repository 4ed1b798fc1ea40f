"""The console's audit log: one ``console.action`` line per mutation with the caller's
name, role and credential, the action, its target and parameters and the result; a
refused mutation logged too; no token, session id or CSRF token in any line (over
fakes; the real broker's run: tests/integration/test_console_api.py)."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator
from typing import Any, cast

import pytest
from aiohttp.test_utils import TestClient, TestServer

from dueflow.errors import InvalidInput
from dueflow.observability.logs import JsonFormatter
from dueflow.observability.metrics import Metrics
from dueflow.streams.status.access import StatusAccess
from dueflow.streams.status.console_access import CSRF_HEADER, Sessions, session_ref
from dueflow.streams.status.web import build_web_app
from tests.unit.test_console_access import OPERATOR, VIEWER, Console
from tests.unit.test_status_job_search import Source

JSON = {"Content-Type": "application/json"}


class AllOps:
    """Every action of :class:`Operations`, answering as the SDK does."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def _did(self, what: str, done: bool = True) -> dict[str, Any]:
        self.calls.append(what)
        return {"done": done, "message": what}

    def cancel(self, job_id: str, body: dict[str, Any], by: str) -> dict[str, Any]:
        return self._did(f"cancel {job_id}")

    def reschedule(self, job_id: str, body: dict[str, Any], by: str) -> dict[str, Any]:
        if "run_at" not in body:
            raise InvalidInput("run_at", None, "epoch milliseconds or ISO 8601")
        return self._did(f"reschedule {job_id}")

    def run_now(self, job_id: str, body: dict[str, Any], by: str) -> dict[str, Any]:
        return self._did(f"run-now {job_id}")

    def retry(self, job_id: str, body: dict[str, Any], by: str, queue: str) -> dict[str, Any]:
        return self._did(f"retry {job_id}", done=False)

    def redrive(self, queue: str, body: dict[str, Any], by: str) -> dict[str, Any]:
        return self._did(f"redrive {queue}")

    def purge(self, queue: str, body: dict[str, Any], by: str) -> dict[str, Any]:
        return self._did(f"purge {queue}")

    def pause_queue(
        self, queue: str, body: dict[str, Any], by: str, paused: bool
    ) -> dict[str, Any]:
        return self._did(f"pause {queue} {paused}")

    def pause_schedule(
        self, schedule_id: str, body: dict[str, Any], by: str, paused: bool
    ) -> dict[str, Any]:
        if schedule_id == "boom":
            raise RuntimeError("a bug in the action")
        return self._did(f"schedule {schedule_id} {paused}")


class QueueSource(Source):
    def queue_names(self) -> list[str]:
        return ["q"]


@pytest.fixture
def lines() -> Iterator[io.StringIO]:
    """Every line the view's loggers write, as the JSON log format writes them."""
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    handler.setFormatter(JsonFormatter())
    loggers = [logging.getLogger(n) for n in ("dueflow.console", "dueflow.status")]
    for lg in loggers:
        lg.addHandler(handler)
        lg.setLevel(logging.INFO)
    try:
        yield out
    finally:
        for lg in loggers:
            lg.removeHandler(handler)


def events(out: io.StringIO, name: str) -> list[dict[str, Any]]:
    docs = [json.loads(line) for line in out.getvalue().splitlines() if line.strip()]
    return [d for d in docs if d["event"] == name]


def app_with(ops: AllOps) -> Any:
    redrives: list[tuple[str, int, str]] = []

    def redrive_call(queue: str, limit: int, by: str) -> dict[str, Any]:
        redrives.append((queue, limit, by))
        return {"redriven": 2, "message": "2 redriven, 0 not redriven"}

    return build_web_app(
        QueueSource(),
        Metrics(),
        access=StatusAccess(token=OPERATOR),
        redrive_call=redrive_call,
        console=Console(cast(Any, ops)),
        sessions=Sessions(operator_token=OPERATOR, viewer_token=VIEWER),
    )


# (path, body, action, target kind, target, result)
MUTATIONS: list[tuple[str, dict[str, Any], str, str, str, str]] = [
    ("/api/jobs/j1/cancel", {}, "cancel", "job", "j1", "done"),
    (
        "/api/jobs/j1/reschedule",
        {"run_at": "2026-12-05T03:00:00Z"},
        "reschedule",
        "job",
        "j1",
        "done",
    ),
    ("/api/jobs/j1/run-now", {}, "run-now", "job", "j1", "done"),
    ("/api/jobs/j1/retry", {}, "retry", "job", "j1", "not done"),
    (
        "/api/dlq/q/redrive",
        {"filter": {"task": "charge"}, "dry_run": True},
        "redrive preview",
        "queue",
        "q",
        "done",
    ),
    ("/api/dlq/q/redrive", {"filter": {"task": "charge"}}, "redrive", "queue", "q", "done"),
    ("/api/dlq/q/purge", {"all": True, "dry_run": True}, "purge preview", "queue", "q", "done"),
    ("/api/dlq/q/purge", {"before": "2026-12-05T01:00:00Z"}, "purge", "queue", "q", "done"),
    ("/api/queues/q/pause", {"reason": "db migration"}, "pause queue", "queue", "q", "done"),
    ("/api/queues/q/resume", {}, "resume queue", "queue", "q", "done"),
    ("/api/schedules/nightly/pause", {}, "pause schedule", "schedule", "nightly", "done"),
    ("/api/schedules/nightly/resume", {}, "resume schedule", "schedule", "nightly", "done"),
    ("/api/jobs/j1/reschedule", {}, "reschedule", "job", "j1", "refused"),  # no run_at
    ("/api/schedules/boom/pause", {}, "pause schedule", "schedule", "boom", "error"),
]


def test_every_mutation_of_a_session_is_logged_once_with_its_caller(lines: io.StringIO) -> None:
    ops = AllOps()

    async def run() -> None:
        async with TestClient(TestServer(app_with(ops))) as client:
            resp = await client.post("/api/login", json={"token": OPERATOR, "name": "alice"})
            session = await resp.json()
            headers = {**JSON, CSRF_HEADER: session["csrf"]}
            for path, body, *_ in MUTATIONS:
                await client.post(path, data=json.dumps(body), headers=headers)
            # A double click: answered as the first, not acted on or logged again.
            again = await client.post("/api/queues/q/resume", data=b"{}", headers=headers)
            assert (await again.json())["repeat"] is True
            cookie = client.session.cookie_jar.filter_cookies(client.make_url("/"))
            secrets.extend([cookie["dueflow_session"].value, session["csrf"]])

    secrets: list[str] = [OPERATOR, VIEWER]
    asyncio.run(run())
    (login,) = events(lines, "console.login")
    logged = events(lines, "console.action")
    assert len(logged) == len(MUTATIONS)  # one line each, the repeat not again
    ref = login["credential"]
    assert ref.startswith("session ")
    assert ref == f"session {session_ref(secrets[2])}"
    for entry, (_path, body, action, kind, target, result) in zip(logged, MUTATIONS, strict=True):
        assert entry["action"] == action
        assert (entry["target_kind"], entry["target"]) == (kind, target)
        assert entry["result"] == result, entry
        assert entry["role"] == "operator"
        assert entry["credential"] == ref  # leads to the login line: name, address
        assert entry["who"].startswith("alice (operator")
        assert entry["remote"] == "127.0.0.1"
        assert entry["params"] == body
    assert [e["level"] for e in logged if e["result"] == "error"] == ["error"]
    assert "a bug in the action" in logged[-1]["message_"]  # "message" is logging's own
    text = lines.getvalue()
    for secret in secrets:
        assert secret not in text


def test_bearer_and_refused_mutations_are_logged_without_the_token(lines: io.StringIO) -> None:
    ops = AllOps()

    async def run() -> None:
        async with TestClient(TestServer(app_with(ops))) as client:
            bearer = {**JSON, "Authorization": f"Bearer {OPERATOR}"}
            assert (await client.post("/api/jobs/j1/cancel", data=b"{}", headers=bearer)).ok
            # The status page's redrive button: the same audit line.
            assert (await client.post("/dlq/q/redrive?limit=5", data=b"{}", headers=bearer)).ok
            viewer = {**JSON, "Authorization": f"Bearer {VIEWER}"}
            refused = await client.post("/api/queues/q/pause", data=b"{}", headers=viewer)
            assert refused.status == 403
            wrong = {**JSON, "Authorization": "Bearer not-a-token-of-this-view"}
            assert (await client.post("/api/dlq/q/purge", data=b"{}", headers=wrong)).status == 401

    asyncio.run(run())
    cancel, redrive = events(lines, "console.action")
    assert (cancel["action"], cancel["target"], cancel["result"]) == ("cancel", "j1", "done")
    assert cancel["credential"] == "bearer operator token"
    assert cancel["role"] == "operator"
    assert (redrive["action"], redrive["target"], redrive["params"]) == (
        "redrive",
        "q",
        {"limit": 5},
    )
    assert redrive["credential"] == "bearer operator token"
    assert redrive["result"] == "done"
    viewer, nobody = events(lines, "console.action_refused")
    assert (viewer["role"], viewer["credential"], viewer["status"]) == (
        "viewer",
        "bearer viewer token",
        403,
    )
    assert viewer["path"] == "/api/queues/q/pause"
    assert (nobody["role"], nobody["credential"], nobody["status"]) == (
        None,
        "bearer unknown token",
        401,
    )
    assert ops.calls == ["cancel j1"]
    text = lines.getvalue()
    for secret in (OPERATOR, VIEWER, "not-a-token-of-this-view"):
        assert secret not in text
