"""``cancel``, ``reschedule`` and ``update`` of a job on a finalized queue: by command.

The scheduling client looks the job up (:mod:`dueflow.producers.targets`),
refuses what it can see cannot work (finished, started, a cron occurrence for
a move), writes one command (:mod:`dueflow.producers.steering_commands`) and returns
once the broker has it; with ``wait=`` it also waits for the verdict of the
worker that owns the job's partition (:mod:`dueflow.producers.verdicts`). There
is no horizon: a job due in 2126 is cancelled, moved or updated like one due
in a minute, and the worker keeps what it needs until the job's timers have
fired.

A move to a time at or after the job's current due time is lazy (the worker
writes the job again when its timer fires); a move earlier reads the job's
value from its timer first (:mod:`dueflow.producers.timer_finder`) and sends it
whole (``replace``). When a lazy move is refused because the job's due time
is later than this client knew (``needs_value``: someone moved it meanwhile)
and the call waits, it is sent again as a ``replace``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any, Protocol

from dueflow import headers as hdr
from dueflow.config import QueueSpec
from dueflow.errors import UndecodableRecord
from dueflow.kafka.topics import TopicNames
from dueflow.producers.cancel import OutgoingRecord
from dueflow.producers.results import Cancelled, Rescheduled, Updated
from dueflow.producers.steering_commands import Verdict, command_records
from dueflow.producers.targets import Target
from dueflow.producers.timer_finder import TimerFinder, WantedTimer
from dueflow.producers.verdicts import Mark, Verdicts
from dueflow.records import codec
from dueflow.records.worker_codec import decode_job
from dueflow.rules import steering as rule
from dueflow.rules.job_state import FINAL_STATES
from dueflow.rules.job_status import PENDING_STATES
from dueflow.steering_model import Command
from dueflow.timeutil import format_utc


class Client(Protocol):
    """What the calls need of a :class:`~dueflow.producers.scheduler.Scheduler`."""

    names: TopicNames
    clock: Callable[[], int]

    def queue_spec(self, name: str) -> QueueSpec: ...

    def _write_all(self, records: list[OutgoingRecord], what: str) -> int: ...


class SteerCalls:
    """The command path of one client's ``cancel``, ``reschedule`` and ``update``."""

    def __init__(
        self,
        client: Client,
        *,
        verdicts: Verdicts,
        timers: TimerFinder,
        new_id: Callable[[int], str],
        recent_partition: Callable[[str], int | None],
    ) -> None:
        self._client = client
        self._verdicts = verdicts
        self._timers = timers
        self._new_id = new_id
        self._recent_partition = recent_partition

    # ------------------------------------------------------------------ sending
    def _send(
        self,
        cmd: Command,
        target: Target,
        wait: float | None,
        what: str,
        headers: Sequence[tuple[str, bytes]] = (),
    ) -> tuple[int, Verdict | None, str | None]:
        """Write ``cmd`` (with ``headers`` added); ``(partition, verdict, why there is
        none)``."""
        c = self._client
        records = command_records(
            c.names,
            cmd,
            partitions=c.queue_spec(target.queue).partitions,
            schedule_id=target.schedule_id,
            partition=target.partition,
            headers=headers,
        )
        mark: Mark | None = self._verdicts.mark(target.job_id) if wait is not None else None
        partition = c._write_all(records, f"{what} job {target.job_id!r}")
        if mark is None or wait is None:
            return partition, None, None
        verdict = self._verdicts.wait(mark, cmd.command_id, wait)
        if verdict is None:
            return (
                partition,
                None,
                (
                    f"no verdict within {wait:g} s: the worker of partition {partition} is down "
                    "or behind; the command stays and is applied when it gets there"
                ),
            )
        return partition, verdict, None

    def _command(self, op: str, target: Target, **fields: Any) -> Command:
        at_ms = self._client.clock()
        return Command(
            command_id=self._new_id(at_ms),
            op=op,
            job_id=target.job_id,
            idempotency_key=target.idempotency_key,
            queue=target.queue,
            at_ms=at_ms,
            known_due_ms=target.due_ms,
            **fields,
        )

    # ------------------------------------------------------------------ cancel
    def cancel(self, target: Target, *, wait: float | None) -> Cancelled:
        result = Cancelled(
            target.job_id,
            target.queue,
            target.idempotency_key,
            -1,
            self._client.clock(),
            target.known,
            found=target.found,
            state=target.state,
        )
        if target.state in FINAL_STATES:
            return result._replace(cancelled=False)
        cmd = self._command("cancel", target)
        partition, verdict, why = self._send(cmd, target, wait, "cancelling")
        result = result._replace(partition=partition, command_id=cmd.command_id, reason=why)
        if verdict is None:
            return result
        if verdict.applied:
            return result._replace(verdict=verdict.state)
        return result._replace(cancelled=False, verdict="refused", reason=verdict.reason)

    # ------------------------------------------------------------------ reschedule
    def reschedule(
        self, target: Target, due_ms: int, *, wait: float | None, refusal: str | None
    ) -> Rescheduled:
        result = Rescheduled(
            target.job_id,
            target.queue,
            target.idempotency_key,
            target.due_ms,
            due_ms,
            False,
            target.found,
            target.state,
        )
        if refusal is not None:
            return result._replace(reason=refusal)
        carried: Sequence[tuple[str, bytes]] = ()
        if target.due_ms is None or due_ms >= target.due_ms:
            cmd = self._command("move", target, due_ms=due_ms)
        else:
            found = self._replacement(target, due_ms)
            if isinstance(found, str):
                return result._replace(reason=found)
            cmd, carried = found
        partition, verdict, why = self._send(cmd, target, wait, "rescheduling", carried)
        if (
            verdict is not None
            and verdict.code == rule.NEEDS_VALUE
            and cmd.op == "move"
            and wait is not None
        ):
            found = self._replacement(target, due_ms)
            if isinstance(found, str):
                return result._replace(reason=f"{verdict.reason}; {found}")
            cmd, carried = found
            partition, verdict, why = self._send(cmd, target, wait, "rescheduling", carried)
        result = result._replace(
            rescheduled=True, partition=partition, command_id=cmd.command_id, reason=why
        )
        if verdict is None:
            return result
        if verdict.applied:
            return result._replace(verdict=verdict.state)
        return result._replace(rescheduled=False, verdict="refused", reason=verdict.reason)

    def _replacement(
        self, target: Target, due_ms: int
    ) -> tuple[Command, list[tuple[str, bytes]]] | str:
        """A ``replace`` of ``target`` due at ``due_ms``, with the value of its timer,
        and the headers its record carries (the timer's ``df-unique``: the owner keeps
        it on the new timer, so the job's end releases its unique key); or why there
        is none."""
        assert target.due_ms is not None
        wanted = WantedTimer(
            job_id=target.job_id,
            key=target.idempotency_key,
            queue=target.queue,
            due_ms=target.due_ms,
            hint=self._recent_partition(target.job_id),
        )
        found = self._timers.find(wanted, now_ms=self._client.clock())
        if found is None:
            return (
                "moving it earlier needs its value, and its timer is not in the wheel nor "
                "waiting in its exec partition: it has fired and a worker has taken it (or it ran)"
            )
        try:
            job = decode_job(found.value, hdr.header(found.headers, hdr.SCHEMA))
        except UndecodableRecord as exc:
            return f"its timer record does not hold a job: {exc}"
        value = codec.encode("job", replace(job, due_ms=due_ms).to_record(), version=1)
        unique = hdr.header(found.headers, hdr.UNIQUE)
        cmd = self._command("replace", target, due_ms=due_ms, job=value, job_schema="dueflow.Job/1")
        return cmd, [] if unique is None else [(hdr.UNIQUE, unique)]

    # ------------------------------------------------------------------ update
    def update(
        self,
        target: Target,
        *,
        payload: bytes,
        content_type: str,
        due_ms: int | None,
        wait: float | None,
    ) -> Updated:
        result = Updated(
            target.job_id,
            target.queue,
            target.idempotency_key,
            False,
            target.found,
            target.state,
            due_ms=due_ms,
        )
        why = _update_refusal(target, due_ms)
        if why is not None:
            return result._replace(reason=why)
        cmd = self._command(
            "patch", target, payload=payload, content_type=content_type, due_ms=due_ms
        )
        partition, verdict, no_verdict = self._send(cmd, target, wait, "updating")
        result = result._replace(
            updated=True, partition=partition, command_id=cmd.command_id, reason=no_verdict
        )
        if verdict is None:
            return result
        if verdict.applied:
            return result._replace(verdict=verdict.state)
        return result._replace(updated=False, verdict="refused", reason=verdict.reason)


def _update_refusal(target: Target, due_ms: int | None) -> str | None:
    """Why ``target`` cannot be updated (None: it can, as far as this client sees)."""
    if not target.found:
        return "not found: no outcome of it, and this client did not schedule it"
    if target.schedule_id is not None:
        return (
            f"a cron occurrence of schedule {target.schedule_id!r}: change the schedule "
            "(update_schedule) instead"
        )
    state = target.state
    if state is not None and state not in PENDING_STATES:
        if state == "retrying":
            return "it has started (an attempt failed; its retry is due): only a pending job"
        return f"it has {state} already"
    if due_ms is not None and target.due_ms is not None and due_ms < target.due_ms:
        return (
            f"{format_utc(due_ms)} is before its due time {format_utc(target.due_ms)}: "
            "update the payload, then reschedule it earlier"
        )
    return None
