"""The status view with TLS on (a throwaway self-signed certificate made by the openssl
binary), as a process against the real broker: HTTPS only, the session cookie
``Secure``, the console's own actions and ``dueflow job`` reaching the view over TLS,
every action in the audit log without a secret; and the settings that cannot work
refused at start in one line naming the setting and the file."""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dueflow.broker.ports import free_port
from dueflow.config import Settings
from dueflow.streams.status.console_access import COOKIE, CSRF_HEADER, session_ref
from tests.conftest import KafkaCluster
from tests.integration.status_support import (
    ViewProcess,
    ensure_topics,
    outcome,
    start_view,
    write_outcomes,
)

OPENSSL = "/usr/bin/openssl"
OPERATOR = "operator-token-of-the-tls-test"
CERT_ENV = "DUEFLOW_OBSERVABILITY_STATUS_TLS_CERT"
KEY_ENV = "DUEFLOW_OBSERVABILITY_STATUS_TLS_KEY"


def self_signed(directory: Path, name: str = "view") -> tuple[Path, Path]:
    """A certificate for localhost and 127.0.0.1 and its unencrypted key (P-256)."""
    cert, key = directory / f"{name}.cert.pem", directory / f"{name}.key.pem"
    subprocess.run(
        [
            OPENSSL,
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-keyout",
            str(key),
            "-out",
            str(cert),
            "-days",
            "2",
            "-subj",
            "/CN=localhost",
            "-addext",
            "subjectAltName=DNS:localhost,IP:127.0.0.1",
        ],
        check=True,
        capture_output=True,
        timeout=30,
    )
    return cert, key


@pytest.fixture
def settings(kafka: KafkaCluster, prefix: str) -> Settings:
    s = kafka.settings(prefix, queues="default:3")
    ensure_topics(s)
    return s


@pytest.fixture
def certs(tmp_path: Path) -> tuple[Path, Path]:
    return self_signed(tmp_path)


@pytest.fixture
def view(settings: Settings, tmp_path: Path, certs: tuple[Path, Path]) -> Iterator[ViewProcess]:
    cert, key = certs
    proc = start_view(
        settings,
        port=free_port(),
        data_dir=tmp_path / "data",
        log_path=tmp_path / "view.log",
        queues="default:3",
        token=OPERATOR,
        env={CERT_ENV: str(cert), KEY_ENV: str(key)},
        tls=ssl.create_default_context(cafile=str(cert)),
    )
    try:
        proc.wait_ready()
        yield proc
    finally:
        proc.stop()


def https(
    view: ViewProcess,
    method: str,
    path: str,
    body: dict[str, Any] | None = None,
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, str], bytes]:
    data = None if body is None else json.dumps(body).encode()
    sent = {"Content-Type": "application/json", **(headers or {})}
    req = urllib.request.Request(view.url + path, method=method, data=data, headers=sent)
    try:
        with urllib.request.urlopen(req, timeout=60, context=view.tls) as resp:
            return int(resp.status), dict(resp.headers), resp.read()
    except urllib.error.HTTPError as exc:
        return int(exc.code), dict(exc.headers), exc.read()


