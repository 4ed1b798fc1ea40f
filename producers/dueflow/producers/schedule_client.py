"""Cron schedules in the compacted schedules topic: write them, read them back.

A schedule is one record keyed by its id in ``<prefix>.schedules`` (value
``schemas/dueflow/schemas/schedule.avsc``); compaction keeps the latest. Every change writes
a new record whose ``version`` is ``max(previous version + 1, now)``, so
versions only grow, across clients and restarts; the emitter drops
occurrences computed from an older version. Deleting writes a tombstone
(null value) that carries the deleted version in its ``df-sv`` header, so a
schedule added again under the same id keeps growing versions.

Reading goes to the end of the topic: a ``read_committed`` consumer assigned
to every partition from the beginning up to the high watermarks. The topic
holds one live record per schedule, so this is cheap for the thousands of
schedules a cluster has. The emitter (another component) turns schedules into
occurrences; this module only writes and lists them.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Any, Unpack

from confluent_kafka import Consumer, KafkaError, KafkaException, TopicPartition

from dueflow import headers as hdr
from dueflow.config import Settings
from dueflow.errors import (
    ConflictError,
    DueflowError,
    InvalidInput,
    UndecodableRecord,
    UnknownQueue,
)
from dueflow.kafka.clients import kafka_error, make_consumer
from dueflow.kafka.topics import names
from dueflow.observability.logs import event
from dueflow.producers.call_options import (
    CRON_CHANGE_KEYWORDS,
    CronChanges,
    CronDefinition,
    cron_definition,
)
from dueflow.producers.cancel import OutgoingRecord
from dueflow.records import codec
from dueflow.records.job_options import check_keywords
from dueflow.records.job_request import (
    MAX_INT32,
    check_name,
    encode_payload,
    parse_backoff,
    parse_timeout,
)
from dueflow.rules.cron import (
    CronSchedule,
    MisfirePolicy,
    OverlapPolicy,
    first_occurrence,
    parse_cron,
    zone,
)
from dueflow.rules.cron_time import MAX_MS
from dueflow.rules.routing import DEFAULT_QUEUE
from dueflow.task_name import check_task_name
from dueflow.timeutil import parse_duration, to_utc_ms

log = logging.getLogger("dueflow.producers.schedule_client")

# Tombstones carry version 1's header: every reader knows it (there is no value).
_SCHEMA = codec.schema_header("schedule", 1)


@dataclass(frozen=True, slots=True)
class StoredSchedule:
    """The latest record of one schedule id: a schedule, or a deletion."""

    schedule_id: str
    schedule: CronSchedule | None  # None: deleted (tombstone)
    version: int  # of the schedule, or the deleted version carried by the tombstone


class ScheduleStore:
    """Cron schedules of one cluster (blocking I/O).

    ``write`` produces one record and returns once it is acknowledged (the
    scheduling client passes its producer's); consumers for reading are made
    per call and closed.
    """

    def __init__(
        self,
        settings: Settings,
        *,
        write: Callable[[OutgoingRecord], int],
        clock: Callable[[], int],
        read_timeout_s: float = 30.0,
        route: Callable[[str], str] | None = None,
        check_queue: Callable[[object], None] | None = None,
    ) -> None:
        self.settings = settings
        self.topic = names(settings).schedules
        self._write = write
        self._clock = clock
        self.read_timeout_s = read_timeout_s
        # The scheduling client's routing and queue check (registry included).
        self._route = route
        self._check_queue = check_queue

    # ----------------------------------------------------------------- writes
    def add(self, schedule_id: str, **definition: Unpack[CronDefinition]) -> CronSchedule:
        """Add a schedule (``queue`` ``None``: the task's route). Adding the same
        definition again returns the stored one (nothing written); another
        definition under a live id is a :class:`ConflictError` (use :meth:`update`).
        A schedule that can never fire (``0 0 30 2 *``, or an end before its first
        occurrence) is refused with :class:`InvalidInput` naming the expression
        (:func:`~dueflow.rules.cron.first_occurrence`)."""
        given: dict[str, Any] = dict(cron_definition("add_schedule", definition))
        now = self._clock()
        task = given["task"]
        if given.get("queue") is None and self._route is not None and type(task) is str:
            given["queue"] = self._route(task)
        fields = schedule_fields(
            self.settings, check_queue=self._check_queue, schedule_id=schedule_id, **given
        )
        draft = CronSchedule(version=now, created_ms=now, updated_ms=now, **fields)
        first_occurrence(draft, now_ms=now)  # a schedule that can never fire is refused
        stored = self.get_stored(schedule_id)
        if stored is not None and stored.schedule is not None:
            if _definition(stored.schedule) == _definition(draft):
                return stored.schedule
            raise ConflictError(
                f"schedule_id {schedule_id!r} already exists with another definition "
                f"(cron {stored.schedule.cron!r} in {stored.schedule.timezone}, task "
                f"{stored.schedule.task!r}); accepted: update_schedule to change it, or a "
                "new schedule id"
            )
        version = _next_version(stored, now)
        return self._put(replace(draft, version=version))

    def update(self, schedule_id: str, **changes: Unpack[CronChanges]) -> CronSchedule:
        """Change the given fields of a live schedule (``None`` keeps a field);
        writes a new version."""
        check_keywords("update_schedule", changes, CRON_CHANGE_KEYWORDS)
        current = self._live(schedule_id)
        merged: dict[str, Any] = {
            "cron": current.cron,
            "timezone": current.timezone,
            "task": current.task,
            "queue": current.queue,
            "misfire": current.misfire,
            "jitter": timedelta(milliseconds=current.jitter_ms),
            "max_attempts": current.max_attempts,
            "backoff": current.backoff,
            "timeout": None
            if current.timeout_ms is None
            else timedelta(milliseconds=current.timeout_ms),
            "labels": current.labels,
            "paused": current.paused,
            "overlap": current.overlap,
        }
        merged.update({k: v for k, v in changes.items() if v is not None and k != "payload"})
        payload = changes.get("payload")
        fields = schedule_fields(
            self.settings,
            check_queue=self._check_queue,
            schedule_id=schedule_id,
            payload=payload,
            **merged,
        )
        if payload is None:
            fields["payload"], fields["content_type"] = current.payload, current.content_type
        if changes.get("start") is None:
            fields["start_ms"] = current.start_ms
        if changes.get("end") is None:
            fields["end_ms"] = current.end_ms
        now = self._clock()
        changed = CronSchedule(
            version=max(current.version + 1, now),
            created_ms=current.created_ms,
            updated_ms=now,
            **fields,
        )
        return self._put(changed)

    def pause(self, schedule_id: str) -> CronSchedule:
        """Stop firing (the schedule stays); a new version."""
        return self._set_paused(schedule_id, True)

    def resume(self, schedule_id: str) -> CronSchedule:
        """Fire again from the next occurrence; a new version."""
        return self._set_paused(schedule_id, False)

    def delete(self, schedule_id: str) -> bool:
        """Delete a schedule (a tombstone); False when there was none. The id of a
        schedule that exists is taken even when a new one could not have it
        (written by a client without dueflow's checks), so it can be stopped."""
        _check_id(schedule_id, existing=True)
        stored = self.get_stored(schedule_id)
        if stored is None or stored.schedule is None:
            return False
        deleted_version = max(stored.version + 1, self._clock())
        self._write(
            OutgoingRecord(
                self.topic,
                schedule_id.encode(),
                None,
                [(hdr.SCHEDULE_VERSION, b"%d" % deleted_version), (hdr.SCHEMA, _SCHEMA)],
            )
        )
        return True

    def _set_paused(self, schedule_id: str, paused: bool) -> CronSchedule:
        current = self._live(schedule_id, existing=True)  # as delete: it can be stopped
        now = self._clock()
        return self._put(
            replace(current, paused=paused, version=max(current.version + 1, now), updated_ms=now)
        )

    def _put(self, schedule: CronSchedule) -> CronSchedule:
        # The oldest schema version that holds it, so emitters of the previous
        # release read every schedule that uses nothing new.
        version = schedule.schema_version
        self._write(
            OutgoingRecord(
                self.topic,
                schedule.schedule_id.encode(),
                codec.encode("schedule", schedule.to_record(), version=version),
                [
                    (hdr.SCHEDULE_VERSION, b"%d" % schedule.version),
                    (hdr.SCHEMA, codec.schema_header("schedule", version)),
                ],
            )
        )
        return schedule

    def _live(self, schedule_id: str, *, existing: bool = False) -> CronSchedule:
        _check_id(schedule_id, existing=existing)
        stored = self.get_stored(schedule_id)
        if stored is None or stored.schedule is None:
            raise InvalidInput("schedule_id", schedule_id, "the id of an existing schedule")
        return stored.schedule

    # ------------------------------------------------------------------ reads
    def get(self, schedule_id: str) -> CronSchedule | None:
        """The live schedule ``schedule_id``, or None."""
        stored = self.get_stored(schedule_id)
        return None if stored is None else stored.schedule

    def get_stored(self, schedule_id: str) -> StoredSchedule | None:
        """The latest record of ``schedule_id`` (live or deleted), or None."""
        return self.read_all().get(schedule_id)

    def list_all(self, *, include_paused: bool = True) -> list[CronSchedule]:
        """Every live schedule, by id."""
        out = [s.schedule for s in self.read_all().values() if s.schedule is not None]
        return sorted(
            (s for s in out if include_paused or not s.paused), key=lambda s: s.schedule_id
        )

    def read_all(self) -> dict[str, StoredSchedule]:
        """The latest record of every schedule id, read to the end of the topic."""
        consumer = make_consumer(self.settings, f"{self.topic}.reader.{uuid.uuid4().hex}")
        try:
            return self._read(consumer)
        except KafkaException as exc:
            raise kafka_error(f"reading {self.topic}", exc) from exc
        finally:
            consumer.close()

    def _read(self, consumer: Consumer) -> dict[str, StoredSchedule]:
        md = consumer.list_topics(self.topic, timeout=self.read_timeout_s)
        topic_md = md.topics.get(self.topic)
        if topic_md is None or topic_md.error is not None:
            raise DueflowError(
                f"topic {self.topic} is not available ({topic_md.error if topic_md else 'missing'})"
                ": create dueflow's topics first (`dueflow topics ensure`)"
            )
        ends: dict[int, int] = {}
        for p in topic_md.partitions:
            hi = _high_watermark(consumer, TopicPartition(self.topic, p), self.read_timeout_s)
            if hi > 0:
                ends[p] = hi
        latest: dict[str, StoredSchedule] = {}
        if not ends:
            return latest
        consumer.assign([TopicPartition(self.topic, p, 0) for p in ends])
        pending = set(ends)
        deadline = time.monotonic() + self.read_timeout_s
        while pending:
            if time.monotonic() > deadline:
                raise DueflowError(f"could not read {self.topic} to its end in time")
            for msg in consumer.consume(1000, 0.2):
                if msg.error() is not None:
                    continue
                p, offset = msg.partition() or 0, msg.offset() or 0
                self._apply(msg.key(), msg.value(), msg.headers(), latest)
                if offset + 1 >= ends[p]:
                    pending.discard(p)
            # A committed end may be a transaction marker no record sits at.
            for tp in consumer.position([TopicPartition(self.topic, p) for p in pending]):
                if tp.offset >= ends[tp.partition]:
                    pending.discard(tp.partition)
        return latest

    def _apply(
        self,
        key: bytes | None,
        value: bytes | None,
        headers: Any,
        latest: dict[str, StoredSchedule],
    ) -> None:
        if key is None:
            return
        schedule_id = key.decode("utf-8", "replace")
        if value is None:
            version = hdr.header_int(headers, hdr.SCHEDULE_VERSION) or 0
            latest[schedule_id] = StoredSchedule(schedule_id, None, version)
            return
        try:
            writer = codec.parse_schema_header(hdr.header(headers, hdr.SCHEMA), expected="schedule")
            schedule = CronSchedule.from_record(
                codec.decode("schedule", value, writer_version=writer)
            )
        except (UndecodableRecord, InvalidInput, KeyError, ValueError) as exc:
            # A malformed record must not stop anyone reading the schedules:
            # the emitter quarantines it; here it is skipped and logged.
            event(
                log,
                "schedule_record_skipped",
                logging.WARNING,
                schedule_id=schedule_id,
                reason=str(exc),
            )
            return
        latest[schedule_id] = StoredSchedule(schedule_id, schedule, schedule.version)


# Answers of a topic whose partition leaders are still being elected.
_SETTLING = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._TIMED_OUT,
    }
)


def _high_watermark(consumer: Consumer, tp: TopicPartition, timeout_s: float) -> int:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            _lo, hi = consumer.get_watermark_offsets(tp, timeout=timeout_s)
            return int(hi)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            settling = isinstance(err, KafkaError) and err.code() in _SETTLING
            if not settling or time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def schedule_fields(
    settings: Settings,
    *,
    schedule_id: str,
    check_queue: Callable[[object], None] | None = None,
    **definition: Unpack[CronDefinition],
) -> dict[str, Any]:
    """The fields of a :class:`CronSchedule` from what a caller gives, every one
    checked; :class:`InvalidInput` names the first bad field (pure; ``check_queue``:
    the caller's check that the queue exists, default: a static queue of
    ``settings``). ``queue`` ``None``: ``default``."""
    _check_id(schedule_id)
    parse_cron(definition["cron"])
    zone(definition["timezone"])
    task = definition["task"]
    check_task_name(task)
    queue = definition.get("queue")
    if queue is None:
        queue = DEFAULT_QUEUE
    if check_queue is not None:
        check_queue(queue)
    elif queue not in settings.queue_names:
        raise UnknownQueue(queue, settings.queue_names)
    misfire = definition.get("misfire", MisfirePolicy.FIRE_ONCE)
    try:
        policy = MisfirePolicy(misfire)
    except ValueError:
        raise InvalidInput("misfire", misfire, ", ".join(p.value for p in MisfirePolicy)) from None
    overlap = definition.get("overlap", OverlapPolicy.ALLOW)
    try:
        overlapping = OverlapPolicy(overlap)
    except ValueError:
        raise InvalidInput("overlap", overlap, ", ".join(p.value for p in OverlapPolicy)) from None
    body, content_type = encode_payload(definition.get("payload"))
    start, end = definition.get("start"), definition.get("end")
    start_ms = None if start is None else to_utc_ms(start, field="start")
    end_ms = None if end is None else to_utc_ms(end, field="end")
    if start_ms is not None and end_ms is not None and end_ms < start_ms:
        raise InvalidInput("end", end, f"a time at or after start ({start})")
    return {
        "schedule_id": schedule_id,
        "cron": definition["cron"],
        "timezone": definition["timezone"],
        "queue": queue,
        "task": task,
        "payload": body,
        "content_type": content_type,
        "misfire": policy,
        "start_ms": start_ms,
        "end_ms": end_ms,
        "paused": bool(definition.get("paused", False)),
        **_job_rules(settings, definition),
        "overlap": overlapping,
    }


def _job_rules(settings: Settings, definition: CronDefinition) -> dict[str, Any]:
    """The fields of a schedule that every occurrence's job gets (attempts, backoff,
    timeout, jitter, labels), checked."""
    max_attempts = definition.get("max_attempts")
    attempts = settings.worker.default_max_attempts if max_attempts is None else max_attempts
    if type(attempts) is not int or not 1 <= attempts <= MAX_INT32:
        raise InvalidInput("max_attempts", max_attempts, f"an integer from 1 to {MAX_INT32}")
    timeout_ms = parse_timeout(definition.get("timeout"))
    jitter = definition.get("jitter")
    jitter_ms = 0 if jitter is None else parse_duration(jitter, field="jitter")
    if jitter_ms > MAX_MS:
        raise InvalidInput("jitter", jitter, f"a duration of at most {MAX_MS} ms")
    labels = definition.get("labels")
    if labels is not None and not (
        isinstance(labels, Mapping)
        and all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items())
    ):
        raise InvalidInput("labels", labels, "a dict of strings to strings")
    for key in labels or ():
        check_name(f"labels[{key!r}]", key)
    return {
        "jitter_ms": jitter_ms,
        "max_attempts": attempts,
        "backoff": parse_backoff(definition.get("backoff")),
        "timeout_ms": timeout_ms,
        "labels": dict(labels or {}),
    }


def _check_id(schedule_id: object, *, existing: bool = False) -> None:
    """A schedule id must be a name (:func:`~dueflow.records.job_request.check_name`);
    ``existing``: one that names a stored schedule (to pause or delete it) need only
    be a non-empty string."""
    if existing and isinstance(schedule_id, str) and schedule_id:
        return
    check_name("schedule_id", schedule_id)


def _next_version(stored: StoredSchedule | None, now: int) -> int:
    return now if stored is None else max(stored.version + 1, now)


def _definition(s: CronSchedule) -> CronSchedule:
    """A schedule without its bookkeeping and state, to compare definitions."""
    return replace(s, version=0, created_ms=0, updated_ms=0, paused=False)
