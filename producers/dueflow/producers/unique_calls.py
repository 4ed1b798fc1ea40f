"""``schedule(unique_key=...)``: a job admitted by the owner of its unique key.

On a finalized queue (``dueflow queue finalize``), a job with a unique key is
not written as a timer by the client: the client appends an ``admit`` command
(the whole job and the key's options, :mod:`dueflow.records.command`) to the
exec partition the unique key hashes to, and waits for the verdict of the
worker that owns it (:mod:`dueflow.rules.unique`): admitted (its
``scheduled`` outcome), or a duplicate (``deduplicated``, naming the job that
holds the key). Every contender for a key is judged by that one worker, in
the order the broker appended them, exactly once through any failover.

:func:`unique_options` checks the options (pure); :class:`UniqueCalls` writes
the command and reads the verdict (:mod:`dueflow.producers.verdicts`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from dueflow import headers as hdr
from dueflow.config import QueueSpec
from dueflow.errors import DueflowError, DuplicateJob, InvalidInput
from dueflow.kafka.topics import TopicNames
from dueflow.producers.cancel import OutgoingRecord
from dueflow.producers.core import PlannedTimer
from dueflow.producers.results import Scheduled
from dueflow.producers.verdicts import Verdicts
from dueflow.records.command import (
    MAX_UNIQUE_WINDOW_MS,
    check_command,
    command_headers,
    command_key,
    encode_command,
)
from dueflow.records.job_request import Duration, check_name
from dueflow.rules.partitioning import partition_for_key
from dueflow.rules.unique import ON_DUPLICATE, UNTIL, UniqueSpec
from dueflow.steering_model import Command
from dueflow.timeutil import parse_duration

# How long schedule() waits for the owner's verdict by default (admission_wait=).
DEFAULT_ADMISSION_WAIT_S = 30.0


@dataclass(frozen=True, slots=True)
class UniqueOptions:
    """The unique key's options, and the delay a debounce gives the job."""

    spec: UniqueSpec
    delay_ms: int | None  # debounce without run_at/delay: the job is due this long after


def unique_options(
    *,
    unique_key: object,
    unique_for: Duration | None,
    unique_until: object,
    on_duplicate: object,
    debounce: Duration | None,
    timed: bool,
) -> UniqueOptions | None:
    """The options of ``schedule(unique_key=..., ...)`` (None: no unique key, and none
    of the other options); ``timed``: the call gives ``run_at`` or ``delay``.
    :class:`InvalidInput` names the field that is not accepted."""
    if unique_key is None:
        for name, value in (
            ("unique_for", unique_for),
            ("unique_until", unique_until),
            ("on_duplicate", on_duplicate),
            ("debounce", debounce),
        ):
            if value is not None:
                raise InvalidInput(name, value, "only with unique_key= (the key it applies to)")
        return None
    key = check_name("unique_key", unique_key)
    if unique_until is not None and unique_until not in UNTIL:
        raise InvalidInput("unique_until", unique_until, f"one of {list(UNTIL)}, or None")
    if on_duplicate is not None and on_duplicate not in ON_DUPLICATE:
        raise InvalidInput("on_duplicate", on_duplicate, f"one of {list(ON_DUPLICATE)}, or None")
    window_ms = None
    if unique_for is not None:
        window_ms = _window("unique_for", unique_for)
        if unique_until is not None:
            raise InvalidInput(
                "unique_until",
                unique_until,
                "None with unique_for= (a window holds the key for its whole length, "
                "whatever the job does); without unique_for, 'end' or 'start'",
            )
    if debounce is None:
        return UniqueOptions(
            UniqueSpec(
                key=key,
                window_ms=window_ms,
                until=str(unique_until or "end"),
                on_duplicate=str(on_duplicate or "return"),
            ),
            None,
        )
    delay_ms = _window("debounce", debounce)
    if on_duplicate not in (None, "replace"):
        raise InvalidInput(
            "on_duplicate", on_duplicate, "'replace' or None with debounce= (it replaces)"
        )
    if unique_until not in (None, "start"):
        raise InvalidInput(
            "unique_until",
            unique_until,
            "'start' or None with debounce= (a write replaces the job until it starts)",
        )
    return UniqueOptions(
        UniqueSpec(
            key=key,
            window_ms=window_ms,
            until="start",
            on_duplicate="replace",
            extend=True,
        ),
        None if timed else delay_ms,
    )


def _window(name: str, value: Duration) -> int:
    ms = parse_duration(value, field=name)
    if not 0 < ms <= MAX_UNIQUE_WINDOW_MS:
        raise InvalidInput(name, value, "a duration from 1 ms to 366 days")
    return ms


class Client(Protocol):
    """What the calls need of a :class:`~dueflow.producers.scheduler.Scheduler`."""

    names: TopicNames
    clock: Callable[[], int]

    def queue_spec(self, name: str) -> QueueSpec: ...

    def _write_all(self, records: list[OutgoingRecord], what: str) -> int: ...


def admit_record(names: TopicNames, cmd: Command, *, partitions: int) -> OutgoingRecord:
    """The ``admit`` command's record: on the exec partition of its unique key, keyed
    by the unique key followed by ``\\x00cmd``."""
    check_command(cmd)
    assert cmd.unique is not None
    key = str(cmd.unique["key"]).encode()
    return OutgoingRecord(
        names.exec(cmd.queue),
        command_key(key),
        encode_command(cmd),
        command_headers(cmd),
        partition_for_key(key, partitions),
    )


class UniqueCalls:
    """Writes a planned job as an ``admit`` command and returns the owner's verdict."""

    def __init__(self, client: Client, *, verdicts: Verdicts, new_id: Callable[[int], str]):
        self._client = client
        self._verdicts = verdicts
        self._new_id = new_id

    def admit(self, planned: PlannedTimer, spec: UniqueSpec, *, wait: float) -> Scheduled:
        """Send ``planned`` (its timer is not written) for admission under ``spec``."""
        c = self._client
        job, rec = planned.job, planned.record
        at_ms = c.clock()
        schema = hdr.header(rec.headers, hdr.SCHEMA)
        cmd = Command(
            command_id=self._new_id(at_ms),
            op="admit",
            job_id=job.job_id,
            idempotency_key=job.idempotency_key,
            queue=job.queue,
            at_ms=at_ms,
            job=rec.value,
            job_schema=schema.decode() if schema else None,
            unique=spec.to_record(),
        )
        record = admit_record(c.names, cmd, partitions=c.queue_spec(job.queue).partitions)
        mark = self._verdicts.mark(job.job_id) if wait > 0 else None
        partition = c._write_all([record], f"scheduling job {job.job_id!r}")
        first = planned.result()._replace(partition=partition)
        if mark is None:
            return first._replace(pending_admission=True)
        verdict = self._verdicts.wait(mark, cmd.command_id, wait)
        if verdict is None:
            return first._replace(pending_admission=True)
        if verdict.state == "scheduled":
            return first
        if verdict.state == "deduplicated" and verdict.first_job_id:
            if spec.on_duplicate == "refuse":
                raise DuplicateJob(spec.key, verdict.first_job_id, job.job_id)
            return first._replace(job_id=verdict.first_job_id, duplicate=True)
        raise DueflowError(
            f"job {job.job_id!r} with unique key {spec.key!r} was not admitted: "
            f"{verdict.code}: {verdict.reason}"
        )