def plain_http(port: int) -> str:
    """What a plain-HTTP GET of the page gets from the port (an error's repr)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", "/")
        resp = conn.getresponse()
        return f"HTTP {resp.status}: {resp.read()[:300]!r}"
    except (http.client.HTTPException, OSError) as exc:
        return repr(exc)
    finally:
        conn.close()


def log_events(view: ViewProcess) -> list[dict[str, Any]]:
    out = []
    for line in view.log_path.read_text(errors="replace").splitlines():
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


@pytest.mark.timeout(180)
def test_the_view_serves_https_only_and_its_session_cookie_is_secure(
    kafka: KafkaCluster, settings: Settings, view: ViewProcess, certs: tuple[Path, Path]
) -> None:
    now = int(time.time() * 1000)
    write_outcomes(settings, [outcome("tls-done", "succeeded", at_ms=now, attempt=1)])
    view.wait_job("tls-done", "succeeded")

    # The page and the API over https, with a context that trusts the certificate.
    status, headers, page = https(view, "GET", "/")
    assert status == 200
    assert headers["Content-Type"].startswith("text/html")
    status, _, console = https(view, "GET", "/console")
    assert status == 200
    assert b"<html" in page.lower()
    assert b"<html" in console.lower()
    status, _, body = https(view, "GET", "/api/jobs/tls-done")
    assert status == 200
    assert json.loads(body)["job"]["state"] == "succeeded"
    raw = socket.create_connection(("127.0.0.1", view.port), timeout=10)
    with ssl.create_default_context(cafile=str(certs[0])).wrap_socket(
        raw, server_hostname="127.0.0.1"
    ) as tls:
        assert tls.version() in ("TLSv1.2", "TLSv1.3")
    # A client that does not trust the certificate is refused by its own check:
    # the view really serves that certificate.
    with pytest.raises(urllib.error.URLError, match="CERTIFICATE_VERIFY_FAILED"):
        urllib.request.urlopen(view.url + "/healthz", timeout=10)  # the system's CAs

    # Plain HTTP to the same port: no page, no JSON; the view goes on serving.
    got = plain_http(view.port)
    assert "<html" not in got.lower()
    assert "HTTP 200" not in got
    assert https(view, "GET", "/healthz")[0] == 200

    # Logging in over https: the cookie is Secure even when a proxy says http.
    status, headers, body = https(
        view,
        "POST",
        "/api/login",
        {"token": OPERATOR, "name": "alice"},
        {"X-Forwarded-Proto": "http"},
    )
    assert status == 200, body
    cookie = headers["Set-Cookie"]
    assert cookie.startswith(f"{COOKIE}=")
    attributes = [a.strip().lower() for a in cookie.split(";")]
    assert "secure" in attributes
    assert "httponly" in attributes
    assert "samesite=strict" in attributes
    session_id = cookie.split(";")[0].split("=", 1)[1]
    csrf = json.loads(body)["csrf"]
    with_session = {"Cookie": f"{COOKIE}={session_id}", CSRF_HEADER: csrf}

    # Actions of the session over https: the console's own Scheduler asks the view
    # (https, its own certificate) about the job.
    status, _, body = https(
        view, "POST", "/api/queues/default/pause", {"reason": "tls test"}, with_session
    )
    assert status == 200, body
    status, _, body = https(view, "POST", "/api/jobs/tls-done/cancel", {}, with_session)
    assert status == 200, body
    cancel = json.loads(body)
    assert cancel["done"] is False
    assert cancel["state"] == "succeeded"  # found through the view: finished, kept
    status, _, body = https(view, "POST", "/api/queues/default/resume", {}, with_session)
    assert status == 200, body

    # `dueflow job` with the view's own settings reaches it over https (its pin).
    env = {
        **os.environ,
        CERT_ENV: str(certs[0]),
        KEY_ENV: str(certs[1]),
        "DUEFLOW_OBSERVABILITY_STATUS_PORT": str(view.port),
        "DUEFLOW_OBSERVABILITY_STATUS_TOKEN": OPERATOR,
    }
    job = subprocess.run(
        [
            sys.executable,
            "-m",
            "dueflow",
            "job",
            "tls-done",
            "--json",
            *kafka.cli_options(settings.topic_prefix),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
    )
    assert job.returncode == 0, job.stderr
    found = json.loads(job.stdout)
    assert (found["source"], found["job"]["state"]) == ("status-view", "succeeded")

    # The startup line and banner say https; each action is in the audit log once,
    # with the session that made it, and no secret is anywhere in the log.
    events = log_events(view)
    (serving,) = [e for e in events if e["event"] == "status.serving"]
    assert serving["url"].startswith("https://")
    assert f"operator console: https://127.0.0.1:{view.port}/console" in view.log()
    (login,) = [e for e in events if e["event"] == "console.login"]
    assert login["credential"] == f"session {session_ref(session_id)}"
    actions = [e for e in events if e["event"] == "console.action"]
    assert [(a["action"], a["target"], a["result"]) for a in actions] == [
        ("pause queue", "default", "done"),
        ("cancel", "tls-done", "not done"),
        ("resume queue", "default", "done"),
    ]
    for a in actions:
        assert (a["role"], a["credential"]) == ("operator", login["credential"])
        assert a["who"].startswith("alice (operator")
    assert actions[0]["params"] == {"reason": "tls test"}
    text = view.log_path.read_text(errors="replace")
    assert "status view did not answer" not in text  # the console's lookups went through
    assert "Traceback" not in text
    for secret in (OPERATOR, session_id, csrf):
        assert secret not in text


def start_failure(
    kafka: KafkaCluster, prefix: str, *args: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("DUEFLOW_OBSERVABILITY")}
    full_env.update(env or {})
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "dueflow",
            "status-view",
            "--port",
            "0",
            *args,
            *kafka.cli_options(prefix),
        ],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=60,
    )


@pytest.mark.timeout(120)
def test_tls_settings_that_cannot_work_stop_the_start_in_one_line(
    kafka: KafkaCluster, prefix: str, tmp_path: Path, certs: tuple[Path, Path]
) -> None:
    cert, key = certs
    _, other_key = self_signed(tmp_path, "other")
    cases = [
        # (how it is set, the setting named, the file named)
        (start_failure(kafka, prefix, "--tls-cert", str(cert)), "status_tls_key", cert),
        (
            start_failure(kafka, prefix, env={KEY_ENV: str(key)}),
            "status_tls_cert",
            key,
        ),
        (
            start_failure(kafka, prefix, "--tls-cert", str(cert), "--tls-key", str(other_key)),
            "status_tls_key",
            other_key,
        ),
        (
            start_failure(
                kafka, prefix, env={CERT_ENV: str(tmp_path / "absent.pem"), KEY_ENV: str(key)}
            ),
            "status_tls_cert",
            tmp_path / "absent.pem",
        ),
        (
            start_failure(kafka, prefix, "--tls-cert", str(key), "--tls-key", str(key)),
            "status_tls_cert",
            key,
        ),
    ]
    for done, setting, path in cases:
        assert done.returncode == 2, done.stderr
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1, done.stderr
        assert lines[0].startswith("dueflow: setting ")
        assert f"observability.{setting}" in lines[0]
        assert str(path) in lines[0]
        assert "Traceback" not in done.stderr
