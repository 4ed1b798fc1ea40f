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

This module serves the console's files and puts the routes on the app; the
job pages and sessions are answered by :mod:`.console_pages`, the actions by
:mod:`.console_desk`.
"""

from __future__ import annotations

from importlib import resources

from aiohttp import web

from dueflow.streams.status import console_access as ca
from dueflow.streams.status.console_desk import ACTION_PARAMS as ACTION_PARAMS
from dueflow.streams.status.console_desk import ACTIONS_KEPT as ACTIONS_KEPT
from dueflow.streams.status.console_desk import REPEAT_WINDOW_S as REPEAT_WINDOW_S
from dueflow.streams.status.console_desk import ActionDesk as ActionDesk
from dueflow.streams.status.console_desk import ActionPages as ActionPages
from dueflow.streams.status.console_desk import Call as Call
from dueflow.streams.status.console_desk import PauseCall as PauseCall
from dueflow.streams.status.console_desk import QueueCall as QueueCall
from dueflow.streams.status.console_desk import action_params as action_params
from dueflow.streams.status.console_desk import action_result as action_result
from dueflow.streams.status.console_pages import LIST_HIDDEN as LIST_HIDDEN
from dueflow.streams.status.console_pages import ConsoleSource as ConsoleSource
from dueflow.streams.status.console_pages import JobPages as JobPages
from dueflow.streams.status.console_pages import SessionPages as SessionPages
from dueflow.streams.status.console_pages import bad_input as bad_input
from dueflow.streams.status.console_pages import caller as caller
from dueflow.streams.status.console_pages import json_body as json_body
from dueflow.streams.status.console_pages import json_response as json_response
from dueflow.streams.status.console_pages import listed as listed
from dueflow.streams.status.console_pages import log as log
from dueflow.streams.status.console_pages import session_doc as session_doc
from dueflow.streams.status.console_pages import unknown_job as unknown_job

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
