"""The operator console's HTTP API (aiohttp routes under ``/api/``).

=====================================  =========================================
``GET /api/jobs``                      find jobs: ``state``, ``queue``, ``task``
                                       (comma lists), ``due_from``/``due_to``
                                       (epoch ms or ISO 8601), ``id_prefix``,
                                       ``error`` (text in the newest error),
                                       ``limit`` (1-500, default 50), ``before``
                                       (the ``next`` cursor of the previous
                                       page); newest change first
``GET /api/jobs/{id}``                 one job: its view, timeline, attempts,
                                       result (operators, or viewers when
                                       payloads are open to them), trace link
``GET /api/jobs/{id}/dead-letter``     a dead job's DLQ record: traceback,
                                       origin, payload (read from the DLQ)
``GET /api/jobs/{id}/payload``         a pending job's payload, from its timer
                                       (or exec) record
``POST /api/login``                    ``{"token", "name"}``: a session cookie
                                       and its CSRF token
``POST /api/logout``                   ends the session
``GET /api/session``                   the session's role, name and CSRF token
``POST /api/jobs/{id}/cancel``         cancel a pending job
``POST /api/jobs/{id}/reschedule``     ``{"run_at"}``: move a pending job
``POST /api/jobs/{id}/run-now``        a pending job due now
``POST /api/jobs/{id}/retry``          redrive a dead job's DLQ record
``POST /api/dlq/{queue}/redrive``      ``{"filter", "dry_run", "limit"}``:
                                       redrive by filter (``dry_run``: preview
                                       how many)
``POST /api/dlq/{queue}/purge``        ``{"before"|"all", "dry_run"}``: delete
                                       dead letters written before a time
``POST /api/queues/{q}/pause|resume``  ``{"reason"}``: workers stop/start
``POST /api/schedules/{id}/pause|resume``  a cron schedule
``GET /api/actions``                   the newest actions: who, what, outcome
``GET /api/watch``                     per queue over the last hour: attempts
                                       ended, start lateness p50/p99, retries,
                                       dead letters, lag, DLQ depth; the
                                       emitter's leader and changes; the cron
                                       schedules with their next three runs
``GET /console``                       the console page (``/console.js``,
                                       ``/console.css``)
=====================================  =========================================

Every action runs the code the CLI runs (the view's operator tools,
:mod:`.operator_tools`) on a
thread, is logged once (``console.action``: the caller's name, role and
credential (:meth:`.console_access.Caller.audit`, never a token), the
action, its target and parameters, the result) and kept in ``GET
/api/actions``; a repeat of the same request (same ``Idempotency-Key``
header, or same action, target and body from the same caller within 10 s)
gets the first answer (``repeat: true``), acts once and is not logged again.

Bad parameters answer 400 naming the field, the value and what is accepted;
a search that runs out of its time budget answers 422 saying how to narrow it.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from importlib import resources
from typing import Any, Protocol

import orjson
from aiohttp import web

from dueflow.control_chars import json_text
from dueflow.errors import DueflowError, InvalidInput
from dueflow.observability.logs import event
from dueflow.streams.status import access as acc
from dueflow.streams.status import console_access as ca
from dueflow.streams.status.job_finder import SearchTooBroad
from dueflow.streams.status.job_search import Cursor, JobFilter, JobPage, parse_filter, parse_limit
from dueflow.streams.status.job_timeline import dead_letter_page, job_page, shown
from dueflow.streams.status.operator_tools import ConsoleOperations
from dueflow.wall_clock import wall_ms

log = logging.getLogger("dueflow.console")

# Fields of a view a list shows (the history is for the job's own page).
LIST_HIDDEN = frozenset({"history"})
ACTIONS_KEPT = 200
REPEAT_WINDOW_S = 10.0  # a repeated action within this long gets the first answer
# The body fields of actions that say what an action was asked to do (logged with it).
ACTION_PARAMS = ("run_at", "filter", "dry_run", "limit", "reason", "before", "all")


def action_params(body: dict[str, Any]) -> dict[str, Any]:
    """What ``body`` asked of an action, for its log line (known fields only)."""
    return {k: body[k] for k in ACTION_PARAMS if k in body}


def action_result(status: int, doc: dict[str, Any]) -> str:
    """One word for an action's outcome: done, not done (the SDK said why), refused
    (bad input), failed (Kafka or the SDK failed) or error (a bug)."""
    if status == 200:
        return "done" if doc.get("done") else "not done"
    return {400: "refused", 503: "failed"}.get(status, "error")


class ConsoleSource(Protocol):
    """What the console's API needs from the status view."""

    async def find_jobs(self, flt: JobFilter, *, before: Cursor | None, limit: int) -> JobPage: ...

    def job(self, job_id: str) -> dict[str, Any] | None: ...

    async def dead_letter(self, view: dict[str, Any]) -> dict[str, Any] | None: ...

    def payloads_for(self) -> str: ...

    def trace_url(self, trace_id: str) -> str | None: ...

    def queue_names(self) -> list[str]: ...

    def operations(self) -> ConsoleOperations | None: ...

    async def watch_doc(self) -> dict[str, Any]: ...


