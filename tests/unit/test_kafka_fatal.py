"""A fatal client error that confluent-kafka raises as a bare KafkaError object (seen with
confluent-kafka 2.16 on Python 3.11: an emitter fenced while its lease was revoked died
of it) is raised as the KafkaException every caller handles."""

from __future__ import annotations

import ctypes
import logging
import sys
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

from dueflow.config import load_settings
from dueflow.consumers.committer import TransactionalCommitter
from dueflow.consumers.quarantine import Quarantine
from dueflow.errors import FencedError
from dueflow.kafka.fatal import served
from dueflow.observability.metrics import Metrics
from dueflow.producers.scheduler import Scheduler
from dueflow.streams.emitter import txn_lane

FENCED = KafkaError(KafkaError._FENCED, "fenced by a newer instance", fatal=True)

_api = ctypes.pythonapi
_api.PyErr_Restore.argtypes = [ctypes.py_object, ctypes.py_object, ctypes.c_void_p]
_api.Py_IncRef.argtypes = [ctypes.py_object]


def raise_bare(obj: object) -> None:
    """Raise ``obj`` itself, not an exception, as confluent-kafka's callback path does
    (Python code cannot: ``raise`` wants a BaseException)."""
    _api.Py_IncRef(type(obj))
    _api.Py_IncRef(obj)
    _api.PyErr_Restore(type(obj), obj, None)  # ctypes raises what it set


class FencedClient:
    """A producer whose fatal error comes out of poll and flush as the bare object."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, float]] = []

    def poll(self, timeout_s: float) -> int:
        self.calls.append(("poll", timeout_s))
        raise_bare(FENCED)
        return 0

    def flush(self, timeout_s: float) -> int:
        self.calls.append(("flush", timeout_s))
        raise_bare(FENCED)
        return 0


def test_the_bare_object_escapes_every_except_clause_that_names_a_class() -> None:
    # what made the emitter die: neither KafkaException nor Exception catches it
    caught: list[object] = []
    try:
        try:
            raise_bare(FENCED)
        except Exception:
            caught.append("an Exception")
    except:  # noqa: E722
        caught.append(sys.exc_info()[1])
    assert caught == [FENCED]


def test_served_raises_it_as_a_kafka_exception_with_the_error() -> None:
    client = FencedClient()
    with pytest.raises(KafkaException) as err:
        served(client.flush, 1.0)
    assert err.value.args[0] is FENCED
    assert err.value.args[0].fatal()
    assert client.calls == [("flush", 1.0)]


def test_served_passes_results_and_other_errors_through() -> None:
    assert served(lambda t: int(t * 10), 0.5) == 5
    real = KafkaException(KafkaError(KafkaError._TIMED_OUT))

    def times_out(_t: float) -> int:
        raise real

    with pytest.raises(KafkaException) as err:
        served(times_out, 0.1)
    assert err.value is real

    def broken(_t: float) -> int:
        raise ValueError("not a client error")

    with pytest.raises(ValueError, match="not a client error"):
        served(broken, 0.1)


def test_the_emitters_poll_ends_the_session_not_the_process() -> None:
    with pytest.raises(FencedError, match="poll: fenced by another emitter"):
        txn_lane.serve(FencedClient(), 0.0)  # type: ignore[arg-type]


def test_closing_a_fenced_emitter_lane_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    client = FencedClient()
    lane = txn_lane.Lane(txn_id="e-1", spares_wanted=0, producer=client)  # type: ignore[arg-type]
    with caplog.at_level(logging.WARNING):
        lane.close(abort=True)
    assert client.calls == [("flush", 1.0)]
    assert lane.producer is None
    assert any(r.getMessage() == "producer close failed" for r in caplog.records)


def test_closing_a_fenced_worker_committer_goes_on(caplog: pytest.LogCaptureFixture) -> None:
    client = FencedClient()
    committer: Any = object.__new__(TransactionalCommitter)
    committer._producer = client
    committer._started = True
    committer._queue = "q"
    with caplog.at_level(logging.WARNING):
        TransactionalCommitter.close(committer)
    assert client.calls == [("flush", 1.0)]
    assert committer._producer is None
    assert any(r.getMessage() == "producer close failed" for r in caplog.records)


class _Accepting(FencedClient):
    """Takes the record, then its fatal error comes out of poll and flush."""

    def __init__(self) -> None:
        super().__init__()
        self.produced = 0

    def produce(self, *_args: Any, **_kw: Any) -> None:
        self.produced += 1

    def __len__(self) -> int:  # records not yet acknowledged
        return self.produced


def test_the_quarantine_never_raises_a_fatal_producer_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    client = _Accepting()
    box = Quarantine(load_settings(env={}), Metrics(), component="worker")
    box._producer = client  # type: ignore[assignment]
    with caplog.at_level(logging.WARNING):
        box.put_raw(
            topic="t", partition=0, offset=7, key=b"k", value=b"x", headers=None, reason="bad"
        )
    assert client.produced == 1
    assert client.calls == [("poll", 0)]
    assert any(r.getMessage() == "quarantine write failed" for r in caplog.records)


def test_the_scheduler_raises_a_fatal_producer_error_as_a_kafka_exception() -> None:
    # what a caller's `except KafkaException` (or `except Exception`) can catch
    client = _Accepting()
    client.produce()
    scheduler: Any = object.__new__(Scheduler)
    scheduler._producer = client
    scheduler.delivery_timeout_s = 3.0
    with pytest.raises(KafkaException) as err:
        Scheduler._read_own_writes(scheduler)
    assert err.value.args[0] is FENCED
