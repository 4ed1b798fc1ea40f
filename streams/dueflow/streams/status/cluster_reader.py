"""Fill a :class:`~dueflow.kafka.cluster_view.ClusterSnapshot` from Kafka (I/O edge).

One admin client and one assign-mode consumer (for the DLQ tail and for
counting the records of small ranges, see
:mod:`~dueflow.streams.status.record_counter`), created in
:meth:`ClusterReader.start`. A read never raises for what it cannot see: a
missing topic or an unreachable coordinator becomes a line in
``snapshot.errors`` and the rest of the view is still filled in.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import Any

from confluent_kafka import (
    ConsumerGroupTopicPartitions,
    IsolationLevel,
    KafkaError,
    KafkaException,
    TopicPartition,
)
from confluent_kafka.admin import AdminClient, OffsetSpec

from dueflow import headers as hdr
from dueflow.config import Settings
from dueflow.errors import DueflowError, UndecodableRecord
from dueflow.kafka.clients import make_admin, make_consumer
from dueflow.kafka.cluster_view import (
    ClusterSnapshot,
    FailureRecord,
    GroupMember,
    RecordCount,
    Watermarks,
    lease_holder,
    queue_topics,
    ranges_to_count,
)
from dueflow.kafka.pausing import read_queue_controls
from dueflow.kafka.topics import names
from dueflow.records import codec
from dueflow.streams.status.record_counter import RecordCounter
from dueflow.wall_clock import wall_ms

Clock = Callable[[], int]


def broker_unreachable(errors: list[str]) -> bool:
    """Whether the metadata or offsets requests of a read failed for want of a broker
    (pure): timed out or no connection. A broker's answer that is an error (a
    partition without a leader for a moment, say) is not."""
    return any(
        e.startswith(("cluster metadata:", "low offsets", "high offsets"))
        and any(code in e for code in _NO_ANSWER)
        for e in errors
    )


# librdkafka's local error codes for a request that got no answer.
_NO_ANSWER = ("_TIMED_OUT", "_TRANSPORT", "_ALL_BROKERS_DOWN", "_DESTROY", "_RESOLVE")


class ClusterReader:
    """Reads offsets, groups and the DLQ tail of one dueflow deployment."""

    def __init__(
        self,
        settings: Settings,
        *,
        failures_per_queue: int = 20,
        timeout_s: float = 10.0,
        clock: Clock = wall_ms,
    ) -> None:
        self._settings = settings
        self._names = names(settings)
        self._failures_per_queue = failures_per_queue
        self._timeout = timeout_s
        self._clock = clock
        self._shards = settings.wheel.shards
        self._admin: AdminClient | None = None
        self._consumer: Any = None
        self._counter: RecordCounter | None = None

    # ---------------------------------------------------------------- lifecycle
    def start(self) -> ClusterReader:
        self._admin = make_admin(self._settings)
        self._consumer = make_consumer(
            self._settings,
            f"{self._names.prefix}.cluster-reader",  # never joins, never commits
            **{"enable.partition.eof": True, "log_level": 3},
        )
        self._counter = RecordCounter(self._consumer, timeout_s=self._timeout)
        return self

    def close(self) -> None:
        if self._consumer is not None:
            self._consumer.close()
            self._consumer = None
        self._counter = None
        self._admin = None

    def __enter__(self) -> ClusterReader:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --------------------------------------------------------------------- read
    def read(self) -> ClusterSnapshot:
        """One snapshot: watermarks, committed offsets, emitter members, DLQ tail."""
        if self._admin is None:
            raise RuntimeError("ClusterReader.read() before start()")
        errors: list[str] = []
        n = self._names
        queues = self._settings.queue_names
        topics = [n.timers] + [
            t for q in queues for t in (*queue_topics(self._settings, q), n.dlq(q))
        ]
        partitions = self._partitions(topics, errors)
        watermarks = self._watermarks(partitions, errors)
        committed: dict[str, dict[tuple[str, int], int]] = {}
        members: tuple[GroupMember, ...] = ()
        state = "unknown"
        if broker_unreachable(errors):
            # No group-coordinator request while the broker does not answer:
            # librdkafka can abort the process when a coordinator request of the
            # admin client fails on a dropped connection (librdkafka issues 3663
            # and 4605: rd_kafka_enq_once_del_source_return; seen here with the
            # broker stopped). The next read asks again.
            errors.append("groups not read: the broker did not answer")
        else:
            for group in [n.worker_group(q) for q in queues] + [
                n.emitter_offsets_group,
                n.emitter_group,
            ]:
                committed[group] = self._committed(group, errors)
            members, state = self._emitter_members(errors)
        failures = self._dlq_tail(watermarks, errors)
        counted: dict[tuple[str, int], RecordCount] = {}
        wanted = ranges_to_count(self._settings, watermarks, committed)
        if wanted and self._counter is not None:
            try:
                counted = self._counter.count(wanted, watermarks)
            except KafkaException as exc:
                errors.append(f"counting records: {exc}")
        paused = self._paused(errors)
        return ClusterSnapshot(
            taken_ms=self._clock(),
            watermarks=watermarks,
            committed=committed,
            emitter_members=members,
            emitter_group_state=state,
            failures=failures,
            errors=tuple(errors),
            counted=counted,
            paused=paused,
        )

    def _partitions(self, topics: Iterable[str], errors: list[str]) -> list[tuple[str, int]]:
        assert self._admin is not None
        try:
            md = self._admin.list_topics(timeout=self._timeout)
        except KafkaException as exc:
            errors.append(f"cluster metadata: {exc}")
            return []
        out: list[tuple[str, int]] = []
        for topic in topics:
            tmd = md.topics.get(topic)
            if tmd is None or tmd.error is not None:
                errors.append(f"topic {topic}: not found (run `dueflow topics ensure`)")
                continue
            out.extend((topic, p) for p in sorted(tmd.partitions))
        return out

    def _watermarks(
        self, partitions: list[tuple[str, int]], errors: list[str]
    ) -> dict[tuple[str, int], Watermarks]:
        assert self._admin is not None
        if not partitions:
            return {}
        found: dict[str, dict[tuple[str, int], int]] = {}
        specs = (("low", OffsetSpec.earliest()), ("high", OffsetSpec.latest()))  # type: ignore[no-untyped-call]
        for which, spec in specs:
            request = {TopicPartition(t, p): spec for t, p in partitions}
            futures = self._admin.list_offsets(
                request,
                isolation_level=IsolationLevel.READ_COMMITTED,
                request_timeout=self._timeout,
            )
            got: dict[tuple[str, int], int] = {}
            failed: dict[str, list[str]] = {}
            for tp, fut in futures.items():
                try:
                    got[(tp.topic, tp.partition)] = int(fut.result().offset)
                except KafkaException as exc:
                    failed.setdefault(tp.topic, []).append(str(exc.args[0] if exc.args else exc))
            for topic, why in sorted(failed.items()):
                errors.append(
                    f"{which} offsets of {topic}: {len(why)} partitions failed ({why[0]})"
                )
            found[which] = got
        return {
            tp: Watermarks(found["low"][tp], found["high"][tp])
            for tp in partitions
            if tp in found["low"] and tp in found["high"]
        }

    def _committed(self, group: str, errors: list[str]) -> dict[tuple[str, int], int]:
        assert self._admin is not None
        futures = self._admin.list_consumer_group_offsets(
            [ConsumerGroupTopicPartitions(group)], request_timeout=self._timeout
        )
        try:
            result = futures[group].result()
        except KafkaException as exc:
            if exc.args and exc.args[0].code() == KafkaError.GROUP_ID_NOT_FOUND:
                return {}
            errors.append(f"committed offsets of group {group}: {exc}")
            return {}
        return {
            (tp.topic, tp.partition): int(tp.offset)
            for tp in result.topic_partitions or []
            if tp.offset >= 0 and tp.error is None
        }

    def emitter_active(self) -> bool | None:
        """Whether an emitter holds a lease (fires due timers); None when the lease
        group cannot be read."""
        if self._admin is None:
            raise RuntimeError("ClusterReader.emitter_active() before start()")
        errors: list[str] = []
        members, _ = self._emitter_members(errors)
        if errors:
            return None
        return any(lease_holder(self._names.lease, members, s) for s in range(self._shards))

    def _emitter_members(self, errors: list[str]) -> tuple[tuple[GroupMember, ...], str]:
        assert self._admin is not None
        group = self._names.emitter_group
        futures = self._admin.describe_consumer_groups([group], request_timeout=self._timeout)
        try:
            desc = futures[group].result()
        except KafkaException as exc:
            if exc.args and exc.args[0].code() == KafkaError.GROUP_ID_NOT_FOUND:
                return (), "dead"
            errors.append(f"emitter group {group}: {exc}")
            return (), "unknown"
        members = tuple(
            GroupMember(
                member_id=m.member_id,
                client_id=m.client_id,
                host=m.host,
                partitions=tuple(
                    (tp.topic, tp.partition)
                    for tp in (m.assignment.topic_partitions if m.assignment else [])
                ),
            )
            for m in desc.members
        )
        state = getattr(desc, "state", None)
        return members, (state.name.lower() if state is not None else "unknown")

    def _dlq_tail(
        self, watermarks: dict[tuple[str, int], Watermarks], errors: list[str]
    ) -> tuple[FailureRecord, ...]:
        """The newest ``failures_per_queue`` records of each queue's DLQ."""
        k = self._failures_per_queue
        assign = []
        queue_of: dict[str, str] = {}
        for q in self._settings.queue_names:
            topic = self._names.dlq(q)
            queue_of[topic] = q
            for (t, p), marks in watermarks.items():
                if t == topic and marks.high > marks.low:
                    assign.append(TopicPartition(t, p, max(marks.low, marks.high - k)))
        if not assign or k <= 0:
            return ()
        consumer = self._consumer
        consumer.assign(assign)
        remaining = {(tp.topic, tp.partition) for tp in assign}
        found: list[FailureRecord] = []
        deadline = time.monotonic() + self._timeout
        try:
            while remaining and time.monotonic() < deadline:
                msg = consumer.poll(0.2)
                if msg is None:
                    continue
                key = (msg.topic(), msg.partition())
                if msg.error() is not None:
                    if msg.error().code() == KafkaError._PARTITION_EOF:
                        remaining.discard(key)
                    else:
                        errors.append(f"reading {msg.topic()}: {msg.error()}")
                        remaining.discard(key)
                    continue
                found.append(_failure(queue_of[msg.topic()], msg))
        finally:
            consumer.unassign()
        if remaining:
            errors.append(f"DLQ tail: gave up on {len(remaining)} partitions after the timeout")
        newest: list[FailureRecord] = []
        for q in self._settings.queue_names:
            mine = sorted((f for f in found if f.queue == q), key=lambda f: f.dead_ms)
            newest.extend(mine[-k:])
        return tuple(newest)

    def _paused(self, errors: list[str]) -> dict[str, dict[str, Any]]:
        """The queues paused on the control topic (it is compacted and small)."""
        try:
            paused, problems = read_queue_controls(
                self._settings, self._consumer, timeout_s=self._timeout
            )
        except (DueflowError, KafkaException) as exc:
            errors.append(f"control topic: {exc}")
            return {}
        errors.extend(f"control record {p}" for p in problems)
        return {q: c.to_json() for q, c in paused.items()}


def _failure(queue: str, msg: Any) -> FailureRecord:
    """A DLQ record as a :class:`FailureRecord`; an undecodable one says so."""
    headers = msg.headers()
    try:
        version = codec.parse_schema_header(hdr.header(headers, hdr.SCHEMA), expected="dead_letter")
        rec = codec.decode("dead_letter", msg.value() or b"", writer_version=version)
    except UndecodableRecord as exc:
        ts = msg.timestamp()[1]
        return FailureRecord(
            queue=queue,
            job_id=hdr.header_text(headers, hdr.JOB_ID) or "?",
            task=hdr.header_text(headers, hdr.TASK) or "?",
            reason="undecodable",
            error_type="UndecodableRecord",
            error_message=str(exc),
            attempts=0,
            dead_ms=int(ts),
            partition=msg.partition(),
            offset=msg.offset(),
        )
    return FailureRecord(
        queue=queue,
        job_id=rec["job_id"],
        task=rec["task"],
        reason=rec["reason"],
        error_type=rec["error_type"],
        error_message=rec["error_message"],
        attempts=rec["attempts"],
        dead_ms=rec["dead_ms"],
        partition=msg.partition(),
        offset=msg.offset(),
        trace_id=rec.get("trace_id"),
    )
