"""The status view folds a batch of outcomes in memory and writes each changed
job to its changelog once, with its last view; the counts change in memory."""

from __future__ import annotations

from typing import Any

import orjson

from dueflow import headers as hdr
from dueflow.config import Settings
from dueflow.observability.metrics import Metrics
from dueflow.records.worker_codec import (
    OUTCOME_V3,
    encode_outcome,
    encode_outcome_v3,
    outcome_header,
)
from dueflow.streams.status.app import Changed, StatusView


def _view(tmp_path: Any) -> tuple[StatusView, list[tuple[str, int, Any, Any]]]:
    view = StatusView(Settings(), metrics=Metrics(), data_dir=tmp_path)
    view.fold.quarantine = None
    sent: list[tuple[str, int, Any, Any]] = []

    def send_job(job_id: str, p: int, raw: bytes | None, _staged: Any) -> None:
        sent.append(("jobs", p, job_id, None if raw is None else orjson.loads(raw)))

    view.fold._send_job = send_job  # type: ignore[method-assign,assignment]
    return view, sent


def _fold(
    view: StatusView, changed: Changed, partition: int, job_id: str, state: str, at: int
) -> None:
    value = encode_outcome(
        job_id=job_id,
        queue="default",
        task="t",
        idempotency_key=f"k-{job_id}",
        state=state,
        attempt=0,
        at_ms=at,
    )
    headers = [(hdr.SCHEMA, outcome_header(state))]
    view.fold.apply_event(partition, at, headers, value, changed, key=job_id.encode())


def test_a_batch_writes_each_changed_key_once_with_its_last_value(tmp_path: Any) -> None:
    view, sent = _view(tmp_path)
    changed = Changed()
    _fold(view, changed, 2, "a", "scheduled", 1)
    _fold(view, changed, 2, "a", "fired", 2)
    _fold(view, changed, 2, "a", "succeeded", 3)
    _fold(view, changed, 2, "b", "scheduled", 4)
    _fold(view, changed, 5, "c", "scheduled", 5)
    assert sent == [], "nothing is written before the batch ends"

    view.fold.write_changed(changed)

    jobs = {key: (p, value["state"]) for name, p, key, value in sent if name == "jobs"}
    assert jobs == {"a": (2, "succeeded"), "b": (2, "scheduled"), "c": (5, "scheduled")}
    assert sum(1 for name, *_ in sent if name == "jobs") == 3
    assert {name for name, *_ in sent} == {"jobs"}, "the counts have no changelog"
    assert view.counts.of_partition(2) == {"default": {"succeeded": 1, "scheduled": 1}}
    assert view.counts.of_partition(5) == {"default": {"scheduled": 1}}
    assert view.reads.queues()["queues"]["default"]["counts"] == {"succeeded": 1, "scheduled": 2}
    assert view.reads.job("a")["state"] == "succeeded"  # type: ignore[index]


def test_a_batch_with_nothing_usable_writes_nothing(tmp_path: Any) -> None:
    view, sent = _view(tmp_path)
    changed = Changed()
    view.fold.apply_event(0, 7, [], b"\xff\xff", changed, key=b"x")
    view.fold.write_changed(changed)
    assert sent == []
    assert view.reads.job("x") is None
    assert view.store.unsaved == 0


def test_an_outcome_v3_with_a_result_goes_to_the_changelog_as_json(tmp_path: Any) -> None:
    """A worker's Outcome v3 carries bytes (a result, a progress detail): the view
    is JSON in the changelog and the job file, so they are kept as JSON values."""
    view, sent = _view(tmp_path)
    changed = Changed()
    _fold(view, changed, 1, "r", "scheduled", 1)
    value = encode_outcome_v3(
        job_id="r",
        queue="default",
        task="t",
        idempotency_key="k-r",
        state="succeeded",
        attempt=1,
        at_ms=2,
        worker="w1",
        result=b'{"sum": 3}',
        exec_partition=4,
        command_id=None,
    )
    view.fold.apply_event(1, 2, [(hdr.SCHEMA, OUTCOME_V3)], value, changed, key=b"r")
    view.fold.write_changed(changed)
    [(_, p, key, job)] = [s for s in sent if s[0] == "jobs"]
    assert (p, key, job["state"], job["result"], job["exec_partition"]) == (
        1,
        "r",
        "succeeded",
        {"sum": 3},
        4,
    )
    assert view.reads.job("r")["result"] == {"sum": 3}  # type: ignore[index]
