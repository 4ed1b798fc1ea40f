"""A record the broker refuses as too large is known as such whatever error ends the
emitter's transaction (no broker: the process's decision, with a fake session)."""

from __future__ import annotations

from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from dueflow.config import load_settings
from dueflow.errors import KafkaOperationError
from dueflow.observability.metrics import Metrics
from dueflow.streams.emitter.acked_outbox import AckedOutbox, DeliveryFailed
from dueflow.streams.emitter.outbox import Outbox, TransactionAborted
from dueflow.streams.emitter.process import EmitterProcess

SETTINGS = load_settings(env={}, overrides={"bootstrap": "127.0.0.1:1"})
NOW = 1_800_000_000_000


def _error(code: int, text: str) -> KafkaException:
    return KafkaException(KafkaError(code, text))


# What the transaction's end says when its record was refused: the refusal itself
# (at the commit), or librdkafka's "erroneous state" (the next produce, or the
# offsets sent to the transaction, after the refusal put it in an abortable state).
STATE = _error(KafkaError._STATE, "Unable to produce message: Local: Erroneous state")
TOO_LARGE = _error(KafkaError.MSG_SIZE_TOO_LARGE, "Broker: Message size too large")
TIMED_OUT = _error(KafkaError._MSG_TIMED_OUT, "Local: Message timed out")


def test_the_outbox_knows_when_the_broker_refused_a_record_as_too_large() -> None:
    outbox = Outbox(SETTINGS)
    outbox._delivered(KafkaError(KafkaError._MSG_TIMED_OUT), None)
    assert not outbox.refused_too_large()
    outbox._delivered(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), None)
    assert outbox.refused_too_large()


class _Session:
    def __init__(self, outbox: object) -> None:
        self.outbox = outbox
        self.closed = False

    def close(self, *, commit: bool) -> None:
        self.closed = True


def _outbox(refused: bool) -> Outbox:
    """A transactional outbox (no producers) whose failed deliveries said so, or not."""
    outbox = Outbox(SETTINGS)
    if refused:
        outbox._delivered(KafkaError(KafkaError.MSG_SIZE_TOO_LARGE), None)
    return outbox


def _failing(exc: BaseException) -> Any:
    def work() -> None:
        raise exc

    return work


@pytest.mark.parametrize(
    ("error", "refused", "careful"),
    [
        (KafkaOperationError(f"produce to t: {STATE}", cause=STATE), True, True),
        (TransactionAborted(f"transaction aborted: {STATE}", cause=STATE), True, True),
        (KafkaOperationError(f"commit: {TOO_LARGE}", cause=TOO_LARGE), False, True),
        (KafkaOperationError(f"produce to t: {STATE}", cause=STATE), False, False),
    ],
    ids=["erroneous-state", "aborted-erroneous-state", "said-by-the-error", "another-failure"],
)
def test_a_refused_record_makes_the_emitter_measure_every_record(
    error: BaseException, refused: bool, careful: bool
) -> None:
    """The shard starts again measuring every record (so the refused one is
    quarantined when it is read again), not with the same bound that let it through."""
    assert _careful_after(error, _outbox(refused)) is careful


@pytest.mark.parametrize(
    ("error", "careful"),
    [
        (DeliveryFailed(f"not delivered: {TOO_LARGE}", cause=TOO_LARGE), True),
        (DeliveryFailed(f"not delivered: {TIMED_OUT}", cause=TIMED_OUT), False),
    ],
    ids=["too-large", "timed-out"],
)
def test_without_transactions_the_failed_delivery_says_it(
    error: BaseException, careful: bool
) -> None:
    outbox = AckedOutbox(SETTINGS)
    assert _careful_after(error, outbox) is careful


def _careful_after(error: BaseException, outbox: object) -> bool:
    """Whether the process measures every record after a shard failed with ``error``."""
    process = EmitterProcess(SETTINGS, Metrics(), clock_ms=lambda: NOW)
    process._prepare_outbox = lambda shard: None  # type: ignore[method-assign]
    session = _Session(outbox)
    process.sessions[0] = session  # type: ignore[assignment]
    process._guarded(0, _failing(error))
    assert session.closed
    assert process.sessions == {}
    return process.limits.careful
