"""A commit stuck in send_offsets_to_transaction is given up soon (no broker).

librdkafka can ignore send_offsets_to_transaction's timeout for good after the
group coordinator's broker went away (#5456/#5511). The committer gives the
call a short timeout of its own and says when the call runs past it plus a
grace; the worker asks while it waits for the commit and gives the producer
up then, instead of waiting for the whole commit deadline (17 s by default).
"""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from dueflow.consumers import committer as committer_mod
from dueflow.consumers.commit_loop import CommitLoop
from dueflow.consumers.committer import Batch, TransactionalCommitter
from dueflow.kafka.blocking import ClientWedged, DaemonThreadExecutor


class StuckProducer:
    """A producer whose send_offsets_to_transaction blocks until released."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.timeouts: list[float] = []

    def begin_transaction(self) -> None:
        pass

    def produce(self, *_args: Any, **_kw: Any) -> None:
        pass

    def send_offsets_to_transaction(self, _offsets: Any, _meta: Any, timeout: float) -> None:
        self.timeouts.append(timeout)
        self.release.wait(30)

    def commit_transaction(self, _timeout: float) -> None:
        pass


def committer_with(producer: StuckProducer) -> Any:
    c: Any = object.__new__(TransactionalCommitter)
    c._producer = producer
    c._group_metadata = lambda: "metadata"
    c._wedged_after = float("inf")
    return c


def test_the_committer_says_wedged_once_the_call_runs_past_its_timeout_and_grace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(committer_mod, "OFFSETS_TIMEOUT_S", 0.2)
    monkeypatch.setattr(committer_mod, "WEDGE_GRACE_S", 0.2)
    producer = StuckProducer()
    c = committer_with(producer)
    batch = Batch([], [TopicPartition("exec", 0, 5)])  # an offset to send
    worker = threading.Thread(
        target=TransactionalCommitter._commit_once, args=(c, batch, time.monotonic() + 10)
    )
    worker.start()
    try:
        deadline = time.monotonic() + 5
        while not producer.timeouts and time.monotonic() < deadline:
            time.sleep(0.01)
        assert producer.timeouts == [0.2]  # its own timeout, not the commit's 10 s
        assert not TransactionalCommitter.wedged(c)
        time.sleep(0.5)
        assert TransactionalCommitter.wedged(c)
    finally:
        producer.release.set()
        worker.join(5)
    assert not TransactionalCommitter.wedged(c)  # the call returned


def commit_loop(deadline_s: float) -> Any:
    loop: Any = object.__new__(CommitLoop)
    loop._loop = asyncio.get_running_loop()
    loop.txn_thread = DaemonThreadExecutor("test-txn")
    loop.deadline_s = deadline_s
    return loop


def test_the_worker_gives_a_wedged_commit_up_when_the_committer_says_so() -> None:
    async def main() -> float:
        rt = commit_loop(deadline_s=30.0)
        release = threading.Event()
        since = time.monotonic()
        with pytest.raises(ClientWedged, match="send_offsets_to_transaction ran past"):
            await CommitLoop.in_txn_thread(
                rt, release.wait, 30, wedged=lambda: time.monotonic() - since > 0.5
            )
        release.set()
        return time.monotonic() - since

    took = asyncio.run(main())
    assert 0.5 <= took < 3.0  # not the 30 s deadline


def test_a_commit_that_returns_is_not_wedged_and_a_silent_one_ends_at_the_deadline() -> None:
    async def main() -> tuple[Any, float]:
        rt = commit_loop(deadline_s=1.0)
        got = await CommitLoop.in_txn_thread(rt, lambda: "committed", wedged=lambda: False)
        release = threading.Event()
        since = time.monotonic()
        with pytest.raises(ClientWedged, match="did not return within 1 s"):
            await CommitLoop.in_txn_thread(rt, release.wait, 30, wedged=lambda: False)
        release.set()
        return got, time.monotonic() - since

    got, took = asyncio.run(main())
    assert got == "committed"
    assert 1.0 <= took < 3.0


class SlowCoordinator(StuckProducer):
    """send_offsets_to_transaction times out ``times`` times (a retriable error,
    as librdkafka reports a call that ran out of time), then succeeds."""

    def __init__(self, times: int, error: KafkaError) -> None:
        super().__init__()
        self.left = times
        self.error = error
        self.committed = False

    def send_offsets_to_transaction(self, _offsets: Any, _meta: Any, timeout: float) -> None:
        self.timeouts.append(timeout)
        if self.left:
            self.left -= 1
            raise KafkaException(self.error)

    def commit_transaction(self, _timeout: float) -> None:
        self.committed = True


TIMED_OUT = KafkaError(KafkaError._TIMED_OUT, "timed out", retriable=True)
ABORTABLE = KafkaError(KafkaError._TIMED_OUT, "timed out", txn_requires_abort=True)


def test_a_send_offsets_that_timed_out_is_called_again_until_the_deadline() -> None:
    producer = SlowCoordinator(2, TIMED_OUT)
    c = committer_with(producer)
    batch = Batch([], [TopicPartition("exec", 0, 5)])
    TransactionalCommitter._commit_once(c, batch, time.monotonic() + 10)
    assert (len(producer.timeouts), producer.committed) == (3, True)
    assert all(t <= committer_mod.OFFSETS_TIMEOUT_S for t in producer.timeouts)


@pytest.mark.parametrize(
    ("error", "deadline_s", "calls"),
    [(ABORTABLE, 10.0, 1), (TIMED_OUT, 0.0, 1)],  # abortable; the commit's time is up
)
def test_an_abortable_error_or_the_deadline_ends_it(
    error: KafkaError, deadline_s: float, calls: int
) -> None:
    producer = SlowCoordinator(5, error)
    c = committer_with(producer)
    batch = Batch([], [TopicPartition("exec", 0, 5)])
    with pytest.raises(KafkaException):
        TransactionalCommitter._commit_once(c, batch, time.monotonic() + deadline_s)
    assert (len(producer.timeouts), producer.committed) == (calls, False)
