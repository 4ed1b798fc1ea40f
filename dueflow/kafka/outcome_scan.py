"""Find one job in the outcomes topic without the status view (I/O edge).

Outcomes are keyed by job id with Kafka's default partitioner, so all of a
job's outcomes are in one partition (``partition_for_key``). The scan reads
only that partition, and only its newest ``max_records`` records: it is
bounded, and says how much it read and whether older records were left out.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, KafkaException, TopicPartition

from dueflow import headers as hdr
from dueflow.config import Settings
from dueflow.errors import KafkaOperationError, UndecodableRecord
from dueflow.kafka.clients import kafka_error, make_consumer
from dueflow.kafka.topics import names
from dueflow.records import codec
from dueflow.rules import job_state as state
from dueflow.rules.job_status import JobStatus, scheduled_content_hash
from dueflow.rules.partitioning import partition_for_key


@dataclass(frozen=True, slots=True)
class JobScan:
    """What a bounded scan found."""

    job_id: str
    topic: str
    partition: int
    first_offset: int  # first offset read
    end_offset: int  # high watermark when the scan started
    scanned: int  # records read
    skipped_older: int  # records of the partition older than the scan window
    undecodable: int
    view: dict[str, Any] | None
    queues: tuple[str, ...] = ()  # every queue the job id has outcomes in, first seen first
    content_hash: str | None = None  # of the newest `scheduled` outcome that has one

    @property
    def status(self) -> JobStatus | None:
        """The job as :class:`~dueflow.rules.job_status.JobStatus` (None: no outcome found)."""
        if self.view is None:
            return None
        return JobStatus.from_view(
            self.view, queues=self.queues, source="kafka", content_hash=self.content_hash
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "job_id": self.job_id,
            "found": self.view is not None,
            "scan": {
                "topic": self.topic,
                "partition": self.partition,
                "offsets": [self.first_offset, self.end_offset],
                "records_read": self.scanned,
                "older_records_not_read": self.skipped_older,
                "undecodable": self.undecodable,
            },
            "job": self.view,
        }


def scan_for_job(
    settings: Settings, job_id: str, *, max_records: int = 200_000, timeout_s: float = 30.0
) -> JobScan:
    """Fold the job's outcomes found in the newest ``max_records`` of its partition."""
    topic = names(settings).outcomes
    key = job_id.encode()
    consumer = make_consumer(
        settings,
        f"{settings.topic_prefix}.job-scan",  # assign mode: never joins, never commits
        **{"enable.partition.eof": True, "log_level": 3},
    )
    try:
        partition = partition_for_key(key, _partition_count(consumer, topic, timeout_s))
        low, high = _watermarks(consumer, TopicPartition(topic, partition), timeout_s)
        start = max(low, high - max_records)
        view: dict[str, Any] | None = None
        queues: list[str] = []
        content_hash: str | None = None
        scanned = undecodable = 0
        if high > start:
            consumer.assign([TopicPartition(topic, partition, start)])
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                msg = consumer.poll(0.5)
                if msg is None:
                    continue
                err = msg.error()
                if err is not None:
                    if err.code() == KafkaError._PARTITION_EOF:
                        break
                    raise KafkaOperationError(f"reading {topic}[{partition}]: {err}")
                scanned += 1
                last = (msg.offset() or 0) >= high - 1  # done, whoever's record it is
                if msg.key() == key:
                    headers = _pairs(msg.headers())
                    try:
                        version = codec.parse_schema_header(
                            hdr.header(headers, hdr.SCHEMA), expected="outcome"
                        )
                        outcome = codec.decode(
                            "outcome", msg.value() or b"", writer_version=version
                        )
                    except UndecodableRecord:
                        undecodable += 1
                        outcome = None
                    if outcome is not None:
                        view = state.apply_outcome(
                            view,
                            outcome,
                            partition=partition,
                            fired_ms=state.header_ms(hdr.header(headers, hdr.FIRED)),
                            next_due_ms=state.header_ms(hdr.header(headers, hdr.NEXT_DUE)),
                        )
                        content_hash = scheduled_content_hash(outcome, headers) or content_hash
                        if outcome["queue"] not in queues:
                            queues.append(str(outcome["queue"]))
                if last:
                    break
        return JobScan(
            job_id=job_id,
            topic=topic,
            partition=partition,
            first_offset=start,
            end_offset=high,
            scanned=scanned,
            skipped_older=start - low,
            undecodable=undecodable,
            view=view,
            queues=tuple(queues),
            content_hash=content_hash,
        )
    finally:
        consumer.close()


# How long a topic may stay invisible (created a moment ago) before it counts as missing.
_SETTLE_S = 3.0


def _partition_count(consumer: Any, topic: str, timeout_s: float) -> int:
    deadline = time.monotonic() + min(_SETTLE_S, timeout_s)
    while True:
        md = consumer.list_topics(topic, timeout=timeout_s)
        tmd = md.topics.get(topic)
        if tmd is not None and tmd.error is None and tmd.partitions:
            return len(tmd.partitions)
        if time.monotonic() > deadline:
            raise KafkaOperationError(f"topic {topic} not found (run `dueflow topics ensure`)")
        time.sleep(0.1)


# Answers of a partition whose leader is still being elected (a topic just made).
_SETTLING = frozenset(
    {
        KafkaError.NOT_LEADER_FOR_PARTITION,
        KafkaError.LEADER_NOT_AVAILABLE,
        KafkaError.UNKNOWN_TOPIC_OR_PART,
        KafkaError._TIMED_OUT,
    }
)


def _watermarks(consumer: Any, tp: TopicPartition, timeout_s: float) -> tuple[int, int]:
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            low, high = consumer.get_watermark_offsets(tp, timeout=timeout_s)
            return int(low), int(high)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            settling = isinstance(err, KafkaError) and err.code() in _SETTLING
            if not settling or time.monotonic() > deadline:
                raise kafka_error(f"watermarks of {tp.topic}[{tp.partition}]", exc) from exc
            time.sleep(0.1)


def _pairs(headers: Any) -> list[tuple[str, bytes | None]]:
    return list(headers or [])
