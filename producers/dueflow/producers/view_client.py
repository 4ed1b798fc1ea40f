"""Asking the status view about one job over HTTP (I/O edge).

``GET <status_url>/jobs/{id}`` answers from the view's table of every job
(pending at any horizon, running, finished within ``status_retention_ms``);
``?wait_ms=&until=final|change`` waits for the job's end or next change.
:class:`ViewClient` keeps one keep-alive connection per thread (a client is
shared by threads), sends the view's token when one is configured, and checks
that the view answering reads this client's cluster and topic prefix (unless
the caller named the view itself: ``topic_prefix=None``; the
``Dueflow-Topic-Prefix`` and ``Dueflow-Cluster-Id`` headers): a view of
another cluster at the same URL must not say "unknown" for a job of this one,
and an answer without them (a view of an older version) does not count.

Anything but a 200 or 404 from the right view is :class:`ViewUnavailable`
(the caller falls back to the outcomes scan).

An https view is verified as any https server (the system's CAs, or
``SSL_CERT_FILE``), except by a process with the view's own settings
(``observability.status_tls_cert`` set, ``status_url`` unset: the URL is the
view's bind address): that one trusts exactly the view's certificate
(:func:`pinned_view_context`), whatever names it carries.
"""

from __future__ import annotations

import http.client
import ssl
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

import orjson

from dueflow.config import ObservabilitySettings, Settings
from dueflow.rules.job_state import FINAL_STATES

WAIT_UNTIL = ("final", "change")
WAIT_MAX_MS = 60_000  # the longest wait_ms the view accepts in one request


def pinned_view_context(obs: ObservabilitySettings) -> ssl.SSLContext | None:
    """A client context trusting the view's own certificate (the first one in
    ``status_tls_cert``, not its chain) and nothing else, for the URL made of the
    view's bind address (``status_url`` unset), which no certificate need name;
    None otherwise, or when the file cannot be read here (the system's CAs then)."""
    if obs.status_url or not obs.status_tls_cert:
        return None
    try:
        with open(obs.status_tls_cert, encoding="ascii", errors="replace") as fh:
            text = fh.read()
    except OSError:
        return None
    begin, end = "-----BEGIN CERTIFICATE-----", "-----END CERTIFICATE-----"
    start = text.find(begin)
    stop = text.find(end, start)
    if start < 0 or stop < 0:
        return None
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = False  # the pin is the certificate itself
    try:
        ctx.load_verify_locations(cadata=text[start : stop + len(end)])
    except ssl.SSLError:
        return None
    ctx.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN  # a CA-issued certificate too
    return ctx


class ViewUnavailable(Exception):
    """The status view gave no usable answer (down, slow, another cluster's, ...);
    ``absent``: nothing listens at its address."""

    def __init__(self, message: str, *, absent: bool = False) -> None:
        super().__init__(message)
        self.absent = absent


