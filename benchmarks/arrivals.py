"""Read records as soon as they arrive: the loop of every measuring consumer here.

``Consumer.consume(n, timeout)`` returns once it has ``n`` records or the
timeout passed, whichever is first: below that rate every call waits out its
timeout, and a latency measured after it carries up to the whole timeout
(``consume(5000, 0.05)``: a "floor" of up to 50 ms). :func:`take_arrived`
instead blocks only for the first record and then takes what the client has
already fetched, so the receive time is when the records were there to read.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, Protocol

from confluent_kafka import Message

from dueflow.wall_clock import wall_ms


class RecordSource(Protocol):
    """The two calls of ``confluent_kafka.Consumer`` that reading needs."""

    def poll(self, timeout: float = -1) -> Message | None: ...

    def consume(self, num_messages: int = 1, timeout: float = -1) -> list[Message]: ...


class Arrival(NamedTuple):
    """Records taken in one go and the wall time (ms) they were in hand."""

    received_ms: int
    messages: list[Message]


def take_arrived(
    consumer: RecordSource,
    *,
    timeout_s: float,
    max_records: int = 10_000,
    clock: Callable[[], int] = wall_ms,
) -> Arrival:
    """Wait up to ``timeout_s`` for one record, then take (without waiting) the ones
    already fetched, up to ``max_records`` in all; ``received_ms`` is read once they
    are all in hand. Nothing within the timeout: no messages, and ``received_ms`` is
    when the wait ended. Error events (partition ends and the like) come back like
    records: callers check ``m.error()``."""
    if max_records < 1:
        raise ValueError(f"max_records: {max_records!r}; give 1 or more")
    first = consumer.poll(timeout_s)
    if first is None:
        return Arrival(clock(), [])
    messages = [first]
    if max_records > 1:
        messages.extend(consumer.consume(max_records - 1, 0))
    return Arrival(clock(), messages)
