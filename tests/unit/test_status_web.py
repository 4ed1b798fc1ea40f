"""The status view's HTTP layer over a fake source, credentials, CLI rendering."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import faust
import pytest
from aiohttp.test_utils import TestClient, TestServer

from dueflow.apps.cli.status_render import render_job, render_status, status_from_cluster
from dueflow.config import Settings, load_settings
from dueflow.errors import ConfigError
from dueflow.observability.metrics import Metrics
from dueflow.streams.status.access import StatusAccess
from dueflow.streams.status.credentials import credentials, faust_broker_options
from dueflow.streams.status.web import build_web_app

TOKEN = "t0ken-for-the-unit-tests"
ACCESS = StatusAccess(token=TOKEN)
# What the page sends with a state-changing call.
AUTH = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/json"}

JOB = {
    "job_id": "j1",
    "queue": "q",
    "task": "t",
    "state": "succeeded",
    "attempts": 2,
    "due_ms": 1_700_000_000_000,
    "first_seen_ms": 1_700_000_000_000,
    "fired_ms": None,
    "started_ms": None,
    "finished_ms": 1_700_000_001_000,
    "updated_ms": 1_700_000_001_000,
    "duration_ms": 3.25,
    "last_error": {"type": "IOError", "message": "disk", "attempt": 1, "at_ms": 1},
    "trace_id": None,
}


class FakeSource:
    def job(self, job_id: str) -> dict[str, Any] | None:
        return JOB if job_id == "j1" else None

    async def wait_job(self, job_id: str, *, until: str, timeout_s: float) -> dict[str, Any] | None:
        return self.job(job_id)

    def identity(self) -> dict[str, str]:
        return {"Dueflow-Topic-Prefix": "dueflow"}

    def queues(self) -> dict[str, Any]:
        return {"queues": {"q": {"counts": {"succeeded": 1}, "total": 1}}}

    def overview(self) -> dict[str, Any]:
        return {"queues": {}, "recent_jobs": [JOB], "recent_failures": [], "cluster": None}

    def cluster(self) -> dict[str, Any] | None:
        return None

    def queue_names(self) -> list[str]:
        return ["q"]


async def _requests() -> dict[str, tuple[int, Any]]:
    metrics = Metrics()
    metrics.fires.labels("q").inc()
    out: dict[str, tuple[int, Any]] = {}
    app = build_web_app(FakeSource(), metrics, access=ACCESS)
    async with TestClient(TestServer(app)) as client:
        for path in ("/jobs/j1", "/jobs/nope%2Fx", "/queues", "/api/overview", "/api/cluster"):
            resp = await client.get(path)
            out[path] = (resp.status, await resp.json())
        for path in ("/", "/metrics"):
            resp = await client.get(path)
            out[path] = (resp.status, (resp.headers["Content-Type"], await resp.text()))
        for path in ("/dlq/q/redrive", "/dlq/zzz/redrive"):
            resp = await client.post(path, headers=AUTH, data=b"{}")
            out["POST " + path] = (resp.status, await resp.json())
    return out


def test_routes() -> None:
    got = asyncio.run(_requests())
    assert got["/jobs/j1"] == (200, JOB)
    status, body = got["/jobs/nope%2Fx"]
    assert status == 404
    assert body["job_id"] == "nope/x"
    assert body["error"].startswith("unknown job id")
    assert body["state"] == "unknown"
    assert "known from the moment it is scheduled" in body["error"]
    assert got["/queues"][1]["queues"]["q"]["total"] == 1
    assert got["/api/overview"][1]["recent_jobs"] == [JOB]
    assert got["/api/cluster"][0] == 503
    ctype, html = got["/"][1]
    assert ctype.startswith("text/html")
    assert "<title>dueflow status</title>" in html
    assert "http://" not in html.replace("http://www.w3.org", ""), "no external resources"
    ctype, text = got["/metrics"][1]
    assert ctype.startswith("text/plain")
    assert 'dueflow_fires_total{queue="q"} 1.0' in text
    assert got["POST /dlq/q/redrive"][0] == 501
    assert "no redriver" in got["POST /dlq/q/redrive"][1]["error"]
    assert got["POST /dlq/zzz/redrive"][0] == 404


def test_the_redrive_button_calls_the_redriver_once_at_a_time() -> None:
    calls: list[tuple[str, int, str]] = []
    release = threading.Event()
    started = threading.Event()

    def redrive(queue: str, limit: int, by: str) -> dict[str, Any]:
        calls.append((queue, limit, by))
        started.set()
        release.wait(10)
        return {"queue": queue, "redriven": 2, "message": "2 redriven, 0 not redriven"}

    async def run() -> dict[str, tuple[int, Any]]:
        app = build_web_app(FakeSource(), Metrics(), access=ACCESS, redrive_call=redrive)
        out: dict[str, tuple[int, Any]] = {}
        async with TestClient(TestServer(app)) as client:
            first = asyncio.ensure_future(client.post("/dlq/q/redrive?limit=5", headers=AUTH))
            assert await asyncio.to_thread(started.wait, 10)
            busy = await client.post("/dlq/q/redrive", headers=AUTH)
            out["busy"] = (busy.status, await busy.json())
            release.set()
            done = await first
            out["first"] = (done.status, await done.json())
            bad = await client.post("/dlq/q/redrive?limit=0", headers=AUTH)
            out["bad"] = (bad.status, await bad.json())
        return out

    got = asyncio.run(run())
    assert got["first"] == (
        200,
        {"queue": "q", "redriven": 2, "message": "2 redriven, 0 not redriven"},
    )
    assert got["busy"][0] == 409
    assert got["bad"][0] == 400
    assert len(calls) == 1
    queue, limit, by = calls[0]
    assert (queue, limit) == ("q", 5)
    assert by.startswith("status-page:")


def test_credentials_mapping() -> None:
    assert credentials({}) is None
    sasl = credentials(
        {
            "security.protocol": "SASL_PLAINTEXT",
            "sasl.mechanism": "SCRAM-SHA-256",
            "sasl.username": "u",
            "sasl.password": "p",
        }
    )
    assert isinstance(sasl, faust.SASLCredentials)
    with pytest.raises(ConfigError, match=r"kafka\.enable\.idempotence"):
        credentials({"enable.idempotence": "true"})
    with pytest.raises(ConfigError, match=r"security\.protocol"):
        credentials({"security.protocol": "KERBEROS"})
    opts = faust_broker_options(Settings(bootstrap="a:1,b:2"))
    assert opts["broker"] == ["kafka://a:1", "kafka://b:2"]


def test_credentials_name_the_setting_they_refuse_never_its_value() -> None:
    """Issue 16: the check echoed the value it refused, and kafka.* values are secrets."""
    with pytest.raises(ConfigError) as err:
        credentials({"sasl.oauthbearer.client.secret": "hunter2-very-secret"})
    assert "kafka.sasl.oauthbearer.client.secret" in str(err.value)
    assert "hunter2-very-secret" not in str(err.value)
    assert "hunter2-very-secret" not in repr(err.value.args)
    assert err.value.value is None
    with pytest.raises(ConfigError) as err:
        load_settings(overrides={"kafka": "sasl.password=hunter2-very-secret"})
    assert "'kafka'" in str(err.value)
    assert "hunter2-very-secret" not in str(err.value)


def test_cli_rendering() -> None:
    cluster = {
        "lag_by_queue": {"q": 3},
        "dlq_depth": {"q": 1},
        "timers_pending": {"near": 0, "0": 4},
        "active_emitter": None,
        "emitter_members": 0,
        "failures": [
            {
                "queue": "q",
                "job_id": "d1",
                "task": "t",
                "reason": "exhausted",
                "error_type": "E",
                "error_message": "m" * 100,
                "attempts": 4,
                "dead_ms": 0,
            }
        ],
        "errors": ["topic x: not found"],
    }
    doc = status_from_cluster(cluster, counts=None, source="kafka")
    text = render_status(doc)
    assert "source: kafka" in text
    assert "active emitter: NONE" in text
    assert "pending timers: near=0, 0=4" in text
    assert "d1" in text
    assert "warning: topic x: not found" in text
    assert "counts by state need the status view" in text
    job = render_job(JOB)
    assert "state         succeeded" in job
    assert "IOError: disk" in job
    assert "3.2 ms" in job


def test_a_job_answer_waits_only_within_bounds_and_says_whose_view_it_is() -> None:
    async def run() -> dict[str, tuple[int, Any, str | None]]:
        app = build_web_app(FakeSource(), Metrics(), access=ACCESS)
        out: dict[str, tuple[int, Any, str | None]] = {}
        async with TestClient(TestServer(app)) as client:
            for q in (
                "",
                "?wait_ms=10",
                "?wait_ms=10&until=change",
                "?wait_ms=abc",
                "?wait_ms=60001",
                "?until=soon",
            ):
                resp = await client.get("/jobs/j1" + q)
                out[q] = (resp.status, await resp.json(), resp.headers.get("Dueflow-Topic-Prefix"))
            resp = await client.get("/jobs/nope")
            out["404"] = (resp.status, await resp.json(), resp.headers.get("Dueflow-Topic-Prefix"))
        return out

    got = asyncio.run(run())
    for q in ("", "?wait_ms=10", "?wait_ms=10&until=change"):
        assert got[q] == (200, JOB, "dueflow"), q
    assert got["?wait_ms=abc"][0] == 400
    assert "wait_ms: an integer from 0 to 60000" in got["?wait_ms=abc"][1]["error"]
    assert got["?wait_ms=60001"][0] == 400
    assert got["?until=soon"][0] == 400
    assert "until: one of final, change" in got["?until=soon"][1]["error"]
    assert got["404"][0] == 404
    assert got["404"][2] == "dueflow", "an unknown job's answer says whose view it is too"
