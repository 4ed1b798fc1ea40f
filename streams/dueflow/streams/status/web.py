"""HTTP of the status view (aiohttp): JSON endpoints, /metrics and the page.

Routes:

=============================  ===============================================
``GET /``                      the web page (one self-contained HTML file)
``GET /jobs/{job_id}``         one job's view; 404 ``{"state": "unknown", ...}``
``GET /queues``                per queue: counts by state, lag, DLQ depth
``GET /api/overview``          everything the page shows, in one document
``GET /api/cluster``           the Kafka-direct cluster view
``GET /metrics``               Prometheus text exposition of this process
``GET /healthz``               200 once tables are recovered
``POST /dlq/{queue}/redrive``  redrive the queue's dead letters (``?limit=N``,
                               default 100, at most 1000 per call; one call at a
                               time: 409 while one runs); 501 without a redriver
=============================  ===============================================

Every request passes the checks of :mod:`.access` first (a middleware, so a
route added later is covered too): a ``Host`` of this view (403), and for
every method but GET/HEAD/OPTIONS a same-site ``Origin`` (403), the bearer
token (401) and a JSON body (415). Errors are JSON ``{"error": message}``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any, Protocol

import orjson
from aiohttp import web

from dueflow.errors import DueflowError
from dueflow.observability.metrics import Metrics, render
from dueflow.streams.status import access as acc
from dueflow.streams.status.access import StatusAccess

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
REDRIVE_MAX = 1000

# (queue, limit, by) -> the redrive report as JSON (blocking: run on a thread)
RedriveCall = Callable[[str, int, str], dict[str, Any]]
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class StatusSource(Protocol):
    """What the HTTP layer needs from the status view."""

    def job(self, job_id: str) -> dict[str, Any] | None: ...

    def queues(self) -> dict[str, Any]: ...

    def overview(self) -> dict[str, Any]: ...

    def cluster(self) -> dict[str, Any] | None: ...

    def queue_names(self) -> list[str]: ...


def json_response(data: Any, status: int = 200) -> web.Response:
    return web.Response(
        body=orjson.dumps(data, option=orjson.OPT_NON_STR_KEYS),
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


def access_middleware(access: StatusAccess) -> Any:
    """The checks of :mod:`.access` on every request; aiohttp's own errors as JSON."""

    @web.middleware
    async def guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        refusal = await _refusal(request, access)
        if refusal is not None:
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


async def _refusal(request: web.Request, access: StatusAccess) -> acc.Refusal | None:
    sock = request.transport.get_extra_info("sockname") if request.transport else None
    if not sock:
        return acc.Refusal(400, "connection closed")
    host = request.headers.get("Host")
    found = acc.check_host(
        host, local_addr=str(sock[0]), local_port=int(sock[1]), allowed=access.allowed_hosts
    )
    if found is not None or request.method in acc.SAFE_METHODS:
        return found
    found = acc.check_origin(request.headers.get("Origin"), host=host or "")
    if found is None:
        found = acc.check_token(request.headers.get("Authorization"), token=access.token)
    if found is None:
        media = request.headers.get("Content-Type", "").split(";")[0].strip()
        found = acc.check_json_body(media, await request.read())
    return found


def build_web_app(
    source: StatusSource,
    metrics: Metrics,
    *,
    access: StatusAccess,
    redrive_call: RedriveCall | None = None,
) -> web.Application:
    """The aiohttp application serving ``source``, behind the checks of ``access``;
    ``redrive_call`` backs the redrive button (``dueflow.apps.ops.redrive``: bounded,
    idempotent)."""
    page = page_html()
    redriving = asyncio.Lock()

    async def index(_request: web.Request) -> web.Response:
        return web.Response(
            body=page, content_type="text/html", charset="utf-8", headers=PAGE_HEADERS
        )

    async def job(request: web.Request) -> web.Response:
        job_id = request.match_info["job_id"]
        view = source.job(job_id)
        if view is None:
            return error(404, UNKNOWN_JOB, job_id=job_id, state="unknown")
        return json_response(view)

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
        async with redriving:
            try:
                report = await asyncio.to_thread(redrive_call, queue, limit, by)
            except DueflowError as exc:
                return error(503, f"redrive failed: {exc}", queue=queue)
        return json_response(report)

    app = web.Application(middlewares=[access_middleware(access)])
    app.router.add_get("/", index)
    app.router.add_get("/jobs/{job_id}", job)
    app.router.add_get("/queues", queues)
    app.router.add_get("/api/overview", overview)
    app.router.add_get("/api/cluster", cluster)
    app.router.add_get("/metrics", metrics_text)
    app.router.add_get("/healthz", healthz)
    app.router.add_post("/dlq/{queue}/redrive", redrive)
    return app


class WebServer:
    """Runs :func:`build_web_app` on ``bind:port`` (port 0 picks one)."""

    def __init__(self, app: web.Application, *, bind: str, port: int) -> None:
        self._app = app
        self._bind = bind
        self._port = port
        self._runner: web.AppRunner | None = None
        self.port: int | None = None

    async def start(self) -> int:
        self._runner = web.AppRunner(self._app, access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self._bind, self._port)
        await site.start()
        server = site._server  # aiohttp exposes the bound port only here
        sockets = getattr(server, "sockets", None) or []
        self.port = int(sockets[0].getsockname()[1]) if sockets else self._port
        return self.port

    async def stop(self) -> None:
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
