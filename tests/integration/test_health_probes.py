"""/livez and /readyz of real processes.

Readiness follows the broker: the emitter, a worker and the status view, each
a process of its own on a broker of this test's own, answer /readyz 200; the
broker is stopped (by pid) and every /readyz turns 503 while /livez stays 200;
the broker is started again on the same port and data and every /readyz turns
200 again. Liveness follows the loop: a worker whose event loop a handler
blocks answers /livez 503 until the handler returns; an emitter whose loop is
held answers 503 until it is let go.
"""

from __future__ import annotations

import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dueflow.broker.local import LocalBroker
from dueflow.broker.ports import free_port, free_port_pair
from dueflow.consumers.testing import ExecWriter, make_job
from dueflow.observability.metrics import serve
from tests.conftest import KafkaCluster
from tests.integration.pipeline_support import QUEUE, Pipeline, wait_for
from tests.support.emitters import FAST_EMITTER, SMALL_WHEEL, ThreadedEmitter, ensure_topics

APP = "tests.integration.health_app"


def probe(port: int, path: str) -> tuple[int, dict[str, Any]] | None:
    """``(status, body)`` of ``GET path``; None while nothing answers."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=3) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
    except (OSError, ValueError):
        return None


def status_of(port: int, path: str) -> int | None:
    got = probe(port, path)
    return None if got is None else got[0]


@pytest.fixture
def own_broker(tmp_path: Path) -> Iterator[LocalBroker]:
    broker = LocalBroker(port=free_port_pair(), state_dir=tmp_path / "broker", heap="384m")
    broker.start()
    try:
        yield broker
    finally:
        broker.stop()  # by pid, whatever the test did


@pytest.mark.timeout(300)
def test_readiness_follows_the_broker_down_and_back(
    own_broker: LocalBroker, tmp_path: Path
) -> None:
    p = Pipeline(own_broker.bootstrap, "health", tmp_path)
    ports = {"emitter": free_port(), "worker": free_port(), "status view": free_port()}
    try:
        p.emitter(ports["emitter"])
        p.start(
            "worker",
            "worker",
            "--app",
            APP,
            "--queues",
            QUEUE,
            "--metrics-port",
            str(ports["worker"]),
        )
        p.start(
            "status view",
            "status-view",
            "--port",
            str(free_port()),
            "--data-dir",
            str(tmp_path / "status"),
            "--metrics-port",
            str(ports["status view"]),
        )
        if True:

            def all_ready() -> bool:
                return all(status_of(port, "/readyz") == 200 for port in ports.values())

            def report() -> str:
                got = {name: probe(port, "/readyz") for name, port in ports.items()}
                return json.dumps(got, indent=1) + "\n" + p.logs()

            def wait_all_ready(what: str) -> None:
                try:
                    wait_for(what, all_ready, 120)
                except AssertionError as exc:
                    raise AssertionError(f"{exc}\n{report()}") from None

            wait_all_ready("every process ready")
            for port in ports.values():
                assert status_of(port, "/livez") == 200

            assert own_broker.stop() is not None  # by pid

            def none_ready() -> dict[str, Any] | None:
                got = {name: probe(port, "/readyz") for name, port in ports.items()}
                if all(g is not None and g[0] == 503 for g in got.values()):
                    return {name: g[1]["reasons"] for name, g in got.items() if g}
                return None

            reasons = wait_for("no process ready with the broker down", none_ready, 60)
            print("while the broker was down:", json.dumps(reasons, indent=1))
            # The group consumer says so, or has not been heard from (its loop waits
            # on the broker inside a transaction meanwhile): not ready either way.
            for name in ("emitter", "worker"):
                assert any(
                    why in json.dumps(reasons[name])
                    for why in ("group coordinator not connected", "no statistics")
                ), reasons
            # Alive all along: only the broker is gone.
            for port in ports.values():
                assert status_of(port, "/livez") == 200

            own_broker.start()
            wait_all_ready("every process ready again")
            assert all(proc.alive() for proc in p.procs), p.logs()
    finally:
        p.stop_all()


@pytest.mark.timeout(180)
def test_a_handler_that_blocks_the_event_loop_fails_liveness_until_it_returns(
    kafka: KafkaCluster, prefix: str, tmp_path: Path
) -> None:
    p = Pipeline(kafka.bootstrap, prefix, tmp_path)
    port = free_port()
    try:
        p.start(
            "worker",
            "worker",
            "--app",
            APP,
            "--queues",
            QUEUE,
            "--metrics-port",
            str(port),
            env={"DUEFLOW_OBSERVABILITY_LIVENESS_TIMEOUT_S": "2"},
        )
        wait_for("the worker ready", lambda: status_of(port, "/readyz") == 200, 90)
        assert status_of(port, "/livez") == 200
        writer = ExecWriter(p.settings)
        writer.write([make_job("wedge", {"seconds": 8}, queue=QUEUE, key="wedged")])
        writer.flush()
        got = wait_for(
            "/livez 503 while the loop is blocked",
            lambda: (r := probe(port, "/livez")) is not None and r[0] == 503 and r,
            30,
        )
        assert "the main loop has not turned" in got[1]["reasons"]["loop"]
        assert status_of(port, "/readyz") == 503  # a wedged process is not ready either
        wait_for("/livez 200 once the handler returned", lambda: status_of(port, "/livez") == 200)
        assert p.procs[0].alive()
    finally:
        p.stop_all()


@pytest.mark.timeout(120)
def test_an_emitter_whose_loop_is_held_fails_liveness_until_let_go(
    kafka: KafkaCluster, prefix: str
) -> None:
    settings = kafka.settings(
        prefix,
        queues="default:2",
        wheel=SMALL_WHEEL,
        emitter=FAST_EMITTER,
        observability={"liveness_timeout_s": 1.0},
    )
    ensure_topics(settings)
    emitter = ThreadedEmitter(settings)
    release = threading.Event()
    held = threading.Event()
    emitter.start()
    try:
        emitter.wait_active()
        process = emitter.process
        assert process is not None
        port = serve(emitter.metrics, 0, health=process.health)
        wait_for("the emitter ready", lambda: status_of(port, "/readyz") == 200, 30)
        turn = process._turn

        def wedged_turn() -> None:  # the next turn hangs until released
            process._turn = turn  # type: ignore[method-assign]
            held.set()
            release.wait(30)
            turn()

        process._turn = wedged_turn  # type: ignore[method-assign]
        assert held.wait(10)
        got = wait_for(
            "/livez 503 while the loop is held",
            lambda: (r := probe(port, "/livez")) is not None and r[0] == 503 and r,
            10,
        )
        assert "the main loop has not turned" in got[1]["reasons"]["loop"]
        release.set()
        wait_for("/livez 200 once let go", lambda: status_of(port, "/livez") == 200, 10)
    finally:
        release.set()
        emitter.join()
