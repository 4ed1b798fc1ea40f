"""The console's roles, login sessions, CSRF checks, repeats and the job page (over fakes)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

import pytest
from aiohttp import ClientResponse
from aiohttp.test_utils import TestClient, TestServer

from dueflow.observability.metrics import Metrics
from dueflow.streams.status.access import StatusAccess
from dueflow.streams.status.console_access import CSRF_HEADER, Sessions, clean_name
from dueflow.streams.status.job_search import Cursor, JobFilter, JobPage
from dueflow.streams.status.job_timeline import attempts, shown, timeline
from dueflow.streams.status.operator_tools import ConsoleOperations
from dueflow.streams.status.web import build_web_app
from tests.unit.test_status_job_search import Source

OPERATOR = "operator-token-0123456789"
VIEWER = "viewer-token-0123456789"
JSON = {"Content-Type": "application/json"}
VIEW = {
    "job_id": "j1",
    "queue": "q",
    "task": "t",
    "state": "dead",
    "result": {"card": "4111 1111 1111 1111"},
    "history": [
        ["scheduled", 0, 1000],
        ["started", 1, 2000, {"worker": "w1"}],
        [
            "retrying",
            1,
            2500,
            {"worker": "w1", "duration_ms": 500.0, "error_type": "E", "error": "x"},
        ],
        ["dead", 2, 4000, {"worker": "w2", "duration_ms": 100.0, "error": "<script>y</script>"}],
    ],
    "due_ms": 1500,
}


class FakeOps:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def cancel(self, job_id: str, body: dict[str, Any], by: str) -> dict[str, Any]:
        self.calls.append((job_id, by))
        return {"done": True, "message": "cancelled"}


class Console:
    def __init__(self, ops: FakeOps) -> None:
        self.ops = ops

    async def find_jobs(self, flt: JobFilter, *, before: Cursor | None, limit: int) -> JobPage:
        return JobPage([], None)

    def job(self, job_id: str) -> dict[str, Any] | None:
        return VIEW if job_id == "j1" else None

    async def dead_letter(self, view: dict[str, Any]) -> dict[str, Any] | None:
        return None

    def payloads_for(self) -> str:
        return "operator"

    async def watch_doc(self) -> dict[str, Any]:
        return {"queues": {}}

    def trace_url(self, trace_id: str) -> str | None:
        return None

    def queue_names(self) -> list[str]:
        return ["q"]

    def operations(self) -> ConsoleOperations | None:
        return cast(ConsoleOperations, self.ops)


def make_app(viewer_token: str | None = VIEWER) -> tuple[Any, FakeOps]:
    ops = FakeOps()
    sessions = Sessions(operator_token=OPERATOR, viewer_token=viewer_token)
    app = build_web_app(
        Source(),
        Metrics(),
        access=StatusAccess(token=OPERATOR),
        console=Console(ops),
        sessions=sessions,
    )
    return app, ops


async def login(client: TestClient[Any, Any], token: str) -> tuple[ClientResponse, dict[str, Any]]:
    resp = await client.post("/api/login", json={"token": token, "name": "alice\x1b[31m"})
    return resp, await resp.json()


def test_login_gives_an_httponly_samesite_cookie_and_operator_actions_need_csrf() -> None:
    app, ops = make_app()

    async def run() -> None:
        async with TestClient(TestServer(app)) as client:
            # Reads need a login when a viewer token is set.
            assert (await client.get("/api/jobs/j1")).status == 401
            assert (await client.get("/healthz")).status == 200
            resp, doc = await login(client, "wrong-token-000000000")
            assert resp.status == 401
            resp, doc = await login(client, OPERATOR)
            assert resp.status == 200
            assert doc["role"] == "operator"
            assert doc["who"].startswith("alice[31m (operator")  # no escape character
            cookie = resp.headers["Set-Cookie"]
            assert "HttpOnly" in cookie
            assert "SameSite=Strict" in cookie
            assert OPERATOR not in cookie
            assert (await client.get("/api/jobs/j1")).status == 200
            # A mutation without the CSRF token is refused, with it it runs.
            no_csrf = await client.post("/api/jobs/j1/cancel", data=b"{}", headers=JSON)
            assert no_csrf.status == 403
            assert CSRF_HEADER in (await no_csrf.json())["error"]
            bad = await client.post(
                "/api/jobs/j1/cancel", data=b"{}", headers={**JSON, CSRF_HEADER: "nope"}
            )
            assert bad.status == 403
            assert ops.calls == []
            headers = {**JSON, CSRF_HEADER: doc["csrf"]}
            first = await client.post("/api/jobs/j1/cancel", data=b"{}", headers=headers)
            again = await client.post("/api/jobs/j1/cancel", data=b"{}", headers=headers)
            assert first.status == again.status == 200
            assert (await again.json())["repeat"] is True
            assert len(ops.calls) == 1  # a double click acts once
            assert ops.calls[0][1].startswith("alice")
            log = await (await client.get("/api/actions")).json()
            assert [(a["action"], a["target"]) for a in log["actions"]] == [("cancel", "j1")]
            # A cross-site origin is refused before anything else.
            evil = await client.post(
                "/api/jobs/j1/cancel",
                data=b"{}",
                headers={**headers, "Origin": "http://evil.example", "Idempotency-Key": "2"},
            )
            assert evil.status == 403
            out = await client.post("/api/logout", data=b"{}", headers=headers)
            assert out.status == 200
            assert (await client.get("/api/jobs/j1")).status == 401

    asyncio.run(run())


def test_viewers_read_but_do_not_act_nor_see_payloads() -> None:
    app, ops = make_app()

    async def run() -> None:
        async with TestClient(TestServer(app)) as client:
            _resp, doc = await login(client, VIEWER)
            assert doc["role"] == "viewer"
            page = await (await client.get("/api/jobs/j1")).json()
            assert page["payloads_shown"] is False
            assert isinstance(page["now_ms"], int)  # what "retry due in 42 s" is against
            assert page["result"] is None
            assert "4111" not in str(page)
            acted = await client.post(
                "/api/jobs/j1/cancel", data=b"{}", headers={**JSON, CSRF_HEADER: doc["csrf"]}
            )
            assert acted.status == 403
            bearer = await client.post(
                "/api/jobs/j1/cancel",
                data=b"{}",
                headers={**JSON, "Authorization": f"Bearer {VIEWER}"},
            )
            assert bearer.status == 403
            assert ops.calls == []
            # A client that is no browser acts with the operator's bearer token.
            ok = await client.post(
                "/api/jobs/j1/cancel",
                data=b"{}",
                headers={**JSON, "Authorization": f"Bearer {OPERATOR}"},
            )
            assert ok.status == 200
            assert len(ops.calls) == 1

    asyncio.run(run())


def test_without_a_viewer_token_reads_stay_open_and_actions_need_the_token() -> None:
    app, ops = make_app(viewer_token=None)

    async def run() -> None:
        async with TestClient(TestServer(app)) as client:
            assert (await client.get("/api/jobs/j1")).status == 200
            assert (
                await client.post("/api/jobs/j1/cancel", data=b"{}", headers=JSON)
            ).status == 401
            assert ops.calls == []

    asyncio.run(run())


def test_timeline_attempts_and_capped_payloads() -> None:
    events = timeline(VIEW)
    assert [e["state"] for e in events] == ["scheduled", "due", "started", "retrying", "dead"]
    rows = attempts(events)
    assert rows == [
        {
            "attempt": 1,
            "worker": "w1",
            "started_ms": 2000,
            "outcome": "retrying",
            "ended_ms": 2500,
            "duration_ms": 500.0,
            "error": {"type": "E", "message": "x"},
        },
        {
            "attempt": 2,
            "worker": "w2",
            "started_ms": 3900,
            "outcome": "dead",
            "ended_ms": 4000,
            "duration_ms": 100.0,
            "error": {"type": None, "message": "<script>y</script>"},
        },
    ]
    big = shown(b'{"a": "' + b"x" * 100_000 + b'"}', limit=1000)
    assert big["truncated"] is True
    assert big["bytes"] > 100_000
    assert len(big["text"].encode()) <= 1000
    assert shown(b"\xff\xfe not utf-8")["text"] == "\\xff\\xfe not utf-8"
    assert shown({"b": 1})["text"] == '{\n  "b": 1\n}'


def test_login_names_are_cleaned() -> None:
    assert clean_name("a\x00b\u202ec") == "abc"
    assert clean_name(None) == "anonymous"
    assert len(clean_name("x" * 500)) == 64


def test_sessions_expire(tmp_path: Path) -> None:
    now = [0.0]
    sessions = Sessions(operator_token=OPERATOR, viewer_token=None, ttl_s=10, clock=lambda: now[0])
    s = sessions.login(OPERATOR, name="bob", remote="127.0.0.1")
    assert s is not None
    assert sessions.get(s.id) is s
    now[0] = 11
    assert sessions.get(s.id) is None
    assert sessions.login("nope", name="x", remote="r") is None


@pytest.mark.parametrize("token", [OPERATOR, VIEWER])
def test_the_token_never_lands_in_a_response(token: str) -> None:
    app, _ops = make_app()

    async def run() -> str:
        async with TestClient(TestServer(app)) as client:
            resp, doc = await login(client, token)
            me = await client.get("/api/session")
            return str(doc) + str(await me.json()) + str(resp.headers)

    assert token not in asyncio.run(run())


def test_console_settings_are_checked_and_the_trace_link_is_made_from_the_template() -> None:
    from dataclasses import replace

    from dueflow.config import ObservabilitySettings, Settings
    from dueflow.errors import ConfigError
    from dueflow.streams.status.app import StatusView

    obs = ObservabilitySettings(
        status_token=OPERATOR,
        status_viewer_token=VIEWER,
        status_trace_url="http://jaeger:16686/trace/{trace_id}",
    )
    view = StatusView(Settings(observability=obs), metrics=Metrics())
    assert view.console.trace_url("4bf92f3577b34da6a3ce929d0e0e4736") == (
        "http://jaeger:16686/trace/4bf92f3577b34da6a3ce929d0e0e4736"
    )
    assert view.console.trace_url("x/../../evil") is None  # not a trace id: no link
    assert view.console.payloads_for() == "operator"
    assert VIEWER not in repr(obs)
    for bad, field in (
        (replace(obs, status_viewer_token=OPERATOR), "status_viewer_token"),
        (replace(obs, status_viewer_token="short"), "status_viewer_token"),
        (replace(obs, status_trace_url="jaeger/{trace_id}"), "status_trace_url"),
        (replace(obs, status_trace_url="http://jaeger/trace"), "status_trace_url"),
        (replace(obs, status_payloads="everyone"), "status_payloads"),  # type: ignore[arg-type]
    ):
        with pytest.raises(ConfigError, match=field) as caught:
            Settings(observability=bad).validate()
        assert OPERATOR not in str(caught.value)
