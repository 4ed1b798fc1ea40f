"""Helpers for status-view tests: write outcome records, run the view as a process."""

from __future__ import annotations

import json
import os
import re
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from dueflow import headers as hdr
from dueflow.config import Settings
from dueflow.kafka.clients import make_admin, make_producer
from dueflow.kafka.topic_admin import TopicAdmin
from dueflow.kafka.topics import names, topic_layout
from dueflow.records import codec


def ensure_topics(settings: Settings) -> None:
    report = TopicAdmin(make_admin(settings), replication_factor=1).ensure(topic_layout(settings))
    assert report.ok, report.differences


def outcome(
    job_id: str,
    state: str,
    *,
    at_ms: int,
    queue: str = "default",
    task: str = "send_email",
    attempt: int = 0,
    **extra: Any,
) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "job_id": job_id,
        "queue": queue,
        "task": task,
        "idempotency_key": f"k-{job_id}",
        "state": state,
        "attempt": attempt,
        "at_ms": at_ms,
    }
    rec.update(extra)
    return rec


def write_outcomes(
    settings: Settings, records: list[dict[str, Any]], producer: Producer | None = None
) -> None:
    """Write outcome records keyed by job id, as the emitter and workers will."""
    p = producer or make_producer(settings)
    topic = names(settings).outcomes
    for rec in records:
        p.produce(
            topic,
            key=rec["job_id"].encode(),
            value=codec.encode("outcome", rec),
            headers=[(hdr.SCHEMA, codec.schema_header("outcome"))],
        )
    assert p.flush(10) == 0


# The line the view prints once at start when it made its own token.
PRINTED_URL = re.compile(r"open (http://\S+/\?token=([A-Za-z0-9_-]+))")


@dataclass
class ViewProcess:
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path
    token: str | None = None  # the configured token (None: the view makes one)
    tls: ssl.SSLContext | None = None  # the view serves HTTPS: a context trusting it

    @property
    def url(self) -> str:
        return f"{'http' if self.tls is None else 'https'}://127.0.0.1:{self.port}"

    def get(self, path: str) -> tuple[int, Any]:
        try:
            with urllib.request.urlopen(self.url + path, timeout=5, context=self.tls) as resp:
                body = resp.read()
                status = int(resp.status)
                ctype = resp.headers.get("Content-Type", "")
        except urllib.error.HTTPError as exc:
            body, status, ctype = exc.read(), int(exc.code), exc.headers.get("Content-Type", "")
        return status, (json.loads(body) if "json" in ctype else body.decode())

    def post(self, path: str) -> tuple[int, Any]:
        """A state-changing call as a client sends it: token and JSON body."""
        headers = {"Content-Type": "application/json"}
        if self.token:
            headers["Authorization"] = f"Bearer {self.token}"
        req = urllib.request.Request(self.url + path, method="POST", data=b"{}", headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=5, context=self.tls) as resp:
                return int(resp.status), json.loads(resp.read())
        except urllib.error.HTTPError as exc:
            return int(exc.code), json.loads(exc.read())

    def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise AssertionError(f"status view exited {self.proc.returncode}:\n{self.log()}")
            try:
                if self.get("/healthz")[0] == 200:
                    return
            except OSError:
                pass
            time.sleep(0.2)
        raise AssertionError(f"status view not ready in {timeout_s}s:\n{self.log()}")

    def printed_url(self, timeout_s: float = 30.0) -> tuple[str, str]:
        """``(page URL with ?token=, token)`` the view printed at start."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            found = PRINTED_URL.search(self.log())
            if found:
                return found.group(1), found.group(2)
            time.sleep(0.2)
        raise AssertionError(f"the view printed no page URL with a token:\n{self.log()}")

    def wait_job(self, job_id: str, state: str, timeout_s: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout_s
        last: Any = None
        while time.monotonic() < deadline:
            status, last = self.get(f"/jobs/{job_id}")
            if status == 200 and last["state"] == state:
                return dict(last)
            time.sleep(0.2)
        raise AssertionError(f"job {job_id} never reached {state}; last: {last}\n{self.log()}")

    def stop(self, timeout_s: float = 30.0) -> int:
        """SIGTERM by pid; kill if it does not end. Returns the exit code."""
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        return int(self.proc.returncode)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except FileNotFoundError:
            return ""


def start_view(
    settings: Settings,
    *,
    port: int,
    data_dir: Path,
    log_path: Path,
    queues: str = "default:3",
    env: dict[str, str] | None = None,
    bind: str = "127.0.0.1",
    token: str | None = "status-view-token-of-the-tests",
    tls: ssl.SSLContext | None = None,
    args: tuple[str, ...] = (),
) -> ViewProcess:
    """``dueflow status-view`` as a process; ``token``: its configured token (``None``:
    none configured, the view makes one and prints it); ``tls``: a client context
    trusting the certificate it serves (its files in ``env`` or ``args``)."""
    cmd = [
        sys.executable,
        "-m",
        "dueflow",
        "status-view",
        "--bootstrap",
        settings.bootstrap,
        "--topic-prefix",
        settings.topic_prefix,
        "--queues",
        queues,
        "--port",
        str(port),
        "--data-dir",
        str(data_dir),
        "--log-format",
        "json",
        "--bind",
        bind,
        *args,
    ]
    full_env = dict(os.environ)
    full_env.pop("DUEFLOW_OBSERVABILITY_STATUS_TOKEN", None)
    full_env["DUEFLOW_OBSERVABILITY_CLUSTER_REFRESH_MS"] = "500"
    if token is not None:
        full_env["DUEFLOW_OBSERVABILITY_STATUS_TOKEN"] = token
    full_env.update(env or {})
    with log_path.open("ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=full_env)
    return ViewProcess(proc, port, log_path, token, tls)
