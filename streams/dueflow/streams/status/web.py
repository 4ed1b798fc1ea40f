"""HTTP of the status view (aiohttp): JSON endpoints, /metrics and the page.

Routes:

=============================  ===============================================
``GET /``                      the web page (one self-contained HTML file)
``GET /jobs/{job_id}``         one job's view; 404 ``{"state": "unknown", ...}``;
                               ``?wait_ms=N&until=final|change`` (N up to
                               60000) answers once the job is final (default)
                               or has changed, else after N ms as it is then
``GET /queues``                per queue: counts by state, lag, DLQ depth
``GET /api/overview``          everything the page shows, in one document
``GET /api/cluster``           the Kafka-direct cluster view
``GET /metrics``               Prometheus text exposition of this process
``GET /healthz``               200 once tables are recovered
``GET /livez``, ``/readyz``    the probes of :mod:`dueflow.observability.health`
                               (also on the metrics listener, which answers
                               while this loop is busy)
``POST /dlq/{queue}/redrive``  redrive the queue's dead letters (``?limit=N``,
                               default 100, at most 1000 per call; one call at a
                               time: 409 while one runs); 501 without a redriver
=============================  ===============================================

Every request passes the checks of :mod:`.access` first (a middleware, so a
route added later is covered too): a ``Host`` of this view (403), and for
every method but GET/HEAD/OPTIONS a same-site ``Origin`` (403), the bearer
token (401) and a JSON body (415). Errors are JSON ``{"error": message}``.
Job answers carry the view's identity (``Dueflow-Topic-Prefix``,
``Dueflow-Cluster-Id``), so a client can tell it asked the view of its own
cluster.
"""

from __future__ import annotations

import asyncio
import logging
import ssl
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any, Protocol

from aiohttp import web

from dueflow.control_chars import json_text
from dueflow.errors import DueflowError
from dueflow.observability.endpoint import HealthSource
from dueflow.observability.logs import event
from dueflow.observability.metrics import Metrics, render
from dueflow.streams.status import access as acc
from dueflow.streams.status import console_access as ca
from dueflow.streams.status.access import StatusAccess
from dueflow.streams.status.console_access import Sessions
from dueflow.streams.status.console_api import ConsoleSource, add_console_routes
from dueflow.streams.status.job_waiters import WAIT_UNTIL

log = logging.getLogger("dueflow.status")

PAGE = "page.html"
# A job gets its first outcome when the SDK schedules it (``scheduled``, on by
# default), else when a worker finishes an attempt (or it is cancelled).
UNKNOWN_JOB = (
    "unknown job id: the status view has no outcome for it. A job is known from the "
    "moment it is scheduled (the client writes a scheduled outcome unless "
    "scheduled_outcomes=False, then from its first attempt); so it is no such job, a job "
    "of such a client not run yet, or one that finished longer ago than the view keeps"
)
REDRIVE_LIMIT = 100
WAIT_MAX_MS = 60_000
REDRIVE_MAX = 1000

# (queue, limit, by) -> the redrive report as JSON (blocking: run on a thread)
RedriveCall = Callable[[str, int, str], dict[str, Any]]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class StatusSource(Protocol):
    """What the HTTP layer needs from the status view."""

    def job(self, job_id: str) -> dict[str, Any] | None: ...

    async def wait_job(
        self, job_id: str, *, until: str, timeout_s: float
    ) -> dict[str, Any] | None: ...

    def identity(self) -> dict[str, str]: ...

    def queues(self) -> dict[str, Any]: ...

    def overview(self) -> dict[str, Any]: ...

    def cluster(self) -> dict[str, Any] | None: ...

    def queue_names(self) -> list[str]: ...


def json_response(data: Any, status: int = 200) -> web.Response:
    """``data`` as JSON: control characters in its strings (job data from any writer,
    handler errors) are ``\\uXXXX`` escapes, never raw (:func:`json_text`)."""
    return web.Response(
        text=json_text(data, non_str_keys=True),
        status=status,
        content_type="application/json",
    )


def error(status: int, message: str, **fields: Any) -> web.Response:
    return json_response({"error": message, **fields}, status=status)


def page_html() -> bytes:
    return (resources.files("dueflow.streams.status") / PAGE).read_bytes()


# The page: no framing (clickjacking of its buttons), no Referer carrying ?token=,
# nothing cached; scripts and styles only its own inline ones, requests only to itself.
PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
        "connect-src 'self'; img-src 'self'; form-action 'none'; frame-ancestors 'none'; "
        "base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
}