def json_response(data: Any, status: int = 200) -> web.Response:
    """``data`` as JSON, control characters escaped (as every answer of the view)."""
    return web.Response(
        text=json_text(data, non_str_keys=True), status=status, content_type="application/json"
    )


def bad_input(exc: InvalidInput) -> web.Response:
    return json_response({"error": str(exc), "field": exc.field}, status=400)


def listed(raw: bytes) -> dict[str, Any]:
    """A job's view as a search lists it."""
    view = orjson.loads(raw)
    return {k: v for k, v in view.items() if k not in LIST_HIDDEN}


CONSOLE_FILES = {
    "console.html": "text/html",
    "console.js": "text/javascript",
    "console.css": "text/css",
}
# The console: its own script and style files only (no inline code), requests to
# itself only, no framing, no Referer, nothing cached.
CONSOLE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
        "img-src 'self'; form-action 'none'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
}


def page_file(name: str) -> tuple[bytes, str]:
    """One of the console's static files and its media type."""
    return (resources.files("dueflow.streams.status") / name).read_bytes(), CONSOLE_FILES[name]


def caller(request: web.Request) -> ca.Caller:
    """Who sent ``request`` (set by the access middleware; a viewer without one)."""
    found = request.get(ca.CALLER)
    if isinstance(found, ca.Caller):
        return found
    remote = request.remote or "?"
    return ca.Caller(ca.VIEWER, f"anonymous ({remote})", remote=remote)


async def json_body(request: web.Request) -> dict[str, Any]:
    raw = await request.read()
    if not raw.strip():
        return {}
    doc = orjson.loads(raw)  # the middleware checked it parses
    if not isinstance(doc, dict):
        raise InvalidInput("body", type(doc).__name__, "a JSON object")
    return doc


@dataclass(slots=True)
class ActionDesk:
    """Runs actions once per request (repeats get the first answer) and keeps the
    newest ones for ``GET /api/actions``."""

    clock: Callable[[], float] = time.monotonic
    done: deque[dict[str, Any]] = field(default_factory=lambda: deque(maxlen=ACTIONS_KEPT))
    _recent: dict[tuple[str, ...], tuple[float, asyncio.Future[tuple[int, dict[str, Any]]]]] = (
        field(default_factory=dict)
    )

    async def run(
        self,
        key: tuple[str, ...],
        *,
        caller: ca.Caller,
        action: str,
        target: str,
        target_kind: str,
        params: dict[str, Any],
        call: Callable[[], dict[str, Any]],
    ) -> tuple[int, dict[str, Any]]:
        now = self.clock()
        for k, (at, _fut) in list(self._recent.items()):
            if now - at > REPEAT_WINDOW_S:
                del self._recent[k]
        found = self._recent.get(key)
        if found is not None:
            status, doc = await asyncio.shield(found[1])
            return status, {**doc, "repeat": True}
        fut: asyncio.Future[tuple[int, dict[str, Any]]] = asyncio.get_running_loop().create_future()
        self._recent[key] = (now, fut)
        level = logging.INFO
        try:
            doc = await asyncio.to_thread(call)
            answer = (200, doc)
        except InvalidInput as exc:
            answer = (400, {"error": str(exc), "field": exc.field, "done": False})
        except DueflowError as exc:
            answer = (503, {"error": f"{action} failed: {exc}", "done": False})
            level = logging.WARNING
        except Exception as exc:  # a bug: answered and logged, never a silent hang
            answer = (500, {"error": f"{action} failed: {exc!r}", "done": False})
            level = logging.ERROR
        fut.set_result(answer)
        status, doc = answer
        entry: dict[str, Any] = {
            "at_ms": wall_ms(),
            **caller.audit(),
            "action": action,
            "target_kind": target_kind,
            "target": target,
            "params": params,
            "result": action_result(status, doc),
            "status": status,
            "done": bool(doc.get("done")),
            "message": doc.get("message") or doc.get("error"),
        }
        self.done.appendleft(entry)
        event(log, "console.action", level, **entry)
        return answer


