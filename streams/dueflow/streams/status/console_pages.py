"""The console's read pages and its sessions: a job search, one job, its dead
letter and its pending payload (:class:`JobPages`); log in, log out and who am I
(:class:`SessionPages`); and the request and answer helpers every console route
shares (the caller, the JSON body, JSON answers).
"""

from __future__ import annotations

import asyncio
import logging
import time
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


def unknown_job(job_id: str) -> web.Response:
    return json_response(
        {"error": "unknown job id: the status view has no outcome for it", "job_id": job_id},
        status=404,
    )


class JobPages:
    """The console's reads of jobs: a search, one job, its dead letter, its payload."""

    def __init__(self, source: ConsoleSource) -> None:
        self.source = source

    def _job(self, request: web.Request) -> tuple[str, dict[str, Any] | None]:
        """The job id the path names, and its view (None: the status view has none)."""
        job_id = request.match_info["job_id"]
        return job_id, self.source.job(job_id)

    async def one_job(self, request: web.Request) -> web.Response:
        source = self.source
        job_id, view = self._job(request)
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
        job_id, view = self._job(request)
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
        job_id, view = self._job(request)
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
