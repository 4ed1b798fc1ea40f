"""Steering a job by its id: what ``cancel`` and ``reschedule`` write, found how.

:class:`Lifecycle` looks a job up (its outcomes, else what this client
scheduled: :mod:`dueflow.producers.targets`), decides, and plans the records;
it writes nothing. The scheduling clients produce what it returns, in the
order given (for a reschedule: the new timer first, then the records; see
:mod:`dueflow.records.reschedule`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

from dueflow.config import QueueSpec, Settings
from dueflow.errors import InvalidInput, UndecodableRecord
from dueflow.kafka.topics import HOUR_MS, names
from dueflow.observability import tracing
from dueflow.producers.cancel import OutgoingRecord, cancel_records
from dueflow.producers.core import TimerPlanner
from dueflow.producers.lookup import JobLookup
from dueflow.producers.rescheduling import moved_timer, refusal, reschedule_records
from dueflow.producers.results import Cancelled, Rescheduled
from dueflow.producers.targets import Target, beyond_retention, resolve_target
from dueflow.producers.timer_finder import TimerFinder, WantedTimer
from dueflow.records.job_request import check_name
from dueflow.records.timer_record import TimerRecord
from dueflow.rules.job_state import FINAL_STATES
from dueflow.timeutil import format_utc


class Move(NamedTuple):
    """A planned reschedule: the new timer (None: nothing to write), then the records."""

    timer: TimerRecord | None
    records: list[OutgoingRecord]
    result: Rescheduled


class Lifecycle:
    """Plans cancels and reschedules of jobs by id (lookups are blocking I/O)."""

    def __init__(
        self,
        settings: Settings,
        *,
        planner: TimerPlanner,
        lookup: JobLookup,
        timers: TimerFinder,
        clock: Callable[[], int],
        queue_spec: Callable[[str], QueueSpec] | None = None,
    ) -> None:
        self.settings = settings
        # A queue's spec (partitions, retention): static or registered.
        self.queue_spec = queue_spec or settings.queue
        self.names = names(settings)
        self.planner = planner
        self.lookup = lookup
        self.timers = timers
        self.clock = clock

    def target(
        self, job_id: str, *, queue: str | None, idempotency_key: str | None, verb: str
    ) -> Target:
        """The job a ``verb`` of ``job_id`` means: looked up by its outcomes, else what
        this client scheduled, else ``queue``."""
        check_name("job_id", job_id)
        if idempotency_key is not None:
            check_name("idempotency_key", idempotency_key)
        queues = set(self.planner.rules.queues)
        if queue is not None:
            self.planner.check_queue(queue)  # UnknownQueue, saying how to create it
            queues.add(queue)
        return resolve_target(
            job_id,
            queue=queue,
            idempotency_key=idempotency_key,
            status=self.lookup.status(job_id),
            recent=self.planner.recent.get(job_id),
            queues=queues,
            verb=verb,
        )

    def cancel_plan(self, target: Target) -> tuple[list[OutgoingRecord], Cancelled]:
        """The records that cancel ``target`` (none when it has finished) and the result
        (partition not known yet)."""
        at_ms = self.clock()
        result = Cancelled(
            target.job_id,
            target.queue,
            target.idempotency_key,
            -1,
            at_ms,
            target.known,
            found=target.found,
            state=target.state,
        )
        if target.state in FINAL_STATES:
            return [], result._replace(cancelled=False)
        self.check_retention(target, target.due_ms, at_ms)
        records = cancel_records(
            names=self.names,
            job_id=target.job_id,
            queue=target.queue,
            idempotency_key=target.idempotency_key,
            at_ms=at_ms,
            task=target.task,
            due_ms=target.due_ms,
            content_hash=target.content_hash,
            schedule_id=target.schedule_id,
            partitions=self.queue_spec(target.queue).partitions,
        )
        return records, result

    def reschedule_plan(self, target: Target, due_ms: int) -> Move:
        """What moves ``target`` to ``due_ms``: its timer again, due then, and the
        reschedule record; or, not rescheduled, the reason (reads the wheel)."""
        now_ms = self.clock()
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
        why = refusal(target, due_ms)
        if why is None and target.due_ms is None:
            why = "its due time is not known (no scheduled outcome of it)"
        if why is not None or target.due_ms is None:
            return Move(None, [], result._replace(reason=why))
        self.check_retention(target, target.due_ms, now_ms)
        recent = self.planner.recent.get(target.job_id)
        wanted = WantedTimer(
            job_id=target.job_id,
            key=target.idempotency_key,
            queue=target.queue,
            due_ms=target.due_ms,
            hint=recent.partition if recent is not None and recent.partition >= 0 else None,
        )
        found = self.timers.find(wanted, now_ms=now_ms)
        if found is None:
            why = (
                "its timer is not in the wheel nor waiting in its exec partition: it has "
                "fired and a worker has taken it (or it ran)"
            )
            return Move(None, [], result._replace(reason=why))
        try:
            timer = moved_timer(
                found.value,
                found.headers,
                due_ms=due_ms,
                now_ms=self.clock(),
                placer=self.planner.placer,
                schema_id=self.planner.ensure_schema_id(),  # the registry option
            )
        except UndecodableRecord as exc:
            why = f"its timer record does not hold a job: {exc}"
            return Move(None, [], result._replace(reason=why))
        records = reschedule_records(
            self.names,
            target,
            due_ms=due_ms,
            at_ms=self.clock(),
            partitions=self.queue_spec(target.queue).partitions,
            trace_id=tracing.trace_id_of(timer.headers),
        )
        return Move(timer, records, result._replace(rescheduled=True, partition=timer.partition))

    def check_retention(self, target: Target, due_ms: int | None, now_ms: int) -> None:
        """Refuse a record workers would forget before the delivery it is about."""
        if due_ms is None:
            return
        spec = self.queue_spec(target.queue)
        if beyond_retention(
            due_ms, now_ms=now_ms, retention_ms=spec.idempotency_retention_ms, margin_ms=HOUR_MS
        ):
            days = spec.idempotency_retention_ms / 86_400_000
            raise InvalidInput(
                "job_id",
                target.job_id,
                f"a job due within queue {target.queue!r}'s idempotency retention ({days:g} "
                f"days, less an hour) from now; this one is due at {format_utc(due_ms)}, and "
                "workers would forget the record before then (raise "
                f"queues.{target.queue}.idempotency_retention_ms, or do it closer to its due "
                "time)",
            )
