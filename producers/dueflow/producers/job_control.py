"""Steering pending jobs from the scheduling client: :class:`JobControl`.

``cancel``, ``reschedule`` and ``update`` of one job, and ``group`` (fan-in):
on a finalized queue, commands to the worker that owns the job
(:mod:`dueflow.producers.steer_calls`); on one that is not, the records of the
release before (:mod:`dueflow.producers.steering_records`).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from dueflow.errors import DueflowError, InvalidInput
from dueflow.producers.cancel import OutgoingRecord
from dueflow.producers.core import PlannedTimer, delivery_error
from dueflow.producers.fan_in_commands import GroupScheduled, plan_group
from dueflow.producers.rescheduling import refusal
from dueflow.producers.results import Cancelled, Rescheduled, Scheduled, Updated
from dueflow.producers.scheduler_base import Delivery, SchedulerBase
from dueflow.producers.steer_calls import SteerCalls
from dueflow.producers.steering_records import Lifecycle
from dueflow.producers.targets import Target
from dueflow.records.command import TIMER_HEADROOM
from dueflow.records.job_request import (
    Duration,
    Instant,
    JobRequest,
    as_request,
    check_name,
    due_of,
    encode_payload,
)


class JobControl(SchedulerBase):
    """Cancel, reschedule, update and group jobs (part of :class:`~dueflow.Scheduler`)."""

    # ------------------------------------------------------------ cancel
    def cancel(
        self,
        job_id: str,
        *,
        queue: str | None = None,
        idempotency_key: str | None = None,
        wait: float | None = None,
    ) -> Cancelled:
        """Cancel ``job_id``: workers skip it if it has not run yet, and its retries.

        The job is looked up first (:meth:`status`): the cancellation goes to the
        queue and key its outcomes name, and the result says whether it was found
        and what state it was in. A job that has finished (succeeded, dead,
        cancelled, ...) is not cancelled again (``cancelled`` False). Refused with
        :class:`InvalidInput`: a ``queue`` the job is not known in, a job id known
        in more than one queue without ``queue``, a job not found without
        ``queue`` (then ``queue=`` writes the cancellation there anyway: ``found``
        False). Returns once the records are acknowledged.

        On a queue that was finalized (``dueflow queue finalize``) the
        cancellation is a command to the worker that owns the job's partition, at
        any horizon; ``wait=`` seconds waits for its verdict. On one that was
        not, it is the record of the release before, kept for the queue's
        idempotency retention: a job due later than that is refused
        (:class:`InvalidInput`: finalize the queue).
        """
        target = self._find_target(
            job_id, queue=queue, idempotency_key=idempotency_key, verb="cancel"
        )
        if self._steerable(target.queue):
            return self._steer_calls().cancel(target, wait=_wait_s(wait))
        records, cancelled = self._lifecycle().cancel_plan(target)
        partition = self._write_all(records, f"cancelling job {job_id!r}")
        return cancelled._replace(partition=partition) if records else cancelled

    def cancel_plan(
        self, job_id: str, *, queue: str | None = None, idempotency_key: str | None = None
    ) -> tuple[list[OutgoingRecord], Cancelled]:
        """The records that cancel ``job_id`` (none when it has finished) and the
        result (partition not known yet); looks the job up (blocking)."""
        target = self._find_target(
            job_id, queue=queue, idempotency_key=idempotency_key, verb="cancel"
        )
        return self._lifecycle().cancel_plan(target)

    # ------------------------------------------------------------ reschedule
    def reschedule(
        self,
        job_id: str,
        *,
        run_at: Instant | None = None,
        delay: Duration | None = None,
        queue: str | None = None,
        wait: float | None = None,
    ) -> Rescheduled:
        """Move pending job ``job_id`` to ``run_at`` (or ``delay`` from now): it runs
        then, never at its old time, never twice. A time in the past runs it at once.

        The job is looked up by its outcomes (as :meth:`status`; ``queue`` as for
        :meth:`cancel`). A job that has started or finished, a cron occurrence, or
        one that is not found is not rescheduled: ``rescheduled`` is False and
        ``reason`` says why. Raises :class:`InvalidInput` for a bad time or a
        wrong or ambiguous queue.

        On a finalized queue (``dueflow queue finalize``) the move is a command
        to the worker that owns the job's partition, at any horizon: a move
        later needs nothing else; a move earlier reads the job's value from its
        timer first; ``wait=`` seconds waits for the worker's verdict. On a queue
        not finalized, a new timer and a reschedule record of the release before
        are written (:mod:`dueflow.records.reschedule`), and a job due beyond the
        queue's idempotency retention from now is refused.
        """
        due_ms = due_of(run_at, delay, now_ms=self.clock(), required=True)
        target = self._find_target(job_id, queue=queue, idempotency_key=None, verb="reschedule")
        if self._steerable(target.queue):
            why = refusal(target, due_ms)
            result = self._steer_calls().reschedule(target, due_ms, wait=_wait_s(wait), refusal=why)
            if result.rescheduled:
                self.planner.recent.move(job_id, due_ms, -1)
            return result
        move = self._lifecycle().reschedule_plan(target, due_ms)
        if move.timer is None:
            return move.result
        timer = move.timer
        delivery = Delivery()
        topic = self.planner.topic
        self._produce(topic, timer.value, timer.key, timer.partition, timer.headers, delivery)
        self._wait(delivery)
        if delivery.error is not None:
            raise delivery_error(f"rescheduling job {job_id!r} ({topic})", delivery.error)
        self._write_all(move.records, f"rescheduling job {job_id!r}")
        self.planner.recent.move(job_id, due_ms, timer.partition)
        return move.result

    # ------------------------------------------------------------ update
    def update(
        self,
        job_id: str,
        *,
        payload: Any,
        run_at: Instant | None = None,
        delay: Duration | None = None,
        queue: str | None = None,
        wait: float | None = None,
    ) -> Updated:
        """Replace the payload of pending one-shot job ``job_id`` (and, with
        ``run_at``/``delay``, move it later too): it runs with the new payload.

        Only on a finalized queue (``dueflow queue finalize``): a command to the
        worker that owns the job's partition, at any horizon; ``wait=`` seconds
        waits for its verdict. ``payload`` is encoded as for :meth:`schedule`
        (bytes as they are, anything else as JSON). A job that has started or
        finished, a cron occurrence, or one that is not found is not updated:
        ``updated`` is False and ``reason`` says why. Raises
        :class:`InvalidInput` for a bad payload or time, a wrong or ambiguous
        queue, or a queue that is not finalized.
        """
        raw, content_type = encode_payload(payload)
        limit = self.planner.max_record_bytes - TIMER_HEADROOM
        if len(raw) > limit:
            raise InvalidInput(
                "payload",
                f"{len(raw)} bytes",
                f"at most {limit} bytes (the timer topic's record limit, less room for the "
                "job's other fields)",
            )
        due_ms = None
        if run_at is not None or delay is not None:
            due_ms = due_of(run_at, delay, now_ms=self.clock(), required=True)
        target = self._find_target(job_id, queue=queue, idempotency_key=None, verb="update")
        if not self._steerable(target.queue):
            raise InvalidInput(
                "queue",
                target.queue,
                "a finalized queue: updating a job's payload is a command its workers "
                f"apply (`dueflow queue finalize {target.queue}` once they all run this release)",
            )
        return self._steer_calls().update(
            target, payload=raw, content_type=content_type, due_ms=due_ms, wait=_wait_s(wait)
        )

    # ------------------------------------------------------------ fan-in
    def group(
        self,
        members: Iterable[JobRequest | Mapping[str, Any]],
        *,
        then: JobRequest | Mapping[str, Any],
        group_id: str | None = None,
    ) -> GroupScheduled:
        """Schedule ``members`` as a group whose callback ``then`` runs once, when
        every member has ended (succeeded, dead, cancelled or expired); its handler
        reads how each ended in ``ctx.group``.

        Members and the callback are jobs as :meth:`schedule_many` takes them
        (a :class:`JobRequest` or a mapping of its fields); members may be in any
        queue. The group is kept by the worker that owns partition
        murmur2(``group_id``) of the callback's queue (default id: a new one).
        Every queue involved must be finalized (``dueflow queue finalize``).
        Returns once the broker has the group's commands. Raises
        :class:`InvalidInput` (nothing written) for a bad job, a repeated job id,
        more than 5,000 members or a queue that is not finalized.
        """
        planner, now_ms = self.planner, self.clock()
        reqs = [as_request(m) for m in members]
        then_req = as_request(then)
        for r in [*reqs, then_req]:
            if r.expires is not None or r.max_lateness is not None:
                field = "expires" if r.expires is not None else "max_lateness"
                raise InvalidInput(
                    field,
                    r.expires if r.expires is not None else r.max_lateness,
                    "none on a group's jobs: their timers are written by the group's "
                    "owner from the jobs' values, which do not carry a deadline",
                )
        named = [r.job_id for r in [*reqs, then_req] if r.job_id is not None]
        if len(set(named)) != len(named):
            twice = next(i for i in named if named.count(i) > 1)
            raise InvalidInput("members", twice, "jobs with distinct job ids")
        planned: list[PlannedTimer] = []
        try:
            for req in [*reqs, then_req]:
                plan = planner.plan(req, now_ms=now_ms)
                if isinstance(plan, Scheduled):
                    raise InvalidInput("job_id", plan.job_id, "a job not scheduled before")
                planned.append(plan)
            for plan in planned:
                if not self._steerable(plan.job.queue):
                    raise InvalidInput(
                        "queue",
                        plan.job.queue,
                        "a finalized queue: a group's jobs are commands its workers apply "
                        f"(`dueflow queue finalize {plan.job.queue}`)",
                    )
            gid = planner.ids.new(now_ms) if group_id is None else group_id
            check_name("group_id", gid)
            then_plan = planned[-1]
            group = plan_group(
                self.names,
                group_id=gid,
                members=[(p.job.job_id, p.record.value) for p in planned[:-1]],
                then=(then_plan.job.job_id, then_plan.job.queue, then_plan.record.value),
                partitions=self.queue_spec(then_plan.job.queue).partitions,
                now_ms=now_ms,
                new_id=planner.ids.new,
            )
            # In order: the owner applies them in offset order.
            self._write_all([group.open], f"opening group {gid!r}")
            self._write_all(list(group.adds), f"adding the members of group {gid!r}")
            self._write_all([group.seal], f"sealing group {gid!r}")
        except BaseException:
            for plan in planned:
                planner.failed(plan)
            raise
        return group.result

    def steerable(self, queue: str) -> bool:
        """Whether ``queue``'s jobs are steered with commands: it was finalized
        (``dueflow queue finalize``), so cancel, reschedule and update work at any
        horizon (reads the control topic; a yes is kept)."""
        return self._steerable(queue)

    def _steer_calls(self) -> SteerCalls:
        """cancel/reschedule/update by command (:mod:`dueflow.producers.steer_calls`)."""
        if self._verdicts is None:
            raise DueflowError("the scheduler is not started: use start() or `with`")
        recent = self.planner.recent

        def partition_of(job_id: str) -> int | None:
            found = recent.get(job_id)
            return found.partition if found is not None and found.partition >= 0 else None

        return SteerCalls(
            self,
            verdicts=self._verdicts,
            timers=self.timers,
            new_id=self.planner.ids.new,
            recent_partition=partition_of,
        )

    def _lifecycle(self) -> Lifecycle:
        """Plans cancels and reschedules (:mod:`dueflow.producers.steering_records`)."""
        return Lifecycle(
            self.settings,
            planner=self.planner,
            lookup=self.lookup,
            timers=self.timers,
            clock=self.clock,
            queue_spec=self.queue_spec,
        )

    def _find_target(
        self,
        job_id: str,
        *,
        queue: str | None,
        idempotency_key: str | None,
        verb: str,
    ) -> Target:
        """The job a cancel or reschedule of ``job_id`` means (see
        :mod:`dueflow.producers.targets`): looked up by its outcomes, else what this
        client scheduled, else ``queue``."""
        self._read_own_writes()
        return self._lifecycle().target(
            job_id, queue=queue, idempotency_key=idempotency_key, verb=verb
        )


def _wait_s(wait: float | None) -> float | None:
    """``wait=``: None, or a number of seconds >= 0 (:class:`InvalidInput` otherwise)."""
    if wait is None:
        return None
    if isinstance(wait, bool) or not isinstance(wait, int | float) or not 0 <= wait <= 3_600:
        raise InvalidInput("wait", wait, "seconds to wait for the worker's verdict, 0 to 3600")
    return float(wait)