def unknown_job(job_id: str) -> web.Response:
    return json_response(
        {"error": "unknown job id: the status view has no outcome for it", "job_id": job_id},
        status=404,
    )


class JobPages:
    """The console's reads of jobs: a search, one job, its dead letter, its payload."""

    def __init__(self, source: ConsoleSource) -> None:
        self.source = source

    async def one_job(self, request: web.Request) -> web.Response:
        source = self.source
        job_id = request.match_info["job_id"]
        view = source.job(job_id)
        if view is None:
            return unknown_job(job_id)
        payloads = ca.payloads_allowed(caller(request), source.payloads_for())
        doc = job_page(view, payloads=payloads)
        doc["payloads_shown"] = payloads
        doc["now_ms"] = wall_ms()  # what the page says "in 42 s" against
        trace = view.get("trace_id")
        doc["trace_url"] = source.trace_url(str(trace)) if trace else None
        return json_response(doc)

    async def dead_letter(self, request: web.Request) -> web.Response:
        source = self.source
        job_id = request.match_info["job_id"]
        view = source.job(job_id)
        if view is None:
            return unknown_job(job_id)
        try:
            details = await source.dead_letter(view)
        except DueflowError as exc:
            return json_response({"error": f"reading the DLQ failed: {exc}"}, status=503)
        if details is None:
            return json_response(
                {"error": "no dead letter of this job in its queue's DLQ", "job_id": job_id},
                status=404,
            )
        payloads = ca.payloads_allowed(caller(request), source.payloads_for())
        return json_response(
            {
                "dead_letter": dead_letter_page(details, payloads=payloads),
                "payloads_shown": payloads,
            }
        )

    async def payload(self, request: web.Request) -> web.Response:
        source = self.source
        job_id = request.match_info["job_id"]
        view = source.job(job_id)
        if view is None:
            return unknown_job(job_id)
        if not ca.payloads_allowed(caller(request), source.payloads_for()):
            return json_response(
                {"error": "payloads are shown to operators (observability.status_payloads)"},
                status=403,
            )
        ops = source.operations()
        if ops is None:
            return json_response({"error": "this status view reads no payloads"}, status=501)
        try:
            found = await asyncio.to_thread(ops.pending_payload, view)
        except DueflowError as exc:
            return json_response({"error": f"reading the timer failed: {exc}"}, status=503)
        if found is None:
            return json_response(
                {
                    "error": "no timer or exec record of this job found (it ran, or its "
                    "record was deleted after it fired): a dead job's payload is in its "
                    "dead letter",
                    "job_id": job_id,
                },
                status=404,
            )
        found["payload"] = shown(found.get("payload"))
        return json_response(found)

    async def find_jobs(self, request: web.Request) -> web.Response:
        query = request.query
        try:
            flt = parse_filter(query)
            limit = parse_limit(query.get("limit"))
            raw_before = query.get("before")
            before = Cursor.parse(raw_before) if raw_before else None
        except InvalidInput as exc:
            return bad_input(exc)
        started = time.perf_counter()
        try:
            page = await self.source.find_jobs(flt, before=before, limit=limit)
        except SearchTooBroad as exc:
            return json_response({"error": str(exc), "filter": flt.to_json()}, status=422)
        return json_response(
            {
                "jobs": [listed(v) for v in page.views],
                "next": None if page.next is None else page.next.text(),
                "filter": flt.to_json(),
                "took_ms": round((time.perf_counter() - started) * 1000, 1),
            }
        )


def session_doc(session: ca.Session) -> dict[str, Any]:
    return {"role": session.role, "who": session.who, "csrf": session.csrf}


