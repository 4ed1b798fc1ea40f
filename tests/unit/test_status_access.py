"""Who may call the status view: each check of :mod:`dueflow.streams.status.access` over HTTP
(a real aiohttp server on 127.0.0.1), the pure checks as tables, the refusal to bind
beyond loopback without a token, and no secret in any message."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace
from typing import Any

import orjson
import pytest
from aiohttp.test_utils import TestClient, TestServer

from dueflow.config import ObservabilitySettings, Settings, load_settings
from dueflow.errors import ConfigError
from dueflow.observability.metrics import Metrics
from dueflow.streams.status.access import (
    StatusAccess,
    check_host,
    check_origin,
    check_token,
    is_loopback_bind,
    page_banner,
    page_scheme,
    require_token_beyond_loopback,
    split_host,
)
from dueflow.streams.status.app import StatusView
from dueflow.streams.status.web import build_web_app
from tests.unit.test_status_web import FakeSource

TOKEN = "the-right-token-0123456789"
JSON = {"Content-Type": "application/json"}
BEARER = {"Authorization": f"Bearer {TOKEN}"}


async def _call(
    method: str,
    path: str,
    headers: dict[str, str],
    body: bytes = b"{}",
    *,
    allowed_hosts: tuple[str, ...] = (),
    host: str | None = None,
) -> tuple[int, dict[str, Any], dict[str, str], list[tuple[str, int, str]]]:
    """``(status, json body, response headers, redriver calls)`` of one request."""
    calls: list[tuple[str, int, str]] = []

    def redrive(queue: str, limit: int, by: str) -> dict[str, Any]:
        calls.append((queue, limit, by))
        return {"queue": queue, "message": "1 redriven, 0 not redriven"}

    access = StatusAccess(token=TOKEN, allowed_hosts=allowed_hosts)
    app = build_web_app(FakeSource(), Metrics(), access=access, redrive_call=redrive)
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        sent = dict(headers)
        if host is not None:
            sent["Host"] = host.replace("PORT", str(client.port))
        if "Origin" in sent:
            sent["Origin"] = sent["Origin"].replace("PORT", str(client.port))
        resp = await client.request(method, path, headers=sent, data=body)
        assert resp.content_type == "application/json", await resp.text()
        return resp.status, await resp.json(), dict(resp.headers), calls


def call(*args: Any, **kwargs: Any) -> tuple[int, dict[str, Any], dict[str, str], list[Any]]:
    return asyncio.run(_call(*args, **kwargs))


def test_the_page_s_call_reaches_the_redriver() -> None:
    origin = {"Origin": "http://127.0.0.1:PORT"}
    status, body, _, calls = call("POST", "/dlq/q/redrive", {**BEARER, **JSON, **origin})
    assert (status, body["message"]) == (200, "1 redriven, 0 not redriven")
    assert [c[:2] for c in calls] == [("q", 100)]
    # A client that sends no Origin (curl, the CLI) and no body is fine too.
    status, _, _, calls = call("POST", "/dlq/q/redrive", {**BEARER, **JSON}, b"")
    assert (status, len(calls)) == (200, 1)


@pytest.mark.parametrize(
    ("headers", "body", "status", "says"),
    [
        pytest.param(JSON, b"{}", 401, "needs the status view's token", id="no-token"),
        pytest.param(
            {"Authorization": "Bearer not-the-token", **JSON},
            b"{}",
            401,
            "wrong token",
            id="wrong-token",
        ),
        pytest.param(
            {"Authorization": f"Bearer {TOKEN}x", **JSON},
            b"{}",
            401,
            "wrong token",
            id="token-with-a-suffix",
        ),
        pytest.param(
            {"Authorization": f"Basic {TOKEN}", **JSON}, b"{}", 401, "Bearer", id="not-bearer"
        ),
        pytest.param({"Authorization": "Bearer ", **JSON}, b"{}", 401, "token", id="empty"),
        pytest.param(
            {**BEARER, **JSON, "Origin": "http://evil.example"},
            b"{}",
            403,
            "cross-origin",
            id="other-site-origin",
        ),
        pytest.param(
            {**BEARER, **JSON, "Origin": "http://127.0.0.1:1"},
            b"{}",
            403,
            "cross-origin",
            id="other-port-origin",
        ),
        pytest.param(
            {**BEARER, **JSON, "Origin": "null"}, b"{}", 403, "cross-origin", id="null-origin"
        ),
        pytest.param(
            {**BEARER, "Content-Type": "text/plain"},
            b"{}",
            415,
            "application/json",
            id="text-plain",
        ),
        pytest.param(
            {**BEARER, "Content-Type": "application/x-www-form-urlencoded"},
            b"a=1",
            415,
            "application/json",
            id="form",
        ),
        pytest.param(BEARER, b"", 415, "application/json", id="no-content-type"),
        pytest.param({**BEARER, **JSON}, b"limit=1", 400, "not valid JSON", id="not-json"),
    ],
)
def test_a_state_changing_call_is_refused_without_each_check(
    headers: dict[str, str], body: bytes, status: int, says: str
) -> None:
    got, doc, resp_headers, calls = call("POST", "/dlq/q/redrive", headers, body)
    assert got == status, doc
    assert says in doc["error"]
    assert calls == [], "the redriver must not run"
    assert TOKEN not in doc["error"]
    assert "not-the-token" not in doc["error"]
    if status == 401:
        assert resp_headers["WWW-Authenticate"].startswith("Bearer")


def test_the_checks_guard_every_method_and_route_but_reads() -> None:
    # An unknown route or another method is refused before routing (no probing).
    assert call("PUT", "/dlq/q/redrive", JSON)[0] == 401
    assert call("DELETE", "/jobs/j1", JSON)[0] == 401
    assert call("POST", "/nothing-here", JSON)[0] == 401
    # With the token, aiohttp's own errors are JSON too.
    status, doc, _, _ = call("POST", "/nothing-here", {**BEARER, **JSON})
    assert (status, doc["error"]) == (404, "Not Found")
    assert call("GET", "/dlq/q/redrive", {})[0] == 405
    # Reads need no token on loopback.
    status, doc, _, _ = call("GET", "/jobs/j1", {})
    assert (status, doc["job_id"]) == (200, "j1")
    assert call("GET", "/queues", {}, host="localhost:PORT")[0] == 200


@pytest.mark.parametrize("method", ["GET", "POST"])
def test_a_host_that_is_not_the_view_is_refused(method: str) -> None:
    """DNS rebinding: evil.example resolves to 127.0.0.1, the browser sends its name."""
    status, doc, _, calls = call(
        method,
        "/dlq/q/redrive" if method == "POST" else "/queues",
        {**BEARER, **JSON},
        host="evil.example:PORT",
    )
    assert status == 403
    assert "observability.status_allowed_hosts" in doc["error"]
    assert calls == []
    # The right name on another port is not this view either.
    assert call("GET", "/queues", {}, host="127.0.0.1:1")[0] == 403
    assert call("GET", "/queues", {}, host="")[0] == 403


def test_allowed_hosts_are_answered_with_their_own_origin() -> None:
    # behind a TLS proxy, which says so (X-Forwarded-Proto): the page's origin is https
    headers = {
        **BEARER,
        **JSON,
        "Origin": "https://status.example.com",
        "X-Forwarded-Proto": "https",
    }
    got = call(
        "POST",
        "/dlq/q/redrive",
        headers,
        host="status.example.com",
        allowed_hosts=("status.example.com",),
    )
    assert got[0] == 200, got[1]
    # Listed with a port: that port only.
    assert call("GET", "/queues", {}, host="status.example.com:8080",
                allowed_hosts=("status.example.com:443",))[0] == 403  # fmt: skip


@pytest.mark.parametrize(
    ("host", "parsed"),
    [
        ("127.0.0.1:6066", ("127.0.0.1", 6066)),
        ("LocalHost:6066", ("localhost", 6066)),
        ("status.example.com.", ("status.example.com", None)),
        ("[::1]:6066", ("::1", 6066)),
        ("[::1]", ("::1", None)),
        ("::1", None),
        ("a:b", None),
        ("a:", None),
        ("a:70000", None),
        ("[::1]x", None),
        ("", None),
    ],
)
def test_split_host(host: str, parsed: tuple[str, int | None] | None) -> None:
    assert split_host(host) == parsed


@pytest.mark.parametrize(
    ("host", "local", "allowed", "ok"),
    [
        ("127.0.0.1:6066", ("127.0.0.1", 6066), (), True),
        ("localhost:6066", ("127.0.0.1", 6066), (), True),
        ("[::1]:6066", ("::1", 6066), (), True),
        ("127.0.0.1:6066", ("::ffff:127.0.0.1", 6066), (), True),  # a dual-stack socket
        ("localhost:6066", ("::ffff:127.0.0.1", 6066), (), True),
        ("localhost:6066", ("10.0.0.5", 6066), (), False),  # not loopback: no localhost
        ("10.0.0.5:6066", ("10.0.0.5", 6066), (), True),  # a 0.0.0.0 bind, reached by IP
        ("status.lan:6066", ("10.0.0.5", 6066), (), False),
        ("status.lan:6066", ("10.0.0.5", 6066), ("status.lan",), True),
        ("status.lan:6066", ("10.0.0.5", 6066), ("Status.LAN:6066",), True),
        ("status.lan", ("10.0.0.5", 6066), ("status.lan:6066",), False),
        ("localhost:6067", ("127.0.0.1", 6066), (), False),
        (None, ("127.0.0.1", 6066), (), False),
    ],
)
def test_check_host(
    host: str | None, local: tuple[str, int], allowed: tuple[str, ...], ok: bool
) -> None:
    got = check_host(host, local_addr=local[0], local_port=local[1], allowed=allowed)
    assert (got is None) == ok, got


@pytest.mark.parametrize(
    ("origin", "host", "ok"),
    [
        (None, "127.0.0.1:6066", True),
        ("http://127.0.0.1:6066", "127.0.0.1:6066", True),
        ("https://status.example.com", "status.example.com", True),
        ("https://status.example.com", "status.example.com:443", True),
        ("http://127.0.0.1:6067", "127.0.0.1:6066", False),
        ("http://localhost:6066", "127.0.0.1:6066", False),
        ("null", "127.0.0.1:6066", False),
        ("file://", "127.0.0.1:6066", False),
        ("ftp://127.0.0.1:6066", "127.0.0.1:6066", False),
        ("http://127.0.0.1:6066/x", "127.0.0.1:6066", False),
    ],
)
def test_check_origin(origin: str | None, host: str, ok: bool) -> None:
    scheme = "https" if (origin or "").startswith("https") else "http"
    assert (check_origin(origin, host=host, scheme=scheme) is None) == ok


@pytest.mark.parametrize(
    ("origin", "host", "scheme", "ok"),
    [
        # the whole origin: scheme, host and port
        ("http://127.0.0.1:6066", "127.0.0.1:6066", "http", True),
        ("https://127.0.0.1:6066", "127.0.0.1:6066", "http", False),  # same host:port
        ("http://127.0.0.1:6066", "127.0.0.1:6066", "https", False),
        ("http://status.example.com", "status.example.com", "https", False),
        ("https://status.example.com", "status.example.com", "https", True),
        ("https://status.example.com:443", "status.example.com", "https", True),
        ("https://status.example.com", "status.example.com:443", "https", True),
        ("http://status.example.com", "status.example.com:80", "http", True),
        # a default port belongs to its scheme: https://h:80 is not http://h
        ("https://status.example.com:80", "status.example.com:80", "http", False),
        ("http://status.example.com:443", "status.example.com:443", "https", False),
        ("HTTP://127.0.0.1:6066", "127.0.0.1:6066", "http", True),
        # not an origin at all
        ("http://user@127.0.0.1:6066", "127.0.0.1:6066", "http", False),
        ("http://127.0.0.1:6066?x=1", "127.0.0.1:6066", "http", False),
        ("http://127.0.0.1:6066#x", "127.0.0.1:6066", "http", False),
        ("http://127.0.0.1:99999", "127.0.0.1:99999", "http", False),
        ("http://[::1", "[::1]:6066", "http", False),
        ("http://127.0.0.1:6066", "", "http", False),
        ("http://127.0.0.1:6066", "127.0.0.1:6066", "ftp", False),
    ],
)
def test_the_origin_is_compared_whole(origin: str, host: str, scheme: str, ok: bool) -> None:
    refusal = check_origin(origin, host=host, scheme=scheme)
    assert (refusal is None) == ok
    if refusal is not None:
        assert refusal.status == 403


@pytest.mark.parametrize(
    ("transport", "forwarded", "scheme"),
    [
        ("http", None, "http"),
        ("https", None, "https"),
        ("http", "https", "https"),
        ("http", "HTTPS, http", "https"),  # the proxy nearest the browser comes first
        ("http", "gopher", "http"),  # not a scheme of a page: ignored
        ("http", "", "http"),
    ],
)
def test_page_scheme(transport: str, forwarded: str | None, scheme: str) -> None:
    assert page_scheme(transport, forwarded) == scheme


def test_an_origin_of_another_scheme_is_refused_by_the_view() -> None:
    """A page of https://127.0.0.1:PORT is not the view's page (it serves http)."""
    status, doc, _, calls = call(
        "POST", "/dlq/q/redrive", {**BEARER, **JSON, "Origin": "https://127.0.0.1:PORT"}
    )
    assert (status, calls) == (403, [])
    assert "scheme, host and port must all match" in doc["error"]
    # the same origin, once a TLS proxy in front says the page is https
    status, _, _, calls = call(
        "POST",
        "/dlq/q/redrive",
        {**BEARER, **JSON, "Origin": "https://127.0.0.1:PORT", "X-Forwarded-Proto": "https"},
    )
    assert (status, len(calls)) == (200, 1)


