"""Client errors at the edges of the emitter and the worker: the outbox turns a
producer's fatal error into the emitter's own errors, also when it surfaces in
``poll`` (the session ends and starts over, not the process); a worker's start
retries only the errors that say "not now", resuming the registration of its
transactional id on the same producer; a batch commits only while its partitions
are still this member's and within its commit window."""

from __future__ import annotations

import time
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException, TopicPartition

from dueflow.config import load_settings
from dueflow.consumers import committer as committer_module
from dueflow.consumers.committer import Batch, CommitFailed, TransactionalCommitter
from dueflow.consumers.connection import passing as _passing
from dueflow.errors import FencedError, KafkaOperationError
from dueflow.streams.emitter.outbox import Outbox


class _Producer:
    def __init__(self, error: KafkaError) -> None:
        self.error = error
        self.polls = 0

    def poll(self, _timeout: float) -> int:
        self.polls += 1
        raise KafkaException(self.error)


def _outbox(producer: Any) -> Outbox:
    outbox = Outbox(load_settings(env={}, overrides={}), clock_ms=lambda: 0)
    for lane in outbox._lanes:
        lane.producer = producer
    return outbox


@pytest.mark.parametrize(
    ("error", "raised"),
    [
        (KafkaError(KafkaError._FENCED, "fenced by a newer instance", fatal=True), FencedError),
        (
            KafkaError(KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER, "sequence desync", fatal=True),
            FencedError,
        ),
        (KafkaError(KafkaError._TRANSPORT, "broker down"), KafkaOperationError),
    ],
)
def test_an_error_raised_by_poll_is_the_emitters_error(
    error: KafkaError, raised: type[Exception]
) -> None:
    producer = _Producer(error)
    with pytest.raises(raised, match="poll"):
        _outbox(producer).poll()
    assert producer.polls == 1


@pytest.mark.parametrize(
    ("error", "passing"),
    [
        (KafkaError(KafkaError.COORDINATOR_LOAD_IN_PROGRESS, "loading"), True),
        (KafkaError(KafkaError._TIMED_OUT, "retry call to resume", retriable=True), True),
        (KafkaError(KafkaError._TIMED_OUT, "timed out"), True),
        (KafkaError(KafkaError.NOT_COORDINATOR, "moved"), True),
        (KafkaError(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "denied"), False),
        (KafkaError(KafkaError._FENCED, "fenced", fatal=True), False),
        (KafkaError(KafkaError._TIMED_OUT, "fatal timeout", fatal=True), False),
    ],
)
def test_a_worker_retries_its_start_only_on_errors_that_pass(
    error: KafkaError, passing: bool
) -> None:
    assert _passing(KafkaException(error)) is passing
    assert _passing(ValueError("no")) is False


class _TxnProducer:
    """init_transactions fails with ``errors`` in turn, then succeeds."""

    def __init__(self, errors: list[KafkaError]) -> None:
        self.errors = errors  # shared by the producers of one committer
        self.inits = 0

    def init_transactions(self, _timeout: float) -> None:
        self.inits += 1
        if self.errors:
            raise KafkaException(self.errors.pop(0))

    def flush(self, _timeout: float) -> int:
        return 0


def _committer(
    monkeypatch: pytest.MonkeyPatch, errors: list[KafkaError]
) -> tuple[TransactionalCommitter, list[_TxnProducer]]:
    made: list[_TxnProducer] = []

    def make(*_args: Any, **_kwargs: Any) -> _TxnProducer:
        made.append(_TxnProducer(errors))
        return made[-1]

    monkeypatch.setattr(committer_module, "make_transactional_producer", make)
    settings = load_settings(env={}, overrides={})
    return TransactionalCommitter(settings, "txn-1", lambda: None, queue="q"), made


def test_a_start_that_timed_out_resumes_on_the_same_producer(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A second producer with the same transactional id would race the first
    # one's registration, which goes on in the background: whichever registers
    # last fences the other in the middle of its work.
    timed_out = KafkaError(KafkaError._TIMED_OUT, "retry call to resume", retriable=True)
    loading = KafkaError(KafkaError.COORDINATOR_LOAD_IN_PROGRESS, "loading")
    committer, made = _committer(monkeypatch, [timed_out, loading])
    for _ in range(2):
        with pytest.raises(KafkaException):
            committer.start()
        assert committer.resumable
    committer.start()
    assert len(made) == 1
    assert made[0].inits == 3
    assert not committer.resumable


def test_a_start_refused_for_good_closes_its_producer(monkeypatch: pytest.MonkeyPatch) -> None:
    denied = KafkaError(KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED, "denied")
    committer, made = _committer(monkeypatch, [denied])
    with pytest.raises(KafkaException):
        committer.start()
    assert not committer.resumable
    committer.start()  # a new producer, not the refused one
    assert len(made) == 2


class _CommitProducer:
    """Records the transactional calls a commit makes."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def begin_transaction(self) -> None:
        self.calls.append("begin")

    def produce(self, *_args: Any, **_kwargs: Any) -> None:
        self.calls.append("produce")

    def send_offsets_to_transaction(self, *_args: Any) -> None:
        self.calls.append("offsets")

    def commit_transaction(self, _timeout: float) -> None:
        self.calls.append("commit")

    def abort_transaction(self, _timeout: float) -> None:
        self.calls.append("abort")


def _started(monkeypatch: pytest.MonkeyPatch) -> tuple[TransactionalCommitter, _CommitProducer]:
    producer = _CommitProducer()
    committer = TransactionalCommitter(
        load_settings(env={}, overrides={}), "txn-1", lambda: "metadata", queue="q"
    )
    committer._producer = producer  # type: ignore[assignment]
    return committer, producer


def _batch(**kw: Any) -> Batch:
    return Batch(
        records=[(None, "t", 0, b"k", b"v", [])],
        offsets=[TopicPartition("exec", 0, 5)],
        **kw,
    )


def test_a_batch_in_its_window_commits(monkeypatch: pytest.MonkeyPatch) -> None:
    committer, producer = _started(monkeypatch)
    committer.commit(_batch(commit_by=time.monotonic() + 60))
    assert producer.calls == ["begin", "produce", "offsets", "commit"]


def test_a_batch_past_its_commit_window_is_aborted_not_committed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A worker stopped between the cut and the commit wakes up with the batch:
    # by then another member may have run its jobs (it was expelled), and the
    # group metadata read now may be a new epoch the coordinator accepts.
    committer, producer = _started(monkeypatch)
    with pytest.raises(CommitFailed, match="commit window") as failed:
        committer.commit(_batch(commit_by=time.monotonic() - 1))
    assert not failed.value.fatal
    assert producer.calls == ["begin", "produce", "abort"]


def test_a_batch_whose_partition_left_is_aborted_before_its_offsets_go(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    committer, producer = _started(monkeypatch)
    with pytest.raises(CommitFailed, match="left this member"):
        committer.commit(_batch(gone=lambda: True))
    assert producer.calls == ["begin", "produce", "abort"]
