"""The DLQ depth gauge of a queue: records in its whole dead-letter topic.

Asked of an admin client, two ListOffsets requests (earliest and latest
committed offset of every partition, as a ``read_committed`` reader sees
them) answered through futures: nothing waits for the answer. Not
on the queue consumer's thread: a blocking watermark query there is a round
trip per partition during which the consumer does not poll, and every job
due meanwhile starts late (under load, 60-600 ms every time it was asked).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from typing import Any

from confluent_kafka import IsolationLevel, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec

from dueflow.observability.logs import event

_LOG = logging.getLogger("dueflow.worker")


def depth_of(low: Mapping[int, int], high: Mapping[int, int]) -> int | None:
    """Records between the earliest and the latest offset, summed over partitions;
    None unless both are known for every partition (pure)."""
    if set(low) != set(high):
        return None
    return sum(max(0, high[p] - low[p]) for p in high)


class DlqDepth:
    """Asks for the DLQ topic's offsets and sets ``report(depth)`` when both answers
    are in (on the admin client's thread). One request at a time: an ask while the
    last one is unanswered is skipped."""

    def __init__(
        self, topic: str, partitions: int, report: Callable[[int], None], *, timeout_s: float = 10.0
    ) -> None:
        self._topic = topic
        self._partitions = partitions
        self._report = report
        self._timeout_s = timeout_s
        self._admin: AdminClient | None = None
        self._lock = threading.Lock()
        self._pending = 0  # futures not answered yet
        self._answers: dict[str, dict[int, int]] = {}
        self._failed = False

    def start(self, admin: AdminClient) -> None:
        self._admin = admin

    def asking(self) -> bool:
        """A request is under way."""
        with self._lock:
            return self._pending > 0

    def ask(self) -> bool:
        """Send the requests (never waits); False when one is under way or not started."""
        admin = self._admin
        if admin is None:
            return False
        with self._lock:
            if self._pending:
                return False
            self._pending = 2 * self._partitions
            self._answers = {"low": {}, "high": {}}
            self._failed = False
        specs = (
            ("low", OffsetSpec.earliest()),  # type: ignore[no-untyped-call]
            ("high", OffsetSpec.latest()),  # type: ignore[no-untyped-call]
        )
        for end, spec in specs:
            try:
                futures = admin.list_offsets(
                    {TopicPartition(self._topic, p): spec for p in range(self._partitions)},
                    isolation_level=IsolationLevel.READ_COMMITTED,
                    request_timeout=self._timeout_s,
                )
            except Exception as exc:  # a refused request: nothing of it will answer
                event(_LOG, "DLQ depth not read", logging.DEBUG, error=repr(exc))
                self._answered(end, None, self._partitions)
                continue
            for tp, future in futures.items():
                future.add_done_callback(self._on_answer(end, tp.partition))
        return True

    def _on_answer(self, end: str, partition: int) -> Callable[[Future[Any]], None]:
        return lambda future: self._answered(end, (partition, future), 1)

    def _answered(self, end: str, answer: tuple[int, Future[Any]] | None, count: int) -> None:
        offset: tuple[int, int] | None = None
        if answer is not None:
            partition, future = answer
            if not future.cancelled() and future.exception() is None:
                offset = (partition, future.result().offset)
        with self._lock:
            if offset is None:
                self._failed = True
            else:
                self._answers[end][offset[0]] = offset[1]
            self._pending -= count
            if self._pending > 0 or self._failed:
                return
            depth = depth_of(self._answers["low"], self._answers["high"])
        if depth is not None:
            self._report(depth)
