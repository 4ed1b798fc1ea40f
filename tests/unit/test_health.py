"""Liveness and readiness: the judges, the heartbeat, and the HTTP listener."""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
import urllib.error
import urllib.request
from typing import Any

import orjson
import pytest

from dueflow.config import load_settings
from dueflow.errors import ConfigError
from dueflow.observability.health import (
    HEARTBEAT_SAMPLE,
    READY_SAMPLE,
    ChildrenHealth,
    ClientStats,
    Health,
    Verdict,
    group_readiness,
    judge_children,
)
from dueflow.observability.metrics import Metrics, serve


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.mark.parametrize(
    ("cgrp", "reason"),
    [
        ({"state": "up", "join_state": "steady"}, None),
        ({"state": "query-coord", "join_state": "steady"}, "group coordinator not connected"),
        ({"state": "up", "join_state": "wait-join"}, "group membership not settled"),
        ({"state": "up", "join_state": "init"}, "group membership not settled"),
        (None, "no consumer group"),
    ],
)
def test_group_readiness_from_librdkafka_statistics(
    cgrp: dict[str, str] | None, reason: str | None
) -> None:
    stats: dict[str, Any] = {"brokers": {}} if cgrp is None else {"cgrp": cgrp}
    got = group_readiness(stats)
    if reason is None:
        assert got is None
    else:
        assert got is not None
        assert reason in got


def test_client_stats_go_stale_when_the_client_stops_reporting() -> None:
    clock = Clock()
    stats = ClientStats(clock=clock, stale_s=5.0)
    assert stats.reason() == "no statistics from the client yet"
    stats.callback(orjson.dumps({"cgrp": {"state": "up", "join_state": "steady"}}).decode())
    assert stats.reason() is None
    stats.callback("not json")  # ignored: the last good statistics stand
    assert stats.reason() is None
    clock.now += 6.0
    assert "no statistics from the client for 6.0 s" in (stats.reason() or "")
    config = stats.client_config()
    assert config["statistics.interval.ms"] == 1000
    assert callable(config["stats_cb"])


def test_liveness_follows_the_heartbeat() -> None:
    clock = Clock()
    health = Health(liveness_timeout_s=2.0, clock=clock)
    assert health.live().ok  # starting: the start-up probe's to judge
    assert health.ready().reasons == {"process": "starting"}
    health.beat()
    clock.now += 1.9
    assert health.live().ok
    clock.now += 0.2
    live = health.live()
    assert not live.ok
    assert "has not turned for 2.1 s" in live.reasons["loop"]
    assert not health.ready().ok  # a wedged process is not ready either
    health.beat()
    assert health.live().ok
    assert health.ready().ok


def test_readiness_names_every_failing_check_and_survives_a_broken_one() -> None:
    clock = Clock()
    health = Health(clock=clock)
    health.beat()
    health.add_check("group", lambda: "group coordinator not connected (state query-coord)")
    health.add_check("fine", lambda: None)

    def broken() -> str | None:
        raise RuntimeError("boom")

    health.add_check("broken", broken)
    verdict = health.ready()
    assert not verdict.ok
    assert verdict.reasons["group"].startswith("group coordinator not connected")
    assert "boom" in verdict.reasons["broken"]
    assert "fine" not in verdict.reasons
    health.remove_check("group")
    health.remove_check("broken")
    assert health.ready().ok
    health.stopping()
    assert health.ready().reasons == {"process": "shutting down"}
    assert health.live().ok


def test_publish_sets_the_gauges() -> None:
    clock = Clock()
    metrics = Metrics()
    health = Health(clock=clock)
    health.beat()
    health.publish(metrics.ready, metrics.loop_heartbeat)
    assert metrics.registry.get_sample_value(READY_SAMPLE) == 1.0
    assert (metrics.registry.get_sample_value(HEARTBEAT_SAMPLE) or 0) > 1e9  # wall time
    health.add_check("group", lambda: "not yet")
    health.publish(metrics.ready, metrics.loop_heartbeat)
    assert metrics.registry.get_sample_value(READY_SAMPLE) == 0.0