def access_middleware(access: StatusAccess, sessions: Sessions | None = None) -> Any:
    """The checks of :mod:`.access` on every request (and with ``sessions`` those of
    :mod:`.console_access`: the caller is ``request[CALLER]``); aiohttp's own
    errors as JSON."""

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            refusal = await _refusal(request, access, sessions)
        except Exception as exc:  # headers the checks cannot read: refused, no traceback
            event(log, "status view: request refused", logging.WARNING, error=repr(exc))
            refusal = acc.Refusal(400, "the request's headers could not be read")
        if refusal is not None:
            if request.method not in acc.SAFE_METHODS:
                _log_refused(request, refusal)
            resp = error(refusal.status, refusal.message)
            if refusal.status == 401:
                resp.headers["WWW-Authenticate"] = 'Bearer realm="dueflow status view"'
            return resp
        try:
            return await handler(request)
        except web.HTTPException as exc:  # 404 of an unknown path, 405, ...
            if exc.status < 400:
                raise
            return error(exc.status, exc.reason)

    return guard


def _log_refused(request: web.Request, refusal: acc.Refusal) -> None:
    """A refused state-changing call, in the audit log beside the actions."""
    remote = request.remote or "?"
    who = request.get(ca.CALLER) or ca.Caller(None, f"anonymous ({remote})", remote=remote)
    event(
        log,
        "console.action_refused",
        logging.WARNING,
        **who.audit(),
        method=request.method,
        path=request.path,
        status=refusal.status,
        error=refusal.message,
    )


def _caller(request: web.Request) -> ca.Caller:
    """Who made a state-changing call that passed the checks (the bearer token's
    operator when the view has no console sessions)."""
    found = request.get(ca.CALLER)
    if isinstance(found, ca.Caller):
        return found
    remote = request.remote or "?"
    return ca.Caller(ca.OPERATOR, f"bearer token (operator, {remote})", bearer=True, remote=remote)


async def _refusal(
    request: web.Request, access: StatusAccess, sessions: Sessions | None = None
) -> acc.Refusal | None:
    sock = request.transport.get_extra_info("sockname") if request.transport else None
    if not sock:
        return acc.Refusal(400, "connection closed")
    host = request.headers.get("Host")
    found = acc.check_host(
        host, local_addr=str(sock[0]), local_port=int(sock[1]), allowed=access.allowed_hosts
    )
    caller = None
    if sessions is not None and found is None:
        caller = ca.caller_of(
            sessions,
            authorization=request.headers.get("Authorization"),
            cookie=request.cookies.get(ca.COOKIE),
            remote=request.remote or "?",
        )
        request[ca.CALLER] = caller
        if request.method in acc.SAFE_METHODS:
            return ca.check_read(caller, request.path, sessions)
    if found is not None or request.method in acc.SAFE_METHODS:
        return found
    scheme = acc.page_scheme(request.scheme, request.headers.get("X-Forwarded-Proto"))
    found = acc.check_origin(request.headers.get("Origin"), host=host or "", scheme=scheme)
    if found is None and caller is not None:
        found = ca.check_mutation(caller, request.headers.get(ca.CSRF_HEADER))
        if found is None and (caller.session is not None or request.path in ca.LOGIN_PATHS):
            # A session's CSRF token was checked; a login carries its token in the body.
            found = acc.check_json_body(
                request.headers.get("Content-Type", "").split(";")[0].strip(),
                await request.read(),
            )
            return found
    if found is None:
        found = acc.check_token(request.headers.get("Authorization"), token=access.token)
    if found is None:
        media = request.headers.get("Content-Type", "").split(";")[0].strip()
        found = acc.check_json_body(media, await request.read())
    return found


def job_handler(source: StatusSource) -> Handler:
    """``GET /jobs/{job_id}[?wait_ms=&until=]``: a job's view (``Scheduler.status`` and
    ``dueflow job`` ask it), now or once it changes or ends, with the view's identity."""

    async def job(request: web.Request) -> web.Response:
        job_id = request.match_info["job_id"]
        wait = request.query.get("wait_ms")
        until = request.query.get("until", "final")
        if until not in WAIT_UNTIL:
            return error(400, f"until: one of {', '.join(WAIT_UNTIL)}", until=until)
        if wait is None:
            view = source.job(job_id)
        else:
            wait_ms = int(wait) if wait.isdigit() else -1
            if not 0 <= wait_ms <= WAIT_MAX_MS:
                return error(400, f"wait_ms: an integer from 0 to {WAIT_MAX_MS}", wait_ms=wait)
            view = await source.wait_job(job_id, until=until, timeout_s=wait_ms / 1000)
        resp = (
            error(404, UNKNOWN_JOB, job_id=job_id, state="unknown")
            if view is None
            else json_response(view)
        )
        resp.headers.update(source.identity())
        return resp

    return job


