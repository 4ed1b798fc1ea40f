"""Scheduler.status's lookup: the status view over HTTP (a stand-in server here), the
bounded scan when the view does not answer, and the client's own recent jobs."""

from __future__ import annotations

import json
import logging
import threading
import urllib.parse
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from dueflow.broker.ports import free_port
from dueflow.producers.lookup import ViewLookup, scheduled_status
from dueflow.producers.results import Scheduled
from dueflow.producers.view_client import ViewClient, ViewUnavailable
from dueflow.rules.job_status import JobStatus

VIEW = {
    "job_id": "j1",
    "queue": "q",
    "task": "t",
    "idempotency_key": "k",
    "state": "started",
    "attempts": 1,
    "due_ms": 4_102_444_800_000,
    "updated_ms": 5,
    "started_ms": 5,
    "history": [["scheduled", 0, 1], ["started", 1, 5]],
    "progress": 0.25,
}
NOW = 1_700_000_000_000


class FakeView:
    """What the stand-in view answers, and what it was asked."""

    def __init__(self) -> None:
        self.jobs: dict[str, dict[str, Any]] = {"j1": VIEW}
        self.headers = {"Dueflow-Topic-Prefix": "dueflow", "Dueflow-Cluster-Id": "C1"}
        self.status: int | None = None  # force a status
        self.requests: list[tuple[str, dict[str, str]]] = []
        self.close_after = False
        self.appear_on_wait: dict[str, Any] | None = None


