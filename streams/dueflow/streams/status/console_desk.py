"""The console's actions: each runs once per request through the view's operator
tools on a thread, is logged once and kept for ``GET /api/actions``
(:class:`ActionDesk`); :class:`ActionPages` answers the action routes.
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
from typing import Any

from aiohttp import web

from dueflow.errors import DueflowError, InvalidInput
from dueflow.observability.logs import event
from dueflow.streams.status import console_access as ca
from dueflow.streams.status.console_pages import (
    ConsoleSource,
    bad_input,
    caller,
    json_body,
    json_response,
    unknown_job,
)
from dueflow.streams.status.operator_tools import ConsoleOperations
from dueflow.wall_clock import wall_ms

log = logging.getLogger("dueflow.console")

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
