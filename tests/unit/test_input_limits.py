"""Bad input at the SDK: the edges of Avro longs and ints, NaN payloads, task names.

Every accepted job encodes and reads back with fastavro; every refused one is
an :class:`InvalidInput` naming the field, the value and what is accepted,
the same from the planner of ``schedule``, its fast path and the bulk planner
of ``schedule_many`` (which reports it for that job and writes the others).
Nothing else is ever raised for bad input.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dueflow.apps.cli.main import main
from dueflow.consumers.registry import TaskSpec
from dueflow.errors import InvalidInput
from dueflow.producers.bulk import BulkRun
from dueflow.producers.bulk_plan import BulkPlanner
from dueflow.producers.core import PlannedTimer
from dueflow.producers.results import Scheduled
from dueflow.producers.schedule_client import schedule_fields
from dueflow.records.codec import decode
from dueflow.records.job_request import MAX_DUE_MS, MAX_INT32, MAX_LONG, JobRequest
from dueflow.task_name import is_task_name
from tests.unit.test_bulk_plan import FakeProducer, counting_bytes, planner
from tests.unit.test_planner import NOW, SETTINGS

LAST = datetime(9999, 12, 31, 23, 59, 59, 999_000, tzinfo=UTC)
TO_LAST_MS = MAX_DUE_MS - NOW  # the longest delay from NOW


def plan_all(req: JobRequest, now_ms: int = NOW) -> list[Any]:
    """What the two planning paths (``schedule``'s and ``schedule_many``'s) make of
    ``req``: the value bytes, or the error."""
    out: list[Any] = []
    for plan in (
        lambda: planner().plan(req, now_ms=now_ms),
        lambda: BulkPlanner(planner()).plan(req, now_ms),
    ):
        try:
            got = plan()
        except InvalidInput as exc:
            out.append(("error", exc.field, str(exc)))
            continue
        assert not isinstance(got, Scheduled)
        out.append(("value", got.record.value if isinstance(got, PlannedTimer) else got[7]))
    return out


def planned_job(req: JobRequest, now_ms: int = NOW) -> dict[str, Any]:
    """The job record ``req`` becomes, read back with fastavro (all paths agree)."""
    outcomes = plan_all(req, now_ms)
    assert outcomes[0][0] == "value", outcomes[0]
    assert outcomes.count(outcomes[0]) == 2, outcomes
    job: dict[str, Any] = decode("job", outcomes[0][1])
    return job


def refused(req: JobRequest, now_ms: int = NOW) -> InvalidInput:
    """The error ``req`` gets (all paths agree)."""
    outcomes = plan_all(req, now_ms)
    assert outcomes[0][0] == "error", outcomes[0]
    assert outcomes.count(outcomes[0]) == 2, outcomes
    with pytest.raises(InvalidInput) as info:
        planner().plan(req, now_ms=now_ms)
    return info.value


# ------------------------------------------------------------------ edges


@pytest.mark.parametrize(
    ("kwargs", "field", "stored"),
    [
        # due times up to the last millisecond a datetime holds
        ({"delay": TO_LAST_MS // 1000}, "due_ms", NOW + TO_LAST_MS // 1000 * 1000),
        ({"delay": timedelta(milliseconds=TO_LAST_MS)}, "due_ms", MAX_DUE_MS),
        ({"delay": f"{TO_LAST_MS}ms"}, "due_ms", MAX_DUE_MS),
        ({"run_at": LAST}, "due_ms", MAX_DUE_MS),
        ({"run_at": "9999-12-31T23:59:59.999Z"}, "due_ms", MAX_DUE_MS),
        ({"run_at": "1969-12-31T23:59:59Z"}, "due_ms", -1000),  # past: fires at once
        ({"run_at": LAST - timedelta(seconds=1), "jitter": "1s"}, "jitter_ms", 1000),
        # attempts: an Avro int
        ({"max_attempts": MAX_INT32}, "max_attempts", MAX_INT32),
        # timeouts and backoff times: an Avro long
        ({"timeout": MAX_LONG // 1000}, "timeout_ms", MAX_LONG // 1000 * 1000),
        ({"timeout": timedelta.max}, "timeout_ms", timedelta.max // timedelta(milliseconds=1)),
        ({"timeout": "1ms"}, "timeout_ms", 1),
        (
            {"backoff": {"kind": "fixed", "base_ms": MAX_LONG, "max_ms": MAX_LONG}},
            "backoff",
            {
                "kind": "fixed",
                "base_ms": MAX_LONG,
                "max_ms": MAX_LONG,
                "multiplier": 2.0,
                "jitter": True,
            },
        ),
    ],
)
def test_values_at_the_edges_are_stored_exactly(
    kwargs: dict[str, Any], field: str, stored: Any
) -> None:
    assert planned_job(JobRequest("t", **kwargs))[field] == stored


@pytest.mark.parametrize(
    ("kwargs", "field", "fragment"),
    [
        # one past the latest due time, and far past an Avro long
        ({"delay": TO_LAST_MS // 1000 + 1}, "delay", f"at most {TO_LAST_MS} ms from now"),
        ({"delay": timedelta(milliseconds=TO_LAST_MS + 1)}, "delay", "9999-12-31T23:59:59.999Z"),
        ({"delay": f"{TO_LAST_MS + 1}ms"}, "delay", "9999-12-31T23:59:59.999Z"),
        ({"delay": 2**63}, "delay", "9999-12-31T23:59:59.999Z"),
        ({"delay": 2**64 + 7}, "delay", "9999-12-31T23:59:59.999Z"),
        ({"delay": "100000000000000w"}, "delay", "9999-12-31T23:59:59.999Z"),
        ({"delay": timedelta.max}, "delay", "9999-12-31T23:59:59.999Z"),
        ({"delay": 1e300}, "delay", "9999-12-31T23:59:59.999Z"),
        ({"delay": 1e306}, "delay", "must be finite"),  # 1e309 ms is infinity
        ({"delay": "1e306"}, "delay", "must be finite"),
        ({"delay": "9" * 400 + "s"}, "delay", "must be finite"),
        ({"delay": 1e17}, "delay", "9999-12-31T23:59:59.999Z"),
        ({"delay": float("inf")}, "delay", "'30s'"),
        ({"delay": float("nan")}, "delay", "'30s'"),
        ({"run_at": "9999-12-31T23:59:59.999-00:01"}, "run_at", "at or before 9999-12-31"),
        ({"run_at": LAST, "jitter": "1ms"}, "jitter", "at most 0 ms after the due time"),
        ({"jitter": 2**62}, "jitter", "a window ending at or before 9999-12-31"),
        ({"max_attempts": MAX_INT32 + 1}, "max_attempts", f"from 1 to {MAX_INT32}"),
        ({"max_attempts": 2**63}, "max_attempts", f"from 1 to {MAX_INT32}"),
        ({"timeout": MAX_LONG // 1000 + 1}, "timeout", f"at most {MAX_LONG} ms"),
        ({"timeout": 2**64}, "timeout", f"at most {MAX_LONG} ms"),
        ({"timeout": "1e300"}, "timeout", f"at most {MAX_LONG} ms"),
        ({"timeout": "9" * 400 + "ms"}, "timeout", "must be finite"),
        ({"timeout": 0.0001}, "timeout", "at least 1 ms"),
        ({"backoff": {"kind": "fixed", "base_ms": MAX_LONG + 1}}, "backoff.base_ms", "0 to"),
        ({"backoff": {"kind": "fixed", "max_ms": 2**64}}, "backoff.max_ms", "0 to"),
        ({"backoff": "exponential:1:99999999999999999999"}, "backoff.max_ms", "0 to"),
        ({"backoff": {"kind": "fixed", "multiplier": float("nan")}}, "backoff.multiplier", "1"),
        ({"job_id": "a\ud800b"}, "job_id", "valid UTF-8"),
        ({"idempotency_key": "\udfff"}, "idempotency_key", "valid UTF-8"),
        ({"labels": {"k": "\ud800"}}, "labels", "valid UTF-8"),
    ],
)
def test_values_beyond_the_edges_are_refused_naming_field_value_and_accepted(
    kwargs: dict[str, Any], field: str, fragment: str
) -> None:
    err = refused(JobRequest("t", **kwargs))
    assert err.field == field
    assert fragment in err.accepted, err.accepted
    shown = kwargs.get(field.split(".")[0])
    if field in kwargs and isinstance(shown, str | int) and len(repr(shown)) < 150:
        assert repr(shown) in str(err)  # the value is in the message


# ------------------------------------------------------------------ NaN payloads


@dataclasses.dataclass
class Reading:
    sensor: str
    value: float


class Level(enum.Enum):
    UNKNOWN = float("nan")


@pytest.mark.parametrize(
    ("payload", "path"),
    [
        (float("nan"), "payload"),
        (float("inf"), "payload"),
        ({"a": float("-inf")}, "payload['a']"),
        ({"a": [1, 2.5, float("nan")]}, "payload['a'][2]"),
        ([{"x": None}, {"y": {"z": (0, float("inf"))}}], "payload[1]['y']['z'][1]"),
        ({"r": Reading("s1", float("nan"))}, "payload['r'].value"),
        ({"level": Level.UNKNOWN}, "payload['level']"),
        ({".value": [float("nan")]}, "payload['.value'][0]"),  # a key, not an attribute
    ],
)
def test_a_nan_or_infinite_payload_is_refused_naming_its_path(payload: Any, path: str) -> None:
    err = refused(JobRequest("t", payload))
    assert err.field == path
    assert "JSON has no NaN or Infinity" in err.accepted
    assert isinstance(err.value, float)
    assert not math.isfinite(err.value)


@pytest.mark.parametrize("payload", [None, {"a": None, "null": "null"}, [None, 1.5, -0.0]])
def test_nulls_and_finite_numbers_are_still_accepted(payload: Any) -> None:
    job = planned_job(JobRequest("t", payload))
    assert job["content_type"] == "application/json"


def test_a_nan_cron_payload_is_refused_too() -> None:
    with pytest.raises(InvalidInput) as info:
        schedule_fields(SETTINGS, **_cron(payload={"x": [float("nan")]}))
    assert info.value.field == "payload['x'][0]"


# ------------------------------------------------------------------ task names

TASK_NAMES = [
    ("send_email", True),
    ("email.send", True),
    ("billing:charge/v2-x", True),
    ("x" * 200, True),
    ("x" * 201, False),
    ("", False),
    ("send email", False),
    ("tâche", False),
    ("report\n", False),  # a trailing newline: `$` in a regex would let it pass
    ("a;b", False),
    (None, False),
    (7, False),
]


@pytest.mark.parametrize(("name", "ok"), TASK_NAMES)
def test_the_sdk_refuses_exactly_the_task_names_a_worker_refuses(name: Any, ok: bool) -> None:
    assert _worker_accepts(name) is ok
    assert _sdk_accepts(name) is ok
    assert _cron_accepts(name) is ok
    if not ok:
        err = refused(JobRequest(name))
        assert err.field == "task"
        assert "the names a worker can register with @task" in err.accepted


@settings(max_examples=300, deadline=None)
@given(name=st.one_of(st.text(max_size=8), st.from_regex(r"[A-Za-z0-9_.:/ -]{0,205}")))
def test_property_sdk_and_worker_agree_on_every_task_name(name: str) -> None:
    assert _sdk_accepts(name) is _worker_accepts(name) is is_task_name(name)


def _worker_accepts(name: Any) -> bool:
    try:
        TaskSpec(name).validate()
    except InvalidInput:
        return False
    return True


def _sdk_accepts(name: Any) -> bool:
    outcomes = plan_all(JobRequest(name))
    assert outcomes.count(outcomes[0]) == 2
    return bool(outcomes[0][0] == "value")


def _cron_accepts(name: Any) -> bool:
    try:
        schedule_fields(SETTINGS, **_cron(task=name))
    except InvalidInput:
        return False
    return True


def _cron(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "schedule_id": "s",
        "cron": "* * * * *",
        "timezone": "UTC",
        "task": "t",
        "payload": None,
        "queue": "default",
        "misfire": "skip",
        "jitter": None,
        "start": None,
        "end": None,
        "max_attempts": None,
        "backoff": None,
        "timeout": None,
        "labels": None,
        "paused": False,
    }
    base.update(fields)
    return base


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"timeout": 2**64}, "timeout"),
        ({"timeout": "1e300"}, "timeout"),
        ({"jitter": "1e300"}, "jitter"),
        ({"jitter": 2**40}, "jitter"),
        ({"max_attempts": MAX_INT32 + 1}, "max_attempts"),
    ],
)
def test_cron_schedule_limits(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidInput) as info:
        schedule_fields(SETTINGS, **_cron(**fields))
    assert info.value.field == field


# ------------------------------------------------------------------ properties

HUGE_INTS = st.one_of(
    st.integers(-(2**70), 2**70),
    st.sampled_from([2**31 - 1, 2**31, 2**62, 2**63 - 1, 2**63, 2**64, -(2**63) - 1]),
)
FLOATS = st.floats(allow_nan=True, allow_infinity=True)
DURATIONS = st.one_of(
    st.none(),
    HUGE_INTS,
    FLOATS,
    st.timedeltas(),
    st.from_regex(r"-?[0-9]{1,25}(\.[0-9]{1,3})?(ms|s|m|h|d|w)?", fullmatch=True),
    st.sampled_from(["1e300", "1e308s", "inf", "nan", "", "soon"]),
)
WILD = st.builds(
    JobRequest,
    task=st.one_of(st.sampled_from(["t", "bad name", ""]), st.text(max_size=3)),
    payload=st.one_of(
        st.none(),
        FLOATS,
        st.dictionaries(st.text(max_size=3), st.one_of(FLOATS, HUGE_INTS), max_size=3),
        st.lists(st.one_of(FLOATS, st.text(max_size=3)), max_size=3),
        st.binary(max_size=8),
    ),
    run_at=st.one_of(
        st.none(),
        st.datetimes(timezones=st.just(UTC)),
        st.datetimes(timezones=st.sampled_from([UTC, None])).map(str),
    ),
    delay=DURATIONS,
    job_id=st.one_of(st.none(), st.text(max_size=4), st.just("\ud800")),
    max_attempts=st.one_of(st.none(), HUGE_INTS, st.just(True)),
    backoff=st.one_of(
        st.none(),
        st.builds(
            lambda b, m, k: {"kind": k, "base_ms": b, "max_ms": m},
            HUGE_INTS,
            HUGE_INTS,
            st.sampled_from(["fixed", "exponential", "none"]),
        ),
        st.from_regex(r"(exponential|fixed):[0-9]{1,22}(:[0-9]{1,22})?", fullmatch=True),
    ),
    timeout=DURATIONS,
    jitter=DURATIONS,
    labels=st.one_of(st.none(), st.just({"k": "v"})),
)


@settings(max_examples=800, deadline=None)
@given(req=WILD, now=st.integers(0, 4 * 10**12))
def test_property_a_request_is_planned_and_reads_back_or_refused_with_invalid_input(
    req: JobRequest, now: int
) -> None:
    outcomes = plan_all(req, now)  # anything but InvalidInput would raise here
    assert outcomes.count(outcomes[0]) == 2, outcomes
    if outcomes[0][0] == "value":
        job = decode("job", outcomes[0][1])
        assert job["due_ms"] <= MAX_DUE_MS
        assert is_task_name(job["task"])
        assert job["timeout_ms"] is None or 1 <= job["timeout_ms"] <= MAX_LONG


# ------------------------------------------------------------------ schedule_many


def test_schedule_many_reports_each_bad_job_and_writes_every_good_one() -> None:
    p = planner(counting_bytes())
    producer = FakeProducer()
    jobs: list[Any] = [
        JobRequest("t", {"i": 0}, delay=5),
        JobRequest("t", {"i": 1}, delay=2**62),  # was a ValueError that ended the call
        {"task": "t", "payload": {"i": 2}, "job_id": "two", "delay": "100000000000000w"},
        JobRequest("t", {"i": 3, "x": float("nan")}),
        JobRequest("bad task", {"i": 4}),
        JobRequest("t", {"i": 5}, timeout=2**64, job_id="five"),
        JobRequest("t", {"i": 6}, run_at=LAST, jitter="1s"),
        {"task": "t", "payload": {"i": 7}, "delay": 1e300},
        JobRequest("t", {"i": 8}, max_attempts=2**31),
        JobRequest("t", {"i": 9}, delay=TO_LAST_MS // 1000),
    ]
    result = BulkRun(p, producer, clock=lambda: NOW).run(jobs, flush_timeout_s=1)  # type: ignore[arg-type]
    assert (result.total, result.scheduled, result.failed) == (10, 2, 8)
    assert [(e.index, e.job_id, e.field) for e in result.errors] == [
        (1, None, "delay"),
        (2, "two", "delay"),
        (3, None, "payload['x']"),
        (4, None, "task"),
        (5, "five", "timeout"),
        (6, None, "jitter"),
        (7, None, "delay"),
        (8, None, "max_attempts"),
    ]
    assert str(result.errors[1]).startswith(
        "jobs[2] (job id 'two'): delay: got '100000000000000w'; accepted: a duration putting"
    )
    assert str(result.errors[0]).startswith("jobs[1]: delay: got 4611686018427387904; accepted")
    # the good jobs, and only they, were written, each one whole
    written = [decode("job", r[1]) for r in producer.records]
    assert [w["payload"] for w in written] == [b'{"i":0}', b'{"i":9}']
    assert [w["job_id"] for w in written] == [result.job_ids[0], result.job_ids[9]]
    assert result.job_ids[1:9] == [None] * 8
    assert result.due_ms[9] == NOW + TO_LAST_MS // 1000 * 1000


# ------------------------------------------------------------------ CLI


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["schedule", "t", "--delay", "100000000000000w"], "delay: got '100000000000000w'"),
        (["schedule", "t", "--delay", "1e300"], "delay: got '1e300'"),
        (["schedule", "t", "--timeout", "1e30"], "timeout: got '1e30'"),
        (["schedule", "t", "--at", "9999-12-31T23:59:59.999-01:00"], "run_at"),
        (["schedule", "t", "--max-attempts", str(2**31)], "max_attempts"),
        (["schedule", "send email"], "task: got 'send email'"),
        (["cron", "add", "c", "--cron", "* * * * *", "--tz", "UTC", "--task", "a b"], "task"),
    ],
)
def test_the_cli_refuses_before_connecting(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "--bootstrap", "127.0.0.1:1"]) == 2
    assert message in capsys.readouterr().err


# ------------------------------------------------------------------ cron numbers

ABSURD_CRONS = [
    ("*/" + "9" * 20 + " * * * *", "minute field '*/99999999999999999999': step must be"),
    ("0 */25 * * *", "hour field '*/25': step must be an integer from 1 to 24"),
    ("0 0 */0032 * *", "day-of-month field '*/0032'"),
    ("0 0 1 */13 *", "month field '*/13'"),
    ("0 0 * * */9", "day-of-week field '*/9'"),
    ("*/61 * * * * *", "second field '*/61'"),
    ("0005 * * * *", "'0005' has more digits than any value"),
    ("0 0-" + "9" * 20 + " * * *", "hour field '0-99999999999999999999'"),
    ("0 0 0 1 1 * 2030", "a year field is not supported"),
]


@pytest.mark.parametrize(("cron", "message"), ABSURD_CRONS)
def test_absurd_cron_numbers_are_refused_by_the_sdk(cron: str, message: str) -> None:
    with pytest.raises(InvalidInput) as info:
        schedule_fields(SETTINGS, **_cron(cron=cron))
    assert info.value.field == "cron"
    assert message in str(info.value)


@pytest.mark.parametrize(("cron", "message"), ABSURD_CRONS)
def test_absurd_cron_numbers_are_refused_by_the_test_mode(cron: str, message: str) -> None:
    from dueflow.testing import InMemoryPipeline

    with InMemoryPipeline() as pipeline:
        with pytest.raises(InvalidInput, match="cron") as info:
            pipeline.scheduler.add_schedule("s", cron=cron, timezone="UTC", task="t")
        assert message in str(info.value)
        assert pipeline.scheduler.list_schedules() == []


@pytest.mark.parametrize(("cron", "message"), ABSURD_CRONS)
def test_absurd_cron_numbers_are_refused_by_the_cli(
    cron: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    for argv in (
        ["cron", "add", "c", "--cron", cron, "--tz", "UTC", "--task", "t"],
        ["cron", "update", "c", "--cron", cron],
    ):
        assert main([*argv, "--bootstrap", "127.0.0.1:1"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("dueflow: cron: got ")
        assert message in err
