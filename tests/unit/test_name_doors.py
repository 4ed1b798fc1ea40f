"""Control characters in names: refused at every door, one rule, one message.

Job ids, idempotency keys, schedule ids and label keys with a control character
(C0, DEL, C1, line separators, bidi controls: :mod:`dueflow.control_chars`) are
refused by the scheduling client (``schedule``, its fast path, ``schedule_many``,
``add_schedule``, ``update_schedule``, ``cancel``, ``reschedule``), the test mode,
follow-ups (``ctx.schedule``) and the CLI, before anything is written; the
message names the field, shows the value escaped and says what is accepted.
"""

from __future__ import annotations

from typing import Any

import pytest

from dueflow.apps.cli.main import main
from dueflow.consumers.context import TaskContext
from dueflow.consumers.follow_ups import Attempt, FollowUpPlanner, attempt_open
from dueflow.control_chars import CONTROL_CHARS, escape_text, has_control
from dueflow.errors import InvalidInput
from dueflow.producers.schedule_client import schedule_fields
from dueflow.records.follow_up import follow_up_key
from dueflow.records.job_request import JobRequest, is_name
from dueflow.testing import InMemoryPipeline
from tests.unit.test_input_limits import _cron, plan_all
from tests.unit.test_planner import NOW, SETTINGS

HOSTILE = [
    "a\x1b[31mb",  # ESC: a terminal escape
    "nul\x00",
    "cr\rspoof",
    "lf\nspoof",
    "tab\t",
    "del\x7f",
    "csi\x9b31m",  # C1 CSI: an escape on its own
    "nel\x85",
    "rlo\u202eevil",  # bidi override: shows reversed
    "lri\u2066x",
    "alm\u061c",
    "lrm\u200e",
    "ls\u2028x",
    "ps\u2029x",
]
GOOD = ["order-7", "with space", "é-ü-日本", "emoji👍", "zwj\u200dx", "back\\x1b", "x" * 255]

RAW = set(map(chr, [*range(0x20), *range(0x7F, 0xA0)])) | set(
    "\u061c\u200e\u200f\u2028\u2029\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"
)


def no_raw_control(text: str) -> bool:
    return not (set(text) & RAW)


def test_the_set_is_c0_del_c1_separators_and_bidi_controls() -> None:
    every = {chr(c) for c in range(0x110000) if not 0xD800 <= c <= 0xDFFF}
    assert {c for c in every if has_control(c)} == RAW
    assert all(c in RAW for c in "\x00\x1b\x7f\x9b\u202e")
    assert CONTROL_CHARS  # the one definition, also in docs/wire-format.md


@pytest.mark.parametrize("name", HOSTILE)
def test_a_name_with_a_control_character_is_not_a_name(name: str) -> None:
    assert not is_name(name)


@pytest.mark.parametrize("name", GOOD)
def test_printable_names_in_any_script_are_names(name: str) -> None:
    assert is_name(name)


def assert_refused(info: pytest.ExceptionInfo[InvalidInput], field: str, name: str) -> None:
    message = str(info.value)
    assert info.value.field == field
    assert message.startswith(f"{field}: got ")
    assert escape_text(name) in message  # shown escaped...
    assert no_raw_control(message)  # ...never raw
    assert "no control characters" in message


@pytest.mark.parametrize("name", HOSTILE)
@pytest.mark.parametrize("field", ["job_id", "idempotency_key"])
def test_every_planning_path_refuses_it(field: str, name: str) -> None:
    outcomes = plan_all(JobRequest("t", {"a": 1}, **{field: name}))  # type: ignore[arg-type]
    assert outcomes == [outcomes[0]] * 2
    kind, got_field, message = outcomes[0]
    assert (kind, got_field) == ("error", field)
    assert no_raw_control(message)