async def _raw_post(authorization: bytes) -> tuple[int, dict[str, Any]]:
    """One POST with an Authorization header of raw bytes (aiohttp's client sends text)."""
    app = build_web_app(FakeSource(), Metrics(), access=StatusAccess(token=TOKEN))
    async with TestServer(app, host="127.0.0.1") as server:
        port = int(server.port or 0)
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(
            b"POST /dlq/q/redrive HTTP/1.1\r\nHost: 127.0.0.1:%d\r\nAuthorization: %s\r\n"
            b"Content-Type: application/json\r\nContent-Length: 2\r\nConnection: close\r\n"
            b"\r\n{}" % (port, authorization)
        )
        await writer.drain()
        raw = await reader.read()
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), orjson.loads(body)


@pytest.mark.parametrize(
    "authorization",
    [
        pytest.param(b"Bearer \xff\xfe", id="not-utf8"),
        pytest.param(b"Bearer \xe9", id="latin1"),
        pytest.param(b"Bearer h\xc3\xa9llo", id="utf8-non-ascii"),
        pytest.param(b"Basic !!!not-base64", id="bad-base64"),
        pytest.param(b"Basic dXNlcjpwYXNz", id="other-scheme"),
        pytest.param(b"\xff\xfe " + TOKEN.encode(), id="undecodable-scheme"),
        pytest.param(b"Bearer", id="no-token"),
    ],
)
def test_an_authorization_header_it_cannot_read_is_a_401_not_an_error(
    authorization: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.DEBUG):
        status, doc = asyncio.run(_raw_post(authorization))
    assert status == 401, doc
    assert "token" in doc["error"]
    assert TOKEN not in doc["error"]
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR or r.exc_info]


