"""The HTTP listener of a long-running process: ``/metrics``, ``/livez``, ``/readyz``.

One listener per process on ``observability.metrics_bind:metrics_port``
(loopback by default; the container image binds every interface), on a
daemon thread of its own: it answers while the process's loops are busy,
and a wedged loop shows as ``/livez`` 503, not as a probe that hangs.

- ``GET /metrics``: the Prometheus text exposition (the merged view of every
  process in multiprocess mode, see :mod:`dueflow.observability.metrics`).
- ``GET /livez``, ``GET /readyz``: 200 or 503 with a JSON body
  ``{"ok": ..., "reasons": {check: why}, ...}``. Without a health source
  (a library user serving metrics only) both are 404.
"""

from __future__ import annotations

import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Protocol

import orjson
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from dueflow.observability.health import Verdict


class HealthSource(Protocol):
    """What the probes ask: :class:`~dueflow.observability.health.Health` or an aggregate."""

    def live(self) -> Verdict: ...

    def ready(self) -> Verdict: ...


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    registry: CollectorRegistry
    health: HealthSource | None

    def handle_error(self, request: object, client_address: object) -> None:
        """A prober that gave up waiting (a busy process) has nobody left to answer:
        not a traceback on stderr. Anything else is reported as before."""
        if isinstance(sys.exc_info()[1], ConnectionError):
            return
        super().handle_error(request, client_address)  # type: ignore[arg-type]


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        if path in ("/metrics", "/"):
            self._send(200, generate_latest(self.server.registry), CONTENT_TYPE_LATEST)
            return
        health = self.server.health
        if path in ("/livez", "/readyz") and health is not None:
            verdict = health.live() if path == "/livez" else health.ready()
            body = orjson.dumps(verdict.to_json()) + b"\n"
            self._send(200 if verdict.ok else 503, body, "application/json")
            return
        self._send(404, b'{"error": "not found"}\n', "application/json")

    def _send(self, status: int, body: bytes, content_type: str) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        """Probes every few seconds: no access log."""


def start_listener(
    registry: CollectorRegistry, port: int, *, addr: str, health: HealthSource | None
) -> int:
    """Serve ``registry`` (and ``health``) on ``addr:port`` from a daemon thread; the port."""
    server = _Server((addr, port), _Handler)
    server.registry = registry
    server.health = health
    threading.Thread(target=server.serve_forever, name="dueflow-http-listener", daemon=True).start()
    return int(server.server_address[1])