@pytest.fixture
def fake() -> Iterator[tuple[FakeView, str]]:
    state = FakeView()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            url = urllib.parse.urlsplit(self.path)
            query = dict(urllib.parse.parse_qsl(url.query))
            state.requests.append((self.path, dict(self.headers)))
            job_id = urllib.parse.unquote(url.path.rsplit("/", 1)[1])
            view = state.jobs.get(job_id)
            if view is None and "wait_ms" in query and state.appear_on_wait is not None:
                view = state.appear_on_wait
            status = state.status or (200 if view is not None else 404)
            body = json.dumps(view if status == 200 else {"error": "unknown"}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            for k, v in state.headers.items():
                self.send_header(k, v)
            if state.close_after:
                self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield state, f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


class FakeScan:
    def __init__(self, answer: JobStatus | None = None) -> None:
        self.answer = answer
        self.asked: list[str] = []

    def status(self, job_id: str, *, timeout_s: float | None = None) -> JobStatus | None:
        self.asked.append(job_id)
        return self.answer


@pytest.fixture(autouse=True)
def _close_clients() -> Iterator[None]:
    yield
    for client in CLIENTS:
        client.close()
    CLIENTS.clear()


CLIENTS: list[ViewClient] = []


def _client(url: str, **kw: Any) -> ViewClient:
    client = ViewClient(url, **kw)
    CLIENTS.append(client)
    return client


def _lookup(
    url: str,
    scan: FakeScan,
    *,
    recent: dict[str, Scheduled] | None = None,
    token: str | None = None,
    cluster: str | None = "C1",
) -> ViewLookup:
    client = _client(
        url, topic_prefix="dueflow", token=token, timeout_s=2.0, cluster_id=lambda: cluster
    )
    mine = recent or {}
    return ViewLookup(client, scan, recent=mine.get, retention_ms=7 * 86_400_000, clock=lambda: NOW)


def _scheduled(job_id: str, due_ms: int) -> Scheduled:
    return Scheduled(job_id, due_ms, "q", "t", "key", "hash", 3, duplicate=True)


def test_the_view_answers_a_job_with_every_field(fake: tuple[FakeView, str]) -> None:
    state, url = fake
    scan = FakeScan()
    st = _lookup(url, scan, token="tok-0123456789abcdef").status("j1")
    assert st is not None
    assert (st.source, st.complete, st.state, st.due_ms) == (
        "status-view",
        True,
        "started",
        VIEW["due_ms"],
    )
    assert st.extra["started_ms"] == 5
    assert st.progress == 0.25  # a named field (results and progress)
    assert st.to_json()["progress"] == 0.25
    assert scan.asked == []
    assert state.requests[0][1]["Authorization"] == "Bearer tok-0123456789abcdef"


def test_an_unknown_job_is_none_without_a_scan(fake: tuple[FakeView, str]) -> None:
    state, url = fake
    scan = FakeScan()
    assert _lookup(url, scan).status("nope/x") is None
    assert scan.asked == []
    assert state.requests[0][0] == "/jobs/nope%2Fx"


def test_a_job_this_client_just_scheduled_is_waited_for_then_answered_by_the_client(
    fake: tuple[FakeView, str],
) -> None:
    state, url = fake
    mine = {"new": _scheduled("new", NOW + 1000), "gone": _scheduled("gone", NOW - 8 * 86_400_000)}
    lookup = _lookup(url, FakeScan(), recent=mine)
    st = lookup.status("new")
    assert st == scheduled_status(mine["new"])
    assert (st.source, st.complete, st.state, st.queue) == ("client", False, "scheduled", "q")
    assert [p for p, _ in state.requests] == ["/jobs/new", "/jobs/new?wait_ms=1000&until=change"]
    # the view folds it while we wait: its answer
    state.appear_on_wait = {**VIEW, "job_id": "new", "state": "scheduled"}
    st = lookup.status("new")
    assert st is not None
    assert st.source == "status-view"
    # due longer ago than the retention: it may have ended and left the view
    assert lookup.status("gone") is None


def test_without_a_view_the_scan_answers_and_says_it_may_be_incomplete(
    caplog: pytest.LogCaptureFixture,
) -> None:
    answer = JobStatus.from_view(VIEW, source="kafka-scan", complete=False)
    scan = FakeScan(answer)
    lookup = _lookup(f"http://127.0.0.1:{free_port()}", scan, recent={"m": _scheduled("m", NOW)})
    with caplog.at_level(logging.WARNING, logger="dueflow.producers"):
        assert lookup.status("j1") == answer
        scan.answer = None
        assert lookup.status("zz") is None
        mine = lookup.status("m")
    assert mine is not None
    assert mine.source == "client"
    assert scan.asked == ["j1", "zz", "m"]
    warned = [r for r in caplog.records if "status view did not answer" in r.getMessage()]
    assert len(warned) == 1, "once a minute, not once a call"


def test_no_view_set_up_and_none_listening_is_not_warned_about(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = _client(f"http://127.0.0.1:{free_port()}", topic_prefix="dueflow")
    with pytest.raises(ViewUnavailable) as info:
        client.job("j1")
    assert info.value.absent
    scan = FakeScan()
    lookup = ViewLookup(client, scan, retention_ms=1, clock=lambda: NOW, view_configured=False)
    with caplog.at_level(logging.INFO, logger="dueflow.producers"):
        assert lookup.status("j1") is None
    assert scan.asked == ["j1"]
    assert not [r for r in caplog.records if r.levelno >= logging.INFO]


def test_a_view_named_by_the_caller_is_asked_whatever_it_reads(
    fake: tuple[FakeView, str],
) -> None:
    state, url = fake
    state.headers = {"Dueflow-Topic-Prefix": "another"}
    assert _client(url, topic_prefix=None).job("j1") == VIEW


@pytest.mark.parametrize(
    ("headers", "status", "why"),
    [
        ({"Dueflow-Topic-Prefix": "other"}, None, "reads topic prefix 'other'"),
        ({"Dueflow-Topic-Prefix": "dueflow", "Dueflow-Cluster-Id": "C2"}, None, "cluster 'C2'"),
        ({"Dueflow-Topic-Prefix": "dueflow"}, 503, "HTTP 503"),
        ({}, None, "did not say which topics it reads"),
    ],
)
def test_an_answer_from_the_wrong_view_or_an_error_is_no_answer(
    fake: tuple[FakeView, str], headers: dict[str, str], status: int | None, why: str
) -> None:
    state, url = fake
    state.headers = headers
    state.status = status
    client = _client(url, topic_prefix="dueflow", cluster_id=lambda: "C1")
    with pytest.raises(ViewUnavailable, match=why):
        client.job("j1")
    scan = FakeScan()
    assert _lookup(url, scan).status("j1") is None
    assert scan.asked == ["j1"]


def test_a_cluster_id_that_cannot_be_read_leaves_the_prefix_check(
    fake: tuple[FakeView, str],
) -> None:
    _state, url = fake

    def unknown() -> str | None:
        raise RuntimeError("no metadata")

    client = _client(url, topic_prefix="dueflow", cluster_id=unknown)
    assert client.job("j1") == VIEW


def test_connections_are_kept_and_made_again_when_closed(fake: tuple[FakeView, str]) -> None:
    state, url = fake
    client = _client(url, topic_prefix="dueflow")
    for _ in range(3):
        assert client.job("j1") == VIEW
    state.close_after = True
    for _ in range(3):
        assert client.job("j1") == VIEW
    client.close()


def test_bad_inputs_are_refused() -> None:
    with pytest.raises(ValueError, match="http"):
        ViewClient("ftp://x", topic_prefix="p")
    client = ViewClient("http://127.0.0.1:1", topic_prefix="p")
    with pytest.raises(ValueError, match="until"):
        client.job("a", wait_ms=5, until="later")


def test_dueflow_job_refuses_a_wait_beyond_a_minute(capsys: pytest.CaptureFixture[str]) -> None:
    from dueflow.apps.cli.main import main

    assert main(["job", "j1", "--wait", "61", "--bootstrap", "127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert "--wait" in err
    assert "61" in err
    assert "seconds from 0 to 60" in err


def test_waiting_for_a_jobs_end_long_polls_in_bounded_requests(
    fake: tuple[FakeView, str],
) -> None:
    """``ViewClient.wait_for_end``: ``?wait_ms=&until=final`` requests of at most the
    view's bound (60 s), the job once it is final, else as it is at the deadline."""
    state, url = fake
    client = ViewClient(url, topic_prefix="dueflow")
    ended = {**VIEW, "job_id": "j2", "state": "succeeded", "result": {"sum": 3}}
    state.appear_on_wait = ended
    assert client.wait_for_end("j2", timeout_s=5, clock=lambda: 0.0) == ended
    assert state.requests[-1][0] == "/jobs/j2?wait_ms=5000&until=final"

    ticks = iter([0.0, 0.0, 60.0])  # the first request waits 60 s and the job still runs
    state.requests.clear()
    got = client.wait_for_end("j1", timeout_s=120, clock=lambda: next(ticks))
    assert got is not None
    assert got["state"] == "started"
    assert [path for path, _ in state.requests] == [
        "/jobs/j1?wait_ms=60000&until=final",
        "/jobs/j1?wait_ms=60000&until=final",
    ]
    state.appear_on_wait = None
    assert client.wait_for_end("nope", timeout_s=0) is None
    client.close()


def test_a_result_is_waited_for_through_the_views_long_poll(fake: tuple[FakeView, str]) -> None:
    """``Scheduler.result``'s look: one ``?wait_ms=&until=final`` request that the view
    answers when it folds the job's end (no polling of the view), bounded by 60 s."""
    from dueflow.producers.result_wait import wait_for_result

    state, url = fake
    scan = FakeScan()
    lookup = _lookup(url, scan)
    state.appear_on_wait = {**VIEW, "job_id": "j2", "state": "succeeded", "result": {"sum": 3}}
    assert wait_for_result("j2", lambda b: lookup.final_status("j2", wait_s=b), 5.0) == {"sum": 3}
    ((path, _headers),) = state.requests  # one request: the view answered at the end
    waited = urllib.parse.parse_qs(urllib.parse.urlsplit(path).query)
    assert waited["until"] == ["final"]
    assert 4_000 <= int(waited["wait_ms"][0]) <= 5_000
    assert scan.asked == []
    state.requests.clear()
    running = lookup.final_status("j1", wait_s=float("inf"))
    assert running is not None
    assert running.running
    assert [path for path, _ in state.requests] == ["/jobs/j1?wait_ms=60000&until=final"]


def test_without_a_view_a_result_is_waited_for_through_the_scan() -> None:
    ended = JobStatus.from_view({**VIEW, "state": "succeeded", "result": [1]}, source="kafka-scan")
    scan = FakeScan(ended)
    lookup = _lookup(f"http://127.0.0.1:{free_port()}", scan)
    assert lookup.final_status("j1", wait_s=2.0) == ended
    assert scan.asked == ["j1"]