def test_check_token_takes_the_bearer_scheme_in_any_case() -> None:
    assert check_token(f"bearer {TOKEN}", token=TOKEN) is None
    assert check_token(f"  Bearer   {TOKEN} ", token=TOKEN) is None
    refusal = check_token("Bearer héllo", token=TOKEN)  # not ASCII: refused, not a crash
    assert refusal is not None
    assert refusal.status == 401


@pytest.mark.parametrize(
    ("bind", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.0.2", True),
        ("localhost", True),
        ("::1", True),
        ("0.0.0.0", False),
        ("::", False),
        ("", False),
        ("192.168.1.20", False),
        ("10.0.0.5", False),
        ("status.lan", False),
    ],
)
def test_is_loopback_bind(bind: str, loopback: bool) -> None:
    assert is_loopback_bind(bind) is loopback


@pytest.mark.parametrize("bind", ["0.0.0.0", "192.168.1.20", "::"])
def test_the_view_refuses_to_bind_beyond_loopback_without_a_token(bind: str) -> None:
    settings = Settings(observability=ObservabilitySettings(status_bind=bind))
    with pytest.raises(ConfigError) as err:
        StatusView(settings, metrics=Metrics())
    assert err.value.setting == "observability.status_token"
    assert "DUEFLOW_OBSERVABILITY_STATUS_TOKEN" in str(err.value)
    assert repr(bind) in str(err.value)
    # With a token configured it may.
    obs = replace(settings.observability, status_token=TOKEN)
    require_token_beyond_loopback(replace(settings, observability=obs))


