"""Which job a cancel or a reschedule means (pure): the queue, the key, found or not."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from dueflow.errors import InvalidInput
from dueflow.producers.results import Scheduled
from dueflow.producers.targets import beyond_retention, resolve_target
from dueflow.rules.job_status import JobStatus

QUEUES = ("default", "billing", "reports")
STATUS = JobStatus(
    job_id="j",
    state="scheduled",
    queue="billing",
    task="charge",
    idempotency_key="invoice:7",
    due_ms=5_000,
    attempts=0,
    last_outcome="scheduled",
    updated_ms=1,
    last_error=None,
    schedule_id=None,
    queues=("billing",),
    history=(("scheduled", 0, 1),),
)
RECENT = Scheduled("j", 5_000, "reports", "charge", "k-recent", "hash", 3, duplicate=True)


def target(**kw: Any) -> Any:
    args: dict[str, Any] = {
        "queue": None,
        "idempotency_key": None,
        "status": None,
        "recent": None,
        "queues": QUEUES,
    }
    args.update(kw)
    return resolve_target("j", **args)


@pytest.mark.parametrize(
    ("kw", "expected"),
    [
        # found by its outcomes: their queue and key, whatever this client knows
        ({"status": STATUS}, ("billing", "invoice:7", True, "scheduled", 5_000, False)),
        (
            {"status": STATUS, "queue": "billing"},
            ("billing", "invoice:7", True, "scheduled", 5_000, False),
        ),
        # an id reused in two queues: the queue given says which; its state is not known
        (
            {"status": replace(STATUS, queues=("billing", "default")), "queue": "default"},
            ("default", "invoice:7", True, None, None, False),
        ),
        # this client scheduled it, no outcome found
        ({"recent": RECENT}, ("reports", "k-recent", True, None, 5_000, True)),
        # not known at all: written blind to the queue given
        ({"queue": "default"}, ("default", "j", False, None, None, False)),
        ({"queue": "default", "idempotency_key": "k"}, ("default", "k", False, None, None, False)),
    ],
)
def test_the_job_a_call_means(kw: dict[str, Any], expected: tuple[Any, ...]) -> None:
    t = target(**kw)
    assert (t.queue, t.idempotency_key, t.found, t.state, t.due_ms, t.known) == expected


@pytest.mark.parametrize(
    ("kw", "field", "says"),
    [
        # not known, no queue: no guess (it used to be "default", and the job ran)
        ({}, "queue", "give queue= (--queue on the command line)"),
        # the wrong queue: a cancellation there would not reach the job
        (
            {"status": STATUS, "queue": "default"},
            "queue",
            "the queue job 'j' was scheduled to ('billing')",
        ),
        ({"recent": RECENT, "queue": "default"}, "queue", "was scheduled to ('reports')"),
        # known in two queues: which one?
        (
            {"status": replace(STATUS, queues=("billing", "default"))},
            "queue",
            "known in more than one queue",
        ),
        ({"status": STATUS, "idempotency_key": "other"}, "idempotency_key", "'invoice:7'"),
        ({"queue": "nope"}, "queue", "configured queues"),
    ],
)
def test_refused_when_wrong_or_ambiguous_saying_how_to_give_it(
    kw: dict[str, Any], field: str, says: str
) -> None:
    with pytest.raises(InvalidInput) as info:
        target(**kw)
    assert info.value.field == field
    assert says in str(info.value)


@pytest.mark.parametrize(
    ("due", "beyond"),
    [(1_000 + 7 * 86_400_000 - 3_600_000, False), (1_000 + 7 * 86_400_000 - 3_599_999, True)],
)
def test_a_record_must_outlive_the_delivery_it_is_about(due: int, beyond: bool) -> None:
    week = 7 * 86_400_000
    assert beyond_retention(due, now_ms=1_000, retention_ms=week, margin_ms=3_600_000) is beyond