def redrive_handler(source: StatusSource, redrive_call: RedriveCall | None) -> Handler:
    """``POST /dlq/{queue}/redrive``: the redrive button, one run at a time (409 while
    one runs), logged as a console action."""
    redriving = asyncio.Lock()

    async def redrive(request: web.Request) -> web.Response:
        queue = request.match_info["queue"]
        if queue not in source.queue_names():
            return error(404, "unknown queue", queue=queue, queues=source.queue_names())
        if redrive_call is None:
            return error(501, "this status view has no redriver", queue=queue)
        try:
            limit = int(request.query.get("limit", REDRIVE_LIMIT))
        except ValueError:
            limit = -1
        if not 1 <= limit <= REDRIVE_MAX:
            return error(400, f"limit: 1 to {REDRIVE_MAX}", limit=request.query.get("limit"))
        if redriving.locked():
            return error(409, "a redrive is running; try again when it is done", queue=queue)
        by = f"status-page:{request.remote or '?'}"
        audit = {**_caller(request).audit(), "action": "redrive", "target_kind": "queue"}
        async with redriving:
            try:
                report = await asyncio.to_thread(redrive_call, queue, limit, by)
            except DueflowError as exc:
                event(
                    log,
                    "console.action",
                    logging.WARNING,
                    **audit,
                    target=queue,
                    params={"limit": limit},
                    result="failed",
                    status=503,
                    done=False,
                    message=str(exc),
                )
                return error(503, f"redrive failed: {exc}", queue=queue)
        event(
            log,
            "console.action",
            **audit,
            target=queue,
            params={"limit": limit},
            result="done" if report.get("redriven") else "not done",
            status=200,
            done=bool(report.get("redriven")),
            message=report.get("message"),
        )
        return json_response(report)

    return redrive


def build_web_app(
    source: StatusSource,
    metrics: Metrics,
    *,
    access: StatusAccess,
    redrive_call: RedriveCall | None = None,
    health: HealthSource | None = None,
    console: ConsoleSource | None = None,
    sessions: Sessions | None = None,
    tls: bool = False,
) -> web.Application:
    """The aiohttp application serving ``source``, behind the checks of ``access``;
    ``redrive_call`` backs the redrive button (the view's operator tools: bounded,
    idempotent; :func:`redrive_handler`); ``console`` backs the operator console's API
    (:mod:`.console_api`); ``tls``: it is served over HTTPS (:class:`WebServer`)."""
    page = page_html()

    async def index(_request: web.Request) -> web.Response:
        return web.Response(
            body=page, content_type="text/html", charset="utf-8", headers=PAGE_HEADERS
        )

    async def queues(_request: web.Request) -> web.Response:
        return json_response(source.queues())

    async def overview(_request: web.Request) -> web.Response:
        return json_response(source.overview())

    async def cluster(_request: web.Request) -> web.Response:
        view = source.cluster()
        if view is None:
            return error(503, "the cluster view has not been read yet; try again in a moment")
        return json_response(view)

    async def metrics_text(_request: web.Request) -> web.Response:
        body, content_type = render(metrics)
        return web.Response(body=body, headers={"Content-Type": content_type})

    async def healthz(_request: web.Request) -> web.Response:
        return json_response({"ok": True})

    async def probe(request: web.Request) -> web.Response:
        if health is None:
            return error(404, "no health source")
        verdict = health.live() if request.path == "/livez" else health.ready()
        return json_response(verdict.to_json(), status=200 if verdict.ok else 503)

    app = web.Application(middlewares=[access_middleware(access, sessions)])
    app.router.add_get("/", index)
    app.router.add_get("/jobs/{job_id}", job_handler(source))
    app.router.add_get("/queues", queues)
    app.router.add_get("/api/overview", overview)
    app.router.add_get("/api/cluster", cluster)
    app.router.add_get("/metrics", metrics_text)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/livez", probe)
    app.router.add_get("/readyz", probe)
    app.router.add_post("/dlq/{queue}/redrive", redrive_handler(source, redrive_call))
    if console is not None:
        add_console_routes(app, console, sessions, tls=tls)
    return app


class WebServer:
    """Runs :func:`build_web_app` on ``bind:port`` (port 0 picks one); HTTPS only
    with ``ssl_context`` (:func:`.tls.server_context`)."""

    def __init__(
        self,
        app: web.Application,
        *,
        bind: str,
        port: int,
        ssl_context: ssl.SSLContext | None = None,
    ) -> None:
        self._app = app
        self._bind = bind
        self._port = port
        self._ssl_context = ssl_context
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    async def start(self) -> int:
        self._runner = web.AppRunner(self._app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._bind, self._port, ssl_context=self._ssl_context)
        await site.start()
        server = site._server  # aiohttp exposes the bound port only here
        sockets = getattr(server, "sockets", None) or []
        self.port = int(sockets[0].getsockname()[1]) if sockets else self._port
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
