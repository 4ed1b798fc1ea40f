"""The status view folds a batch of outcomes in memory and writes each changed
table key to its changelog once, with its last value."""

from __future__ import annotations

from typing import Any

from dueflow import headers as hdr
from dueflow.config import Settings
from dueflow.observability.metrics import Metrics
from dueflow.records.fast import encode_outcome, outcome_header
from dueflow.streams.status.app import Changed, StatusView


def _view(tmp_path: Any) -> tuple[StatusView, list[tuple[str, int, Any, Any]]]:
    view = StatusView(Settings(), metrics=Metrics(), data_dir=tmp_path)
    view.quarantine = None
    sent: list[tuple[str, int, Any, Any]] = []
    for table in (view.jobs, view.counts):

        def record(p: int, key: Any, value: Any, *_a: Any, _n: str = table.name, **_k: Any) -> None:
            sent.append((_n, p, key, value))

        table.send_changelog = record  # type: ignore[method-assign,assignment]
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
    view.apply_event(partition, at, headers, value, changed, key=job_id.encode())


def test_a_batch_writes_each_changed_key_once_with_its_last_value(tmp_path: Any) -> None:
    view, sent = _view(tmp_path)
    changed = Changed()
    _fold(view, changed, 2, "a", "scheduled", 1)
    _fold(view, changed, 2, "a", "fired", 2)
    _fold(view, changed, 2, "a", "succeeded", 3)
    _fold(view, changed, 2, "b", "scheduled", 4)
    _fold(view, changed, 5, "c", "scheduled", 5)
    assert sent == [], "nothing is written before the batch ends"

    view.write_changed(changed)

    jobs = {key: (p, value["state"]) for name, p, key, value in sent if name == "jobs"}
    assert jobs == {"a": (2, "succeeded"), "b": (2, "scheduled"), "c": (5, "scheduled")}
    assert sum(1 for name, *_ in sent if name == "jobs") == 3
    counts = [(p, key, value) for name, p, key, value in sent if name == "queue-counts"]
    assert counts == [
        (2, "default@2", {"succeeded": 1, "scheduled": 1}),
        (5, "default@5", {"scheduled": 1}),
    ]
    assert view.jobs.data["a"]["state"] == "succeeded"


def test_a_batch_with_nothing_usable_writes_nothing(tmp_path: Any) -> None:
    view, sent = _view(tmp_path)
    changed = Changed()
    view.apply_event(0, 7, [], b"\xff\xff", changed, key=b"x")
    view.write_changed(changed)
    assert sent == []
    assert view.jobs.data == {}
