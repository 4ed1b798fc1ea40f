"""Cancel a cron schedule: stop it and cancel the occurrence already in the wheel.

``dueflow cancel --schedule ID`` pauses the schedule (``--delete``: deletes
it) so the emitter places no further occurrence and drops the pending one
when it comes due, and cancels that pending occurrence by its job id
(``<schedule_id>@<occurrence_ms>``, see ``dueflow.records.cron_occurrence``): a
command to its worker on a finalized queue, else the records below; so a
worker skips it even if the emitter fired it before it read the pause. Both
the occurrence's cancellation and, for the status view, an outcome
``cancelled`` are written as ``dueflow cancel JOB`` writes them.

The pending occurrence is read from the emitter's compacted cron state
topic (``<prefix>.emitter.cron``) *before* the schedule changes: once the
emitter has read the pause, the state says "nothing pending".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from confluent_kafka import Consumer

from dueflow.config import Settings
from dueflow.errors import InvalidInput
from dueflow.kafka.reading import Span, partitions_of, read_spans, watermarks
from dueflow.kafka.topics import names
from dueflow.producers.cancel import cancel_records
from dueflow.producers.scheduler import Scheduler
from dueflow.producers.steering_commands import command_records
from dueflow.records.cron_occurrence import CronState, occurrence_id
from dueflow.steering_model import Command


@dataclass(frozen=True, slots=True)
class CancelledSchedule:
    schedule_id: str
    queue: str
    action: str  # "paused" or "deleted"
    occurrence_job_id: str | None  # the pending occurrence cancelled, if one was pending
    occurrence_ms: int | None

    def to_json(self) -> dict[str, Any]:
        return {
            "schedule_id": self.schedule_id,
            "queue": self.queue,
            "action": self.action,
            "cancelled_occurrence": self.occurrence_job_id,
            "occurrence_ms": self.occurrence_ms,
        }


def read_cron_state(settings: Settings, consumer: Consumer, schedule_id: str) -> CronState | None:
    """What the wheel holds for ``schedule_id`` according to the emitter (None: nothing
    known)."""
    topic = names(settings).emitter_cron
    parts = partitions_of(consumer, topic)
    marks = watermarks(consumer, topic, parts)
    wanted = schedule_id.encode()
    found: list[CronState | None] = [None]

    def take(msg: Any) -> None:
        if msg.key() == wanted:
            found[0] = CronState.decode(msg.value())

    read_spans(consumer, [Span(topic, p, lo, hi) for p, (lo, hi) in marks.items()], take)
    return found[0]


def cancel_schedule(
    settings: Settings,
    scheduler: Scheduler,
    consumer: Consumer,
    schedule_id: str,
    *,
    delete: bool = False,
    now_ms: int,
) -> CancelledSchedule:
    """Pause (or delete) ``schedule_id`` and cancel its pending occurrence."""
    schedule = scheduler.get_schedule(schedule_id)
    if schedule is None:
        raise InvalidInput("schedule", schedule_id, "the id of an existing schedule")
    state = read_cron_state(settings, consumer, schedule_id)  # before the change
    if delete:
        scheduler.delete_schedule(schedule_id)
    elif not schedule.paused:
        scheduler.pause_schedule(schedule_id)
    pending = state.next_ms if state is not None else None
    job_id = None
    if pending is not None:
        job_id = occurrence_id(schedule_id, pending)
        spec = scheduler.queue_spec(schedule.queue)
        if scheduler.steerable(schedule.queue):  # a command, at any horizon
            cmd = Command(
                command_id=scheduler.planner.ids.new(now_ms),
                op="cancel",
                job_id=job_id,
                idempotency_key=job_id,
                queue=schedule.queue,
                at_ms=now_ms,
                known_due_ms=pending,
            )
            for rec in command_records(
                names(settings), cmd, partitions=spec.partitions, schedule_id=schedule_id
            ):
                scheduler.write_record(rec)
            return CancelledSchedule(
                schedule_id, schedule.queue, "deleted" if delete else "paused", job_id, pending
            )
        for rec in cancel_records(
            names=names(settings),
            job_id=job_id,
            queue=schedule.queue,
            idempotency_key=job_id,
            at_ms=now_ms,
            task=schedule.task,
            due_ms=pending,
            schedule_id=schedule_id,
            partitions=spec.partitions,
        ):
            scheduler.write_record(rec)
    return CancelledSchedule(
        schedule_id, schedule.queue, "deleted" if delete else "paused", job_id, pending
    )
