"""One attempt of a job as a worker records it, without a broker: the settings,
the batch recorder and the delivery that the unit tests of what an attempt writes
(retries, follow-ups) share."""

from __future__ import annotations

import random

from dueflow import headers as hdr
from dueflow.config import load_settings
from dueflow.consumers.feeds import Delivery, PartitionFeed
from dueflow.consumers.follow_ups import FollowUpPlanner
from dueflow.consumers.recorder import BatchRecorder
from dueflow.model import Job
from dueflow.observability.metrics import Metrics
from dueflow.observability.tracing import JobTracer
from dueflow.records import codec
from dueflow.testing.log import MemoryRecord

# One queue, "jobs": six partitions, retry tiers of 200 and 500 ms.
SETTINGS = load_settings(
    env={}, overrides={"queues": [{"name": "jobs", "partitions": 6, "retry_tiers_ms": [200, 500]}]}
)
NOW = 1_800_000_000_000


def batch_recorder(follow_ups: FollowUpPlanner | None = None) -> BatchRecorder:
    """The batch recorder of queue ``jobs`` a worker builds (its rng seeded)."""
    return BatchRecorder(
        SETTINGS,
        SETTINGS.queue("jobs"),
        worker_id="w",
        metrics=Metrics(),
        tracer=JobTracer(),
        rng=random.Random(1),
        follow_ups=follow_ups,
    )


def job_delivery(feed: PartitionFeed, job: Job, headers: hdr.Headers, offset: int) -> Delivery:
    """``job``'s exec record (key ``job.idempotency_key``) at ``offset`` of ``feed``,
    as a worker receives it (not prepared yet)."""
    value = codec.encode("job", job.to_record())
    key = job.idempotency_key.encode()
    record = MemoryRecord(feed.topic, feed.partition, offset, key, value, headers, NOW)
    return Delivery(feed, record, offset)