class ViewClient:
    """The status view's job endpoint, for one client (thread-safe)."""

    def __init__(
        self,
        base_url: str,
        *,
        topic_prefix: str | None,
        token: str | None = None,
        timeout_s: float = 2.0,
        cluster_id: Callable[[], str | None] = lambda: None,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        url = urllib.parse.urlsplit(base_url.rstrip("/"))
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"status url: http(s)://host[:port][/path], not {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self._scheme = url.scheme
        self._host = url.hostname
        self._port = url.port
        self._path = url.path
        self.topic_prefix = topic_prefix
        self._token = token
        self.timeout_s = timeout_s
        self._cluster_id = cluster_id
        self._ssl_context = ssl_context
        self._cluster: str | None = None
        self._cluster_read = False
        self._local = threading.local()
        self._lock = threading.Lock()
        self._conns: set[http.client.HTTPConnection] = set()

    @classmethod
    def from_settings(
        cls, settings: Settings, *, cluster_id: Callable[[], str | None] = lambda: None
    ) -> ViewClient:
        obs = settings.observability
        return cls(
            obs.status_base_url,
            topic_prefix=settings.topic_prefix,
            # Reads need a role when the view has a viewer token: either token gives one.
            token=obs.status_token or obs.status_viewer_token,
            timeout_s=obs.status_lookup_timeout_ms / 1000,
            cluster_id=cluster_id,
            ssl_context=pinned_view_context(obs),
        )

    def job(self, job_id: str, *, wait_ms: int = 0, until: str = "final") -> dict[str, Any] | None:
        """The view's record of ``job_id``; None when the view does not know it. With
        ``wait_ms``, the view answers once the job is final (``until="final"``) or has
        changed (``"change"``), else after ``wait_ms`` as it is then."""
        if until not in WAIT_UNTIL:
            raise ValueError(f"until: one of {WAIT_UNTIL}, not {until!r}")
        path = f"{self._path}/jobs/{urllib.parse.quote(job_id, safe='')}"
        if wait_ms > 0:
            path += f"?wait_ms={int(wait_ms)}&until={until}"
        status, headers, body = self._get(path, timeout_s=self.timeout_s + wait_ms / 1000)
        self._check_identity(headers)
        if status == 404:
            return None
        if status != 200:
            raise ViewUnavailable(f"{self.base_url} answered HTTP {status}: {body[:200]!r}")
        try:
            found = orjson.loads(body)
        except orjson.JSONDecodeError as exc:
            raise ViewUnavailable(f"{self.base_url} answered no JSON: {exc}") from exc
        if not isinstance(found, dict) or found.get("job_id") != job_id:
            raise ViewUnavailable(f"{self.base_url} answered another document for {job_id!r}")
        return found

    def wait_for_end(
        self, job_id: str, *, timeout_s: float, clock: Callable[[], float] = time.monotonic
    ) -> dict[str, Any] | None:
        """The view's record of ``job_id`` once it has ended (a final state:
        succeeded, dead, cancelled, ...), else as it is when ``timeout_s`` has passed
        (None: the view does not know it). Long-polls ``?wait_ms=&until=final`` in
        requests of at most :data:`WAIT_MAX_MS`; :class:`ViewUnavailable` as
        :meth:`job`."""
        deadline = clock() + max(0.0, timeout_s)
        while True:
            left_ms = int((deadline - clock()) * 1000)
            found = self.job(job_id, wait_ms=max(0, min(left_ms, WAIT_MAX_MS)), until="final")
            if found is not None and found.get("state") in FINAL_STATES:
                return found
            if left_ms <= WAIT_MAX_MS:
                return found

    def _get(self, path: str, *, timeout_s: float) -> tuple[int, dict[str, str], bytes]:
        headers = {"Accept": "application/json"}
        if self._token:
            headers["Authorization"] = f"Bearer {self._token}"
        for attempt in (1, 2):  # a kept connection the server closed meanwhile: once more
            conn = self._connection(timeout_s)
            try:
                conn.request("GET", path, headers=headers)
                resp = conn.getresponse()
                body = resp.read()
            except (OSError, http.client.HTTPException) as exc:
                self._drop(conn)
                reused = getattr(self._local, "reused", False)
                if attempt == 1 and reused and not isinstance(exc, TimeoutError):
                    continue
                raise ViewUnavailable(
                    f"{self.base_url} did not answer: {exc!r}",
                    absent=isinstance(exc, ConnectionRefusedError),
                ) from exc
            self._local.reused = True
            if resp.will_close:
                self._drop(conn)
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, body
        raise AssertionError("unreachable")  # pragma: no cover

    def _connection(self, timeout_s: float) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        if conn is None:
            if self._scheme == "https":
                conn = http.client.HTTPSConnection(
                    self._host, self._port, timeout=timeout_s, context=self._ssl_context
                )
            else:
                conn = http.client.HTTPConnection(self._host, self._port, timeout=timeout_s)
            self._local.conn = conn
            self._local.reused = False
            with self._lock:
                self._conns.add(conn)
        conn.timeout = timeout_s
        if conn.sock is not None:
            conn.sock.settimeout(timeout_s)
        return conn

    def _check_identity(self, headers: dict[str, str]) -> None:
        if self.topic_prefix is None:
            return  # the caller named this view (`dueflow job --url`): its answer counts
        prefix = headers.get("dueflow-topic-prefix")
        if prefix is None:  # a view of an older version: which cluster's is not known
            raise ViewUnavailable(f"{self.base_url} did not say which topics it reads")
        if prefix != self.topic_prefix:
            raise ViewUnavailable(
                f"the status view at {self.base_url} reads topic prefix {prefix!r}, "
                f"this client uses {self.topic_prefix!r} (set observability.status_url)"
            )
        theirs = headers.get("dueflow-cluster-id")
        if theirs is None:
            return
        if not self._cluster_read:
            try:
                self._cluster = self._cluster_id()
            except Exception:  # not known: the prefix check stands alone
                self._cluster = None
            self._cluster_read = True
        if self._cluster is not None and theirs != self._cluster:
            raise ViewUnavailable(
                f"the status view at {self.base_url} reads Kafka cluster {theirs!r}, "
                f"this client's is {self._cluster!r} (set observability.status_url)"
            )

    def _drop(self, conn: http.client.HTTPConnection) -> None:
        conn.close()
        self._local.conn = None
        with self._lock:
            self._conns.discard(conn)

    def close(self) -> None:
        """Close every thread's connection (a later call connects again)."""
        with self._lock:
            conns, self._conns = self._conns, set()
        for conn in conns:
            conn.close()  # a thread still holding it reconnects on its next request
