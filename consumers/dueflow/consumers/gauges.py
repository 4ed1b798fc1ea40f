"""What a queue's worker reports of itself: gauges, consumer lag, DLQ depth, stats."""

from __future__ import annotations

from typing import Any

from confluent_kafka import Consumer, KafkaException

from dueflow.consumers.commands import SteeringBook
from dueflow.consumers.dlq_depth import DlqDepth
from dueflow.consumers.intake import Intake
from dueflow.observability.metrics import Metrics

GAUGES_EVERY_S = 1.0
DLQ_DEPTH_EVERY_S = 15.0


class QueueGauges:
    """One queue's gauges, set on the commit loop's ticks."""

    def __init__(
        self,
        *,
        queue: str,
        group: str,
        metrics: Metrics,
        intake: Intake,
        book: SteeringBook,
        dlq_depth: DlqDepth,
    ) -> None:
        self._queue = queue
        self._group = group
        self._metrics = metrics
        self._intake = intake
        self._book = book
        self._dlq_depth = dlq_depth

    def update(self) -> None:
        """Jobs in flight, steering states, and each partition's lag."""
        m = self._metrics
        intake = self._intake
        m.in_flight.labels(self._queue).set(intake.in_flight)
        m.steering_states.labels(self._queue).set(len(self._book))
        poller = intake.poller
        feeds = {
            f.tp: (f.committed, f.tracker.unfinished)
            for f in intake.feeds.values()
            if f.committed is not None
        }
        if poller is None or not feeds:
            return
        lag = m.consumer_lag
        group = self._group

        def report(consumer: Consumer) -> None:
            # On the consumer's thread; cached watermarks: no network round trip.
            # Lag = records not read yet (high watermark - position) + records read
            # and not finished. Not "high - committed": the commit marker after the
            # last committed record takes an offset, so a group that finished
            # everything would show a lag of 1 per partition.
            try:
                positions = {
                    (tp.topic, tp.partition): tp.offset for tp in consumer.position(list(feeds))
                }
            except KafkaException:
                positions = {}
            for tp, (committed, unfinished) in feeds.items():
                try:
                    _low, high = consumer.get_watermark_offsets(tp, cached=True)
                except KafkaException:
                    continue
                if high < 0:
                    continue
                read_to = positions.get((tp.topic, tp.partition), -1)
                if read_to >= committed:
                    behind = max(0, high - read_to) + unfinished
                else:  # nothing read since the assignment
                    behind = max(0, high - committed)
                lag.labels(group, tp.topic, str(tp.partition)).set(behind)

        poller.post(report)

    def report_dlq_depth(self) -> None:
        """Records in the queue's whole DLQ topic (every reporter reports the same total;
        dashboards take the max per queue): asked of the admin client, never of the
        consumer, whose thread would not poll meanwhile (consumers/dlq_depth.py)."""
        if self._intake.feeds:
            self._dlq_depth.ask()

    def stats(self, *, keys: int, pending_records: int) -> dict[str, Any]:
        """A snapshot for tests and the CLI."""
        intake = self._intake
        return {
            "queue": self._queue,
            "assigned": sorted(intake.feeds),
            "in_flight": intake.in_flight,
            "backlog": intake.backlog,
            "keys": keys,
            "steering_states": len(self._book),
            "pending_records": pending_records,
        }
