"""A stand-in for a Confluent-compatible schema registry: the subset of its REST API
the dueflow clients use, on a loopback port, in a thread of the test.

- ``POST /subjects/{subject}/versions`` with ``{"schema": "..."}``: registers the
  schema under the subject (the same text again gets the same id) and answers
  ``{"id": N}``;
- ``GET /schemas/ids/{id}``: answers ``{"schema": "..."}`` (404 for an unknown id).

No real registry runs here (Karapace is not on PyPI; Confluent's is not on
Maven Central), so the integration tests register against this one and check
what the clients sent.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote

FIRST_ID = 41  # ids that are not 0 or 1, so a framing that drops them shows


@dataclass
class Registry:
    """What the fake registry holds and was asked."""

    schemas: dict[int, str] = field(default_factory=dict)
    subjects: dict[str, list[int]] = field(default_factory=dict)
    requests: list[tuple[str, str, Any]] = field(default_factory=list)
    # the Authorization header of each request (None when it had none)
    auth: list[str | None] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def register(self, subject: str, schema: str) -> int:
        with self.lock:
            known = [sid for sid, text in self.schemas.items() if text == schema]
            sid = known[0] if known else FIRST_ID + len(self.schemas)
            self.schemas[sid] = schema
            versions = self.subjects.setdefault(subject, [])
            if sid not in versions:
                versions.append(sid)
            return sid


class _Handler(BaseHTTPRequestHandler):
    registry: Registry

    def _answer(self, status: int, doc: dict[str, Any]) -> None:
        body = json.dumps(doc).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self) -> None:
        size = int(self.headers.get("Content-Length") or 0)
        try:
            doc = json.loads(self.rfile.read(size) or b"{}")
        except ValueError:
            doc = None
        self.registry.requests.append(("POST", self.path, doc))
        self.registry.auth.append(self.headers.get("Authorization"))
        parts = self.path.strip("/").split("/")
        if len(parts) == 3 and parts[0] == "subjects" and parts[2] == "versions":
            if not isinstance(doc, dict) or not isinstance(doc.get("schema"), str):
                self._answer(422, {"error_code": 42201, "message": "Invalid schema"})
                return
            self._answer(200, {"id": self.registry.register(unquote(parts[1]), doc["schema"])})
            return
        self._answer(404, {"error_code": 404, "message": "HTTP 404 Not Found"})

    def do_GET(self) -> None:
        self.registry.requests.append(("GET", self.path, None))
        self.registry.auth.append(self.headers.get("Authorization"))
        parts = self.path.strip("/").split("/")
        if len(parts) == 3 and parts[:2] == ["schemas", "ids"] and parts[2].isdigit():
            schema = self.registry.schemas.get(int(parts[2]))
            if schema is not None:
                self._answer(200, {"schema": schema})
                return
            self._answer(404, {"error_code": 40403, "message": "Schema not found"})
            return
        self._answer(404, {"error_code": 404, "message": "HTTP 404 Not Found"})

    def log_message(self, format: str, *args: Any) -> None:  # quiet
        return


@contextmanager
def fake_registry() -> Iterator[tuple[str, Registry]]:
    """``(url, registry)`` of a fake registry on a free loopback port; stopped after."""
    registry = Registry()
    handler = type("Handler", (_Handler,), {"registry": registry})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="fake-registry", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", registry
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