def test_children_judged_by_their_published_gauges() -> None:
    now = 1_000.0
    samples = [
        (READY_SAMPLE, {"pid": "11"}, 1.0),
        (HEARTBEAT_SAMPLE, {"pid": "11"}, now - 0.5),
        (READY_SAMPLE, {"pid": "12"}, 0.0),
        (HEARTBEAT_SAMPLE, {"pid": "12"}, now - 40.0),
    ]
    not_live, not_ready = judge_children(samples, expected=2, now_wall=now, liveness_timeout_s=30.0)
    assert list(not_live) == ["pid 12"]
    assert not_ready == {"children": "1 of 2 worker processes ready"}
    parent = [(READY_SAMPLE, {"pid": "10"}, 0.0), (HEARTBEAT_SAMPLE, {"pid": "10"}, 1.0)]
    assert judge_children(
        [*samples, *parent], expected=2, now_wall=now, liveness_timeout_s=30.0, parent_pid=10
    ) == (not_live, not_ready)
    ok = [(READY_SAMPLE, {"pid": p}, 1.0) for p in ("11", "12")]
    assert judge_children(ok, expected=2, now_wall=now, liveness_timeout_s=30.0) == ({}, {})

    own = Health()
    own.beat()
    merged = ChildrenHealth(own, expected=2, samples=lambda: samples, wall=lambda: now)
    assert not merged.live().ok
    assert not merged.ready().ok
    merged = ChildrenHealth(own, expected=2, samples=lambda: ok, wall=lambda: now)
    assert merged.live().ok
    assert merged.ready().ok


def _get(url: str) -> tuple[int, dict[str, Any]]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_the_listener_serves_metrics_and_both_probes() -> None:
    clock = Clock()
    health = Health(liveness_timeout_s=2.0, clock=clock)
    metrics = Metrics()
    port = serve(metrics, 0, health=health)
    base = f"http://127.0.0.1:{port}"
    assert _get(base + "/livez")[0] == 200
    status, body = _get(base + "/readyz")
    assert status == 503
    assert body["reasons"] == {"process": "starting"}
    health.beat()
    assert _get(base + "/readyz") == (200, {"ok": True, "reasons": {}, "checks": []})
    clock.now += 3.0
    status, body = _get(base + "/livez")
    assert status == 503
    assert "has not turned" in body["reasons"]["loop"]
    assert _get(base + "/nothing")[0] == 404
    text = urllib.request.urlopen(base + "/metrics", timeout=5).read()
    assert b"dueflow_ready " in text


def test_without_a_health_source_the_probes_are_404() -> None:
    port = serve(Metrics(), 0)
    assert _get(f"http://127.0.0.1:{port}/livez")[0] == 404


def test_metrics_bind_and_liveness_timeout_settings() -> None:
    s = load_settings(
        env={
            "DUEFLOW_OBSERVABILITY_METRICS_BIND": "0.0.0.0",
            "DUEFLOW_OBSERVABILITY_LIVENESS_TIMEOUT_S": "12.5",
        }
    )
    assert s.observability.metrics_bind == "0.0.0.0"
    assert s.observability.liveness_timeout_s == 12.5
    assert load_settings(env={}).observability.metrics_bind == "127.0.0.1"
    with pytest.raises(ConfigError, match=r"observability\.metrics_bind.*'http://x'"):
        load_settings(env={"DUEFLOW_OBSERVABILITY_METRICS_BIND": "http://x"})
    with pytest.raises(ConfigError, match=r"observability\.liveness_timeout_s"):
        load_settings(env={"DUEFLOW_OBSERVABILITY_LIVENESS_TIMEOUT_S": "0"})


class _HeldProbe:
    """A health source whose ``/livez`` answer waits until the test lets it go."""

    def __init__(self) -> None:
        self.asked = threading.Event()
        self.answer = threading.Event()

    def live(self) -> Verdict:
        self.asked.set()
        self.answer.wait(10)
        return Verdict(True, {})

    def ready(self) -> Verdict:
        return Verdict(True, {})


def test_a_prober_that_hung_up_before_the_answer_is_no_traceback(
    capfd: pytest.CaptureFixture[str],
) -> None:
    probe = _HeldProbe()
    port = serve(Metrics(), 0, health=probe)
    before = threading.active_count()
    client = socket.create_connection(("127.0.0.1", port), timeout=5)
    client.sendall(b"GET /livez HTTP/1.1\r\nHost: probe\r\n\r\n")
    assert probe.asked.wait(5)
    # Hang up with a reset, as a prober's timeout does: every write of the answer fails.
    client.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    client.close()
    probe.answer.set()
    deadline = time.monotonic() + 5
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() == before, "the request's thread did not finish"
    assert _get(f"http://127.0.0.1:{port}/readyz") == (200, {"ok": True, "reasons": {}})
    assert "Traceback" not in capfd.readouterr().err