class SessionPages:
    """Console log in, log out and who am I; ``tls``: the view itself serves HTTPS (the
    session cookie is then always ``Secure``)."""

    def __init__(self, sessions: ca.Sessions | None, *, tls: bool) -> None:
        self.sessions = sessions
        self.tls = tls

    async def login(self, request: web.Request) -> web.Response:
        sessions = self.sessions
        if sessions is None:
            return json_response({"error": "this view has no console sessions"}, status=501)
        try:
            body = await json_body(request)
        except InvalidInput as exc:
            return bad_input(exc)
        token = body.get("token")
        if not isinstance(token, str) or not token:
            return json_response(
                {"error": "token: the operator or viewer token of this view", "field": "token"},
                status=400,
            )
        session = sessions.login(token, name=body.get("name"), remote=request.remote or "?")
        if session is None:
            event(log, "console.login_refused", logging.WARNING, remote=request.remote)
            return json_response({"error": "wrong token: it gives no role here"}, status=401)
        event(
            log,
            "console.login",
            who=session.who,
            role=session.role,
            credential=f"session {session.ref}",
            remote=request.remote,
        )
        resp = json_response(session_doc(session))
        scheme = acc.page_scheme(request.scheme, request.headers.get("X-Forwarded-Proto"))
        resp.set_cookie(
            ca.COOKIE,
            session.id,
            max_age=int(sessions.ttl_s),
            path="/",
            httponly=True,
            samesite="Strict",
            secure=self.tls or scheme == "https",
        )
        return resp

    async def logout(self, request: web.Request) -> web.Response:
        if self.sessions is not None:
            who = caller(request)
            if who.session is not None:
                event(log, "console.logout", **who.audit())
            self.sessions.logout(request.cookies.get(ca.COOKIE))
        resp = json_response({"logged_out": True})
        resp.del_cookie(ca.COOKIE, path="/")
        return resp

    async def whoami(self, request: web.Request) -> web.Response:
        who = caller(request)
        if who.session is not None:
            return json_response(session_doc(who.session))
        sessions = self.sessions
        return json_response(
            {
                "role": who.role,
                "who": who.who,
                "csrf": None,
                "login_required": sessions is not None and sessions.reads_need_login,
            },
            status=200 if who.role is not None else 401,
        )


Call = Callable[[ConsoleOperations, dict[str, Any], str], dict[str, Any]]
# an action on a named queue: (operations, queue, body, who)
QueueCall = Callable[[ConsoleOperations, str, dict[str, Any], str], dict[str, Any]]
# pausing or resuming one queue or schedule: (operations, body, who, paused)
PauseCall = Callable[[ConsoleOperations, dict[str, Any], str, bool], dict[str, Any]]


