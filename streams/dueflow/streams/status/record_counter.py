"""Count the committed records of offset ranges by reading them (I/O edge).

Offsets overcount records (transaction markers, aborted records), see
:mod:`dueflow.kafka.cluster_view`. A :class:`RecordCounter` reads the ranges it is
asked for with a read_committed consumer in assign mode and counts what it
gets. Results are kept: a range asked for again costs nothing, and a range
that only grew at its end (a DLQ receiving records) is read from where the
last count stopped. At most ``budget`` records are read per call; a range
not finished in time or in budget is left out (its count continues next
call) and the view falls back to the offset distance.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from confluent_kafka import KafkaError, TopicPartition

from dueflow.kafka.cluster_view import RecordCount, Watermarks

TP = tuple[str, int]


class RecordCounter:
    """Counts records in ``[start, high watermark)`` per partition, remembering counts."""

    def __init__(self, consumer: Any, *, timeout_s: float = 5.0, budget: int = 50_000) -> None:
        self._consumer = consumer  # read_committed, enable.partition.eof, never subscribed
        self._timeout = timeout_s
        self._budget = budget
        self._known: dict[TP, RecordCount] = {}

    def count(
        self, wanted: Mapping[TP, int], watermarks: Mapping[TP, Watermarks]
    ) -> dict[TP, RecordCount]:
        """``RecordCount`` of every wanted range counted to its high watermark."""
        done: dict[TP, RecordCount] = {}
        todo: dict[TP, RecordCount] = {}  # partial count so far: start, read up to, records
        for tp, start in wanted.items():
            high = watermarks[tp].high
            known = self._known.get(tp)
            if known is None or known.start != start or known.end > high:
                known = RecordCount(start, start, 0)
            if known.end >= high:
                done[tp] = RecordCount(start, high, known.records)
            else:
                todo[tp] = known
        if todo:
            done.update(self._read(todo, {tp: watermarks[tp].high for tp in todo}))
        self._known = {tp: c for tp, c in {**self._known, **done}.items() if tp in wanted}
        return {tp: c for tp, c in done.items() if c.end == watermarks[tp].high}

    def _read(self, todo: dict[TP, RecordCount], highs: dict[TP, int]) -> dict[TP, RecordCount]:
        consumer = self._consumer
        counts = {tp: c.records for tp, c in todo.items()}
        reached = {tp: c.end for tp, c in todo.items()}  # offset read up to (exclusive)
        open_ = set(todo)
        consumer.assign([TopicPartition(t, p, c.end) for (t, p), c in todo.items()])
        budget = self._budget
        deadline = time.monotonic() + self._timeout
        try:
            while open_ and budget > 0 and time.monotonic() < deadline:
                for msg in consumer.consume(min(budget, 1000), 0.2):
                    tp = (msg.topic(), msg.partition())
                    if tp not in open_:
                        continue
                    high = highs[tp]
                    err = msg.error()
                    if err is not None:
                        if err.code() == KafkaError._PARTITION_EOF and msg.offset() >= high:
                            reached[tp] = high
                            open_.discard(tp)
                        continue
                    offset = msg.offset()
                    if offset < high:
                        counts[tp] += 1
                        budget -= 1
                        reached[tp] = offset + 1
                    if offset >= high - 1:  # in order: nothing below high is left
                        reached[tp] = high
                        open_.discard(tp)
        finally:
            consumer.unassign()
        return {tp: RecordCount(todo[tp].start, reached[tp], counts[tp]) for tp in todo}
