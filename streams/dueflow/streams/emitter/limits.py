"""The record size limits the active emitter writes against.

The emitter fires a timer's value and key with the timer's headers plus
``df-fired`` and ``df-src`` into ``exec.<queue>``. A timer the timer topic
took may still make an exec record too large for its topic (written by
another client, a larger timer topic limit, or an exec limit lowered later);
such a timer is quarantined (reason ``record too large``) instead of fired,
so that one record never stops the emitter.

The hot path pays one comparison per fire: ``len(value) + len(key)`` against
:attr:`EmitterLimits.fast` of the exec topic, the topic's limit (or the
producers', if lower) less :data:`FIRE_HEADROOM` for the headers. Only a
record above it is measured exactly (:meth:`EmitterLimits.exec_excess`).
Headers larger than the headroom are not measured on the hot path: if such a
record still makes a write fail as too large, the process calls
:meth:`EmitterLimits.refused`, which reads every limit again and measures
every record exactly for :data:`CAREFUL_MS`, so the offending record is
quarantined when the shard reads it again from its committed offset.

The limits of a topic are read (``describe_configs``, with the quarantine
and timer topics) the first time a record goes to it.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from dueflow.config import Settings
from dueflow.kafka.topic_limits import TopicLimits, producer_max_bytes
from dueflow.kafka.topics import names
from dueflow.records.record_size import producer_size, record_size
from dueflow.records.set_aside import RecordLimit
from dueflow.records.size_budget import DEFAULT_MAX_MESSAGE_BYTES

# Bytes of headers (the timer's, df-fired, df-src, trace) and record framing the
# hot path allows for without measuring them.
FIRE_HEADROOM = 16 * 1024
# How long every record is measured after a write was refused as too large.
CAREFUL_MS = 60_000


class EmitterLimits:
    """Limits of the exec, quarantine and timer topics, read on first use, shared by
    every shard a process drives (the loop's thread only)."""

    def __init__(
        self,
        settings: Settings,
        *,
        read: Callable[[list[str]], dict[str, int]] | None = None,
    ) -> None:
        n = names(settings)
        self._timers = n.timers
        self._quarantine = n.quarantine
        self._producer = producer_max_bytes(settings)
        self._reader = TopicLimits(settings) if read is None else None
        self._read = read if read is not None else self._describe
        self._known: dict[str, int] = {}
        # exec topic -> the largest len(key) + len(value) fired without measuring:
        # the drainer's hot path reads this dict (kept, cleared in place).
        self.fast: dict[str, int] = {}
        self.careful_until_ms = 0
        self.reads = 0

    def _describe(self, topics: list[str]) -> dict[str, int]:
        assert self._reader is not None
        return self._reader.describe(topics)

    def max_bytes(self, topic: str) -> int:
        """``max.message.bytes`` of ``topic`` (read with the quarantine and timer
        topics the first time; the broker's default when it cannot be read)."""
        found = self._known.get(topic)
        if found is None:
            self.reads += 1
            wanted = sorted({topic, self._quarantine, self._timers} - self._known.keys())
            got = self._read(wanted)
            for t in wanted:
                self._known[t] = got.get(t, DEFAULT_MAX_MESSAGE_BYTES)
            found = self._known[topic]
        return found

    def fast_limit(self, topic: str, now_ms: int) -> int:
        """The hot path's bound for ``topic`` (-1 while careful: measure every record)."""
        if now_ms < self.careful_until_ms:
            return -1
        found = self.fast.get(topic)
        if found is None:
            found = self.fast[topic] = (
                min(self.max_bytes(topic), self._producer - 64) - FIRE_HEADROOM
            )
        return found

    def record_limit(self, topic: str) -> RecordLimit:
        return RecordLimit(topic, self.max_bytes(topic), self._producer)

    @property
    def quarantine(self) -> RecordLimit:
        """Where quarantine records go, and how large they may be."""
        return self.record_limit(self._quarantine)

    def excess(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, Any]],
    ) -> tuple[int, int, bool]:
        """How far a record over ``topic``'s limits is: ``(size, limit, by_producer)``
        of the worse of the two, or ``(size, limit, False)`` with size <= limit."""
        size = record_size(key, value, headers)
        limit = self.max_bytes(topic)
        psize = producer_size(key, value, headers)
        if psize - self._producer > size - limit:
            return psize, self._producer, True
        return size, limit, False

    def too_large(
        self,
        topic: str,
        key: bytes | None,
        value: bytes | None,
        headers: Sequence[tuple[str, Any]],
        *,
        what: str,
    ) -> str | None:
        """Why a record for ``topic`` would be refused (the detail of a ``record too
        large`` reason), or None when it fits."""
        size, limit, by_producer = self.excess(topic, key, value, headers)
        if size <= limit:
            return None
        if by_producer:
            return (
                f"the {what} would be {size} bytes to the emitter's producers, over "
                f"their message.max.bytes {limit}"
            )
        return f"the {what} would be {size} bytes, over max.message.bytes {limit} of {topic}"

    @property
    def careful(self) -> bool:
        return self.careful_until_ms > 0

    def refused(self, now_ms: int) -> None:
        """A write was refused as too large: read every limit again, and measure every
        record for :data:`CAREFUL_MS`."""
        self._known.clear()
        self.fast.clear()
        if self._reader is not None:
            self._reader.forget()
        self.careful_until_ms = now_ms + CAREFUL_MS

    def measures_cascades(self, now_ms: int) -> bool:
        """Records placed again in the timer topic are as large as when they were
        written there: measured only while careful (a timer limit lowered since)."""
        return now_ms < self.careful_until_ms