class ActionPages:
    """The console's actions, each run once per request through the view's
    operations (:class:`ActionDesk`), and ``GET /api/actions``."""

    def __init__(self, source: ConsoleSource) -> None:
        self.source = source
        self.desk = ActionDesk()

    async def act(
        self, request: web.Request, action: str, target: str, call: Call, *, target_kind: str
    ) -> web.Response:
        ops = self.source.operations()
        if ops is None:
            return json_response({"error": "this status view takes no actions"}, status=501)
        by = caller(request)
        raw = await request.read()
        try:
            body = await json_body(request)
        except InvalidInput as exc:
            return bad_input(exc)
        repeat = request.headers.get("Idempotency-Key") or hashlib.sha256(raw).hexdigest()
        status, doc = await self.desk.run(
            (by.who, action, target, repeat),
            caller=by,
            action=action,
            target=target,
            target_kind=target_kind,
            params=action_params(body),
            call=functools.partial(call, ops, body, by.who),
        )
        return json_response(doc, status=status)

    def known_queue(self, queue: str) -> web.Response | None:
        names = self.source.queue_names()
        if queue in names:
            return None
        return json_response({"error": "unknown queue", "queue": queue, "queues": names}, 404)

    async def job_action(self, request: web.Request) -> web.Response:
        job_id = request.match_info["job_id"]
        verb = request.match_info["verb"]
        view = self.source.job(job_id)
        if view is None:
            return unknown_job(job_id)
        queue = str(view["queue"])
        calls: dict[str, Call] = {
            "cancel": lambda ops, body, who: ops.cancel(job_id, body, who),
            "reschedule": lambda ops, body, who: ops.reschedule(job_id, body, who),
            "run-now": lambda ops, body, who: ops.run_now(job_id, body, who),
            "retry": lambda ops, body, who: ops.retry(job_id, body, who, queue),
        }
        call = calls.get(verb)
        if call is None:
            return json_response({"error": f"unknown action {verb!r}", "actions": list(calls)}, 404)
        return await self.act(request, verb, job_id, call, target_kind="job")

    async def redrive(self, request: web.Request) -> web.Response:
        return await self._dead_letter_action(
            request, "redrive", lambda ops, queue, body, who: ops.redrive(queue, body, who)
        )

    async def purge(self, request: web.Request) -> web.Response:
        return await self._dead_letter_action(
            request, "purge", lambda ops, queue, body, who: ops.purge(queue, body, who)
        )

    async def _dead_letter_action(
        self, request: web.Request, verb: str, call: QueueCall
    ) -> web.Response:
        """``verb`` on the dead letters of the path's queue, recorded as ``<verb>
        preview`` when the body asks for a ``dry_run``."""
        queue = request.match_info["queue"]
        try:
            preview = (await json_body(request)).get("dry_run") is True
        except InvalidInput as exc:
            return bad_input(exc)
        return self.known_queue(queue) or await self.act(
            request,
            f"{verb} preview" if preview else verb,
            queue,
            lambda ops, body, who: call(ops, queue, body, who),
            target_kind="queue",
        )

    async def queue_control(self, request: web.Request) -> web.Response:
        queue = request.match_info["queue"]
        return self.known_queue(queue) or await self._pause_action(
            request,
            "queue",
            queue,
            lambda ops, body, who, paused: ops.pause_queue(queue, body, who, paused),
        )

    async def schedule_control(self, request: web.Request) -> web.Response:
        schedule_id = request.match_info["schedule_id"]
        return await self._pause_action(
            request,
            "schedule",
            schedule_id,
            lambda ops, body, who, paused: ops.pause_schedule(schedule_id, body, who, paused),
        )

    async def _pause_action(
        self, request: web.Request, kind: str, target: str, call: PauseCall
    ) -> web.Response:
        """Pause or resume (the path's verb) the ``kind`` named ``target``, recorded as
        ``<verb> <kind>``."""
        verb = request.match_info["verb"]
        paused = verb == "pause"
        return await self.act(
            request,
            f"{verb} {kind}",
            target,
            lambda ops, body, who: call(ops, body, who, paused),
            target_kind=kind,
        )

    async def actions(self, _request: web.Request) -> web.Response:
        return json_response({"actions": list(self.desk.done)})


def add_console_routes(
    app: web.Application,
    source: ConsoleSource,
    sessions: ca.Sessions | None = None,
    *,
    tls: bool = False,
) -> None:
    """The console's routes on ``app`` (behind the app's access middleware); ``tls``:
    the view itself serves HTTPS (the session cookie is then always ``Secure``)."""
    jobs = JobPages(source)
    logins = SessionPages(sessions, tls=tls)
    acts = ActionPages(source)

    async def watch(_request: web.Request) -> web.Response:
        return json_response(await source.watch_doc())

    files = {name: page_file(name) for name in CONSOLE_FILES}

    async def console_file(request: web.Request) -> web.Response:
        name = "console.html" if request.path == "/console" else request.path.lstrip("/")
        body, ctype = files[name]
        return web.Response(body=body, content_type=ctype, charset="utf-8", headers=CONSOLE_HEADERS)

    app.router.add_get("/console", console_file)
    app.router.add_get("/console.js", console_file)
    app.router.add_get("/console.css", console_file)
    app.router.add_get("/api/watch", watch)

    app.router.add_get("/api/jobs", jobs.find_jobs)
    app.router.add_post(
        "/api/jobs/{job_id}/{verb:cancel|reschedule|run-now|retry}", acts.job_action
    )
    app.router.add_post("/api/dlq/{queue}/redrive", acts.redrive)
    app.router.add_post("/api/dlq/{queue}/purge", acts.purge)
    app.router.add_post("/api/queues/{queue}/{verb:pause|resume}", acts.queue_control)
    app.router.add_post("/api/schedules/{schedule_id}/{verb:pause|resume}", acts.schedule_control)
    app.router.add_get("/api/actions", acts.actions)
    app.router.add_get("/api/jobs/{job_id}", jobs.one_job)
    app.router.add_get("/api/jobs/{job_id}/dead-letter", jobs.dead_letter)
    app.router.add_get("/api/jobs/{job_id}/payload", jobs.payload)
    app.router.add_post("/api/login", logins.login)
    app.router.add_post("/api/logout", logins.logout)
    app.router.add_get("/api/session", logins.whoami)
