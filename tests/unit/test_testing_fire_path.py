"""The in-memory pipeline fires timers through the emitter's own fire path
(dueflow.streams.emitter.firing.Firing): the same exec record as the real emitter,
and the same size rule (a timer whose exec record would not fit its exec topic is
quarantined, not fired)."""

from __future__ import annotations

from typing import Any

from dueflow import headers as hdr
from dueflow import task
from dueflow.records.record_size import record_size
from dueflow.records.size_budget import DEFAULT_MAX_MESSAGE_BYTES
from dueflow.testing import InMemoryPipeline
from dueflow.testing.log import MemoryRecord

TIMERS = "dueflow.timers"


def noting(calls: list[Any]) -> Any:
    @task("t")
    def handler(payload: Any, ctx: Any) -> None:
        calls.append(ctx.job_id)

    return handler


def _copy(p: InMemoryPipeline, timer: MemoryRecord, job_id: bytes, value: bytes) -> MemoryRecord:
    """The timer again, for job ``job_id``, with ``value`` (written past the client's
    checks, as another client could)."""
    headers = [(k, job_id if k == hdr.JOB_ID else v) for k, v in timer.headers()]
    return p.log.append(TIMERS, job_id, value, headers, timer.partition())


def test_a_timer_whose_exec_record_would_not_fit_is_quarantined_and_the_next_fires() -> None:
    calls: list[Any] = []
    with InMemoryPipeline([noting(calls)]) as p:
        p.scheduler.schedule("t", 1, job_id="small", delay="1s")
        (timer,) = p.log.records(TIMERS)
        # A timer record just under the exec topic's limit: its exec record (df-fired
        # and df-src added) is over it.
        n = DEFAULT_MAX_MESSAGE_BYTES - record_size(b"big", b"", timer.headers()) - 8
        big = _copy(p, timer, b"big", b"x" * n)
        assert record_size(big.key(), big.value(), big.headers()) <= DEFAULT_MAX_MESSAGE_BYTES
        p.run_until_idle()
        assert calls == ["small"]
        (bad,) = p.quarantined
        assert (bad.topic, bad.partition, bad.offset) == (TIMERS, big.partition(), big.offset())
        assert bad.reason.startswith("record too large: the exec record would be ")
        limit = f"over max.message.bytes {DEFAULT_MAX_MESSAGE_BYTES} of dueflow.exec.default"
        assert bad.reason.endswith(limit)


def test_a_fired_job_carries_the_timer_value_and_headers_then_df_fired_and_df_src() -> None:
    with InMemoryPipeline([noting([])]) as p:
        p.scheduler.schedule("t", {"n": 1}, job_id="j", delay="1s")
        (timer,) = p.log.records(TIMERS)
        p.run_until_idle()
        (fired,) = p.log.records("dueflow.exec.default")
        assert (fired.key(), fired.value()) == (timer.key(), timer.value())
        *own, (fired_name, fired_at), source = fired.headers()
        assert own == timer.headers()
        assert fired_name == hdr.FIRED
        assert int(fired_at) >= int(hdr.header(own, hdr.DUE) or 0)  # never early
        assert source == (
            hdr.SOURCE,
            hdr.source_of(TIMERS, timer.partition(), timer.offset()),
        )