def test_a_token_is_made_at_start_unless_configured_and_printed_only_then() -> None:
    made = StatusView(Settings(), metrics=Metrics()).access
    again = StatusView(Settings(), metrics=Metrics()).access
    assert made.generated
    assert len(made.token) >= 32
    assert made.token != again.token
    banner = page_banner(made, bind="127.0.0.1", port=6066)
    assert f"http://127.0.0.1:6066/?token={made.token}" in banner
    configured = Settings(observability=ObservabilitySettings(status_token=TOKEN))
    access = StatusView(configured, metrics=Metrics()).access
    assert (access.token, access.generated) == (TOKEN, False)
    banner = page_banner(access, bind="0.0.0.0", port=6066)
    assert TOKEN not in banner
    assert "observability.status_token" in banner
    assert TOKEN not in repr(access)
    assert TOKEN not in repr(configured)


def test_token_settings_from_the_environment_and_never_echoed() -> None:
    env = {
        "DUEFLOW_OBSERVABILITY_STATUS_TOKEN": TOKEN,
        "DUEFLOW_OBSERVABILITY_STATUS_ALLOWED_HOSTS": "status.lan,10.0.0.5:6066",
    }
    obs = load_settings(env=env).observability
    assert obs.status_token == TOKEN
    assert obs.status_allowed_hosts == ("status.lan", "10.0.0.5:6066")
    unset = load_settings(env={"DUEFLOW_OBSERVABILITY_STATUS_TOKEN": ""}).observability
    assert unset.status_token is None
    with pytest.raises(ConfigError) as err:
        load_settings(env={"DUEFLOW_OBSERVABILITY_STATUS_TOKEN": "short-secret"})
    assert "observability.status_token" in str(err.value)
    assert "short-secret" not in str(err.value)
    assert err.value.value is None
    with pytest.raises(ConfigError, match=r"status_allowed_hosts\[0\]"):
        load_settings(env={"DUEFLOW_OBSERVABILITY_STATUS_ALLOWED_HOSTS": "http://x/"})