@pytest.mark.parametrize("name", HOSTILE)
def test_the_scheduler_refuses_it_at_every_call(name: str) -> None:
    with InMemoryPipeline() as pipeline:
        s = pipeline.scheduler
        calls: list[tuple[str, Any]] = [
            ("job_id", lambda: s.schedule("t", job_id=name)),
            ("job_id", lambda: s.schedule("t", job_id=name, delay="1h", jitter="1s")),
            ("idempotency_key", lambda: s.schedule("t", idempotency_key=name)),
            (f"labels[{name!r}]", lambda: s.schedule("t", labels={name: "v"})),
            (
                "schedule_id",
                lambda: s.add_schedule(name, cron="* * * * *", timezone="UTC", task="t"),
            ),
            (
                f"labels[{name!r}]",
                lambda: s.add_schedule(
                    "ok", cron="* * * * *", timezone="UTC", task="t", labels={name: "v"}
                ),
            ),
            ("schedule_id", lambda: s.update_schedule(name, task="u")),
            ("job_id", lambda: s.cancel(name, queue="default")),
            ("idempotency_key", lambda: s.cancel("ok", queue="default", idempotency_key=name)),
            ("job_id", lambda: s.reschedule(name, delay="1m", queue="default")),
        ]
        for field, call in calls:
            with pytest.raises(InvalidInput) as info:
                call()
            assert_refused(info, field, name)
        bulk = s.schedule_many([{"task": "t", "job_id": "fine"}, {"task": "t", "job_id": name}])
        assert bulk.job_ids[0] == "fine"
        assert bulk.job_ids[1] is None
        assert no_raw_control(str(bulk.errors[0]))
        assert [p.job_id for p in pipeline.pending()] == ["fine"]  # nothing else written
        assert s.list_schedules() == []


def test_an_existing_schedule_with_such_an_id_can_still_be_paused_and_deleted() -> None:
    """Written by a client without these checks: it must not fire forever."""
    with InMemoryPipeline() as pipeline:
        store = pipeline.scheduler.schedules
        fields = schedule_fields(SETTINGS, **_cron(schedule_id="ok"))
        from dueflow.rules.cron import CronSchedule

        hostile = "x\x1b[2J"
        store._put(
            CronSchedule(
                version=1, created_ms=NOW, updated_ms=NOW, **{**fields, "schedule_id": hostile}
            )
        )
        assert pipeline.scheduler.pause_schedule(hostile).paused
        assert pipeline.scheduler.delete_schedule(hostile) is True
        assert pipeline.scheduler.get_schedule(hostile) is None


@pytest.mark.parametrize("name", HOSTILE)
def test_a_follow_up_refuses_it(name: str) -> None:
    planner = FollowUpPlanner(SETTINGS, declared={}, clock=lambda: NOW, running=attempt_open)
    ctx = TaskContext.for_test("parent", {})
    ctx = TaskContext(ctx._fields, 1, 1, {}, ("t", 0, 0), None, Attempt(planner))
    with pytest.raises(InvalidInput) as info:
        ctx.schedule("send", job_id=name)
    assert_refused(info, "job_id", name)
    with pytest.raises(InvalidInput) as info:
        ctx.schedule("send", idempotency_key=name)
    assert_refused(info, "idempotency_key", name)


@pytest.mark.parametrize("parent", HOSTILE)
def test_the_default_follow_up_key_of_a_hostile_parent_key_is_a_name(parent: str) -> None:
    """A parent written by another client: its follow-ups still get keys the doors take,
    one per parent key and index."""
    key = follow_up_key(parent, 2)
    assert is_name(key)
    assert key.startswith(escape_text(parent)[:20])
    assert key.endswith("/2")
    assert key != follow_up_key(parent + "x", 2)


CLI_DOORS = [
    ["schedule", "t", "--job-id", "{}"],
    ["schedule", "t", "--idempotency-key", "{}"],
    ["cancel", "{}"],
    ["cancel", "ok", "--idempotency-key", "{}"],
    ["reschedule", "{}", "--delay", "1m"],
    ["cron", "add", "{}", "--cron", "* * * * *", "--tz", "UTC", "--task", "t"],
    ["cron", "update", "{}", "--task", "u"],
]


@pytest.mark.parametrize("name", HOSTILE)
@pytest.mark.parametrize("argv", CLI_DOORS, ids=lambda a: " ".join(a[:2]))
def test_the_cli_refuses_it_before_connecting(
    argv: list[str], name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    args = [name if a == "{}" else a for a in argv]
    assert main([*args, "--bootstrap", "127.0.0.1:1"]) == 2
    out = capsys.readouterr()
    assert out.out == ""
    assert "no control characters" in out.err
    assert escape_text(name) in out.err
    assert no_raw_control(out.err.rstrip("\n"))
