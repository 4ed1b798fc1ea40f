"""The chaos suite's judge counts what it must: every rule has a case that fails it.

Each test starts from a clean run (:func:`clean`: every job ended as it should)
and breaks one thing by hand; the matching passing case sits next to it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import pytest

from tests.chaos.facts import (
    DeadLetter,
    Dropped,
    Evidence,
    Fault,
    Fire,
    Outcome,
    RetryPlan,
    Rules,
)
from tests.chaos.ledger import Effect, Run
from tests.chaos.verdict import broken, judge, unfinished
from tests.chaos.workload import Accepted, CronRun, Steered, plan_jobs, plan_steering

T = 1_700_000_000_000  # a whole second: cron "*/2 * * * * *" fires on it
CRON = [T, T + 2000, T + 4000, T + 6000]  # expected: after added + 2 s, before deletion - 3 s
PLANS = {
    "chaos-flaky": RetryPlan(5, (500,)),
    "chaos-doomed": RetryPlan(3, (500,)),
    "chaos-permanent": RetryPlan(1),
}
DEFAULT_PLAN = RetryPlan(4, (500, 2000))  # every wait: 500 + 2000 + 2000 ms


def run(
    key: str,
    attempt: int = 1,
    started: int = T + 10,
    *,
    pid: int = 1,
    ended: int | None = None,
    result: str | None = "ok",
    task: str = "t",
) -> Run:
    end = started + 10 if ended is None and result is not None else ended
    return Run(key, key, task, attempt, started, T, T, pid, end, result)


def out(key: str, state: str, attempt: int, ts: int, pid: int | None = 1) -> Outcome:
    return Outcome(key, key, state, attempt, ts, pid)


def clean() -> dict[str, Any]:
    """The fields of an Evidence where every job ended right."""
    cron_keys = [f"c@{o}" for o in CRON]
    return {
        "accepted": [
            Accepted("a", "ok", T, T, "chaos-ok"),
            Accepted("f", "flaky", T, T, "chaos-flaky", fail_times=1),
            Accepted("d", "doomed", T, T, "chaos-doomed"),
            Accepted("p", "permanent", T, T, "chaos-permanent"),
        ],
        # added 2.5 s before T: the first expected occurrence is the first after T - 0.5 s
        "cron": [CronRun("c", "*/2 * * * * *", T - 2_500, T + 9_000)],
        "runs": [
            run("a"),
            run("f", 1, T + 10, result="failed"),
            run("f", 2, T + 600),
            run("d", 1, T + 10, result="failed"),
            run("d", 2, T + 600, result="failed"),
            run("d", 3, T + 1200, result="failed"),
            run("p", 1, T + 10, result="failed"),
            *(run(k, 1, o + 10) for k, o in zip(cron_keys, CRON, strict=True)),
        ],
        "effects": {
            "a": Effect(1, T + 15, 1),
            "f": Effect(2, T + 605, 1),
            **{k: Effect(1, o + 15, 1) for k, o in zip(cron_keys, CRON, strict=True)},
        },
        "outcomes": [
            out("a", "succeeded", 1, T + 30),
            out("f", "retrying", 1, T + 30),
            out("f", "succeeded", 2, T + 630),
            out("d", "retrying", 1, T + 30),
            out("d", "retrying", 2, T + 630),
            out("d", "dead", 3, T + 1230),
            out("p", "dead", 1, T + 30),
            *(out(k, "succeeded", 1, o + 30) for k, o in zip(cron_keys, CRON, strict=True)),
        ],
        "dead_letters": [
            DeadLetter("d", "d", "exhausted", 3),
            DeadLetter("p", "p", "permanent_error", 1),
        ],
        "fires": [Fire(k, k) for k in ("a", "f", "d", "p", *cron_keys)],
        "faults": [Fault("kill_worker", T - 60_000, T - 60_000, frozenset({99}))],
        "plans": PLANS,
        "default_plan": DEFAULT_PLAN,
        "emitter_pids": frozenset({50}),
    }


def evidence(**over: Any) -> Evidence:
    fields = clean()
    fields.update(over)
    return Evidence(**fields)


def changed(name: str, change: Callable[[list[Any]], list[Any]]) -> Evidence:
    """The clean evidence with one of its lists changed."""
    fields = clean()
    fields[name] = change(list(fields[name]))
    return Evidence(**fields)


def without(name: str, drop: Callable[[Any], bool]) -> Evidence:
    return changed(name, lambda xs: [x for x in xs if not drop(x)])


def plus(name: str, *items: Any) -> Evidence:
    return changed(name, lambda xs: xs + list(items))


def test_a_clean_run_breaks_nothing() -> None:
    got = judge(evidence())
    assert broken(got) == []
    assert got["jobs"] == 4 + 4
    assert got["cron_occurrences"] == 4
    assert (got["lost"], got["unexcused"], got["early"], got["duplicates"]) == (0, 0, 0, 0)
    assert (got["double_fires"], got["dlq_unexpected"], got["retry_early"]) == (0, 0, 0)
    assert (got["flaky_ok"], got["flaky_jobs"], got["flaky_wrong_attempt"]) == (1, 1, 0)
    assert (got["dlq_expected"], got["dlq_expected_of"]) == (2, 2)
    assert got["late_terminal"] == 0
    assert got["terminal_lateness_ms"]["max"] == 1230
    assert got["reexecutions"] == 0


# ------------------------------------------------------------------ lost


def test_a_job_the_handler_ran_but_kafka_never_committed_is_lost() -> None:
    # the ledger has a's run and effect; its succeeded outcome is not in Kafka
    got = judge(without("outcomes", lambda o: o.key == "a"))
    assert got["lost_keys"] == ["a"]
    assert got["lost_by_stage"] == {"ran, last outcome none": 1}
    assert "lost = 1" in broken(got)


def test_a_job_whose_retry_vanished_is_lost() -> None:
    # the paused-partition bug: attempt 1 failed and committed "retrying", nothing after
    ev = without("outcomes", lambda o: o.key == "f" and o.state == "succeeded")
    got = judge(replace(ev, runs=[r for r in ev.runs if not (r.key == "f" and r.attempt == 2)]))
    assert got["lost_keys"] == ["f"]
    assert got["lost_by_stage"] == {"ran, last outcome retrying": 1}
    assert got["flaky_ok"] == 0


def test_a_dead_outcome_is_terminal_and_an_unfired_job_is_lost_as_never_fired() -> None:
    assert judge(evidence())["lost"] == 0  # d and p end dead: not lost
    ev = without("outcomes", lambda o: o.key == "a")
    ev = replace(ev, runs=[r for r in ev.runs if r.key != "a"], fires=ev.fires[1:])
    assert judge(ev)["lost_by_stage"] == {"never fired, last outcome none": 1}
    assert unfinished(ev) == ["a"]
    assert unfinished(evidence()) == []


# ------------------------------------------------------------------ cron


def test_a_cron_occurrence_missing_right_after_creation_is_lost() -> None:
    got = judge(without("outcomes", lambda o: o.key == f"c@{T}"))
    assert got["lost_keys"] == [f"c@{T}"]
    assert got["cron"]["c"]["missing"] == [f"c@{T}"]


def test_occurrences_inside_the_read_margin_or_near_deletion_are_not_expected() -> None:
    # T - 2000 is 0.5 s after the schedule was added: the emitter may not have read it yet
    got = judge(plus("outcomes", out(f"c@{T - 2000}", "succeeded", 1, T)))
    assert got["cron_occurrences"] == 4
    # deleted at T + 9 s: T + 8 s is inside the end margin (3 s), not required
    assert f"c@{T + 8000}" not in judge(evidence())["lost_keys"]


def test_a_fault_that_stops_the_emitter_at_creation_moves_the_first_expected_occurrence() -> None:
    kill = Fault("kill_active_emitter", T - 2_000, T - 2_000, frozenset({50}))
    ev = without("outcomes", lambda o: o.key.startswith("c@"))
    ev = replace(ev, faults=[kill])
    # expected from the fault's end + 15 s: none before deletion - 3 s
    assert judge(ev)["cron_occurrences"] == 0
    # a worker's kill does not stop the emitter: the occurrences stay expected
    got = judge(replace(ev, faults=[replace(kill, kind="kill_worker", pids=frozenset({7}))]))
    assert got["lost"] == 4


def test_a_measured_takeover_longer_than_the_rule_moves_the_first_expected_occurrence() -> None:
    """A kill of the active emitter 16 s before T: the 15 s rule expects c@T; the run
    measured an 18 s takeover (a broker outage meanwhile), so the new emitter read the
    schedule about T + 2 s and placed its first occurrence after that."""
    kill = Fault("kill_active_emitter", T - 16_000, T - 16_000, frozenset({50}))
    ev = without("outcomes", lambda o: o.key in (f"c@{T}", f"c@{T + 2000}", f"c@{T + 4000}"))
    assert judge(replace(ev, faults=[kill]))["lost"] == 3
    got = judge(replace(ev, faults=[replace(kill, takeover_ms=18_000)]))
    assert got["lost"] == 0
    assert got["cron"]["c"]["from_ms"] == T + 4_000


def test_an_emitter_clock_ahead_moves_the_first_expected_occurrence() -> None:
    ev = without("outcomes", lambda o: o.key == f"c@{T}")
    assert judge(ev)["lost"] == 1
    assert judge(replace(ev, skews={50: 1_000}))["lost"] == 0  # placed after T + 0.5 s


def test_a_cron_occurrence_that_ended_twice_is_a_duplicate() -> None:
    got = judge(plus("outcomes", out(f"c@{T}", "succeeded", 1, T + 900)))
    assert got["duplicate_keys"] == [f"c@{T}"]


# ------------------------------------------------------------------ late


@pytest.mark.parametrize(
    ("ended_after_due", "faults", "late"),
    [
        (4_500 + 60_000, [], 0),  # retry plan + slack: just in time
        (4_500 + 60_001, [], 1),
        (4_500 + 70_000, [Fault("restart_broker", T + 1_000, T + 11_000)], 0),  # outage: 10 s
        (4_500 + 70_001, [Fault("restart_broker", T + 1_000, T + 11_000)], 1),
        (4_500 + 70_001, [Fault("kill_worker", T + 1_000, T + 11_000, frozenset({1}))], 1),
        (4_500 + 70_001, [Fault("restart_broker", T + 80_000, T + 90_000)], 1),  # after it ended
    ],
)
def test_a_terminal_outcome_after_due_plus_bound_is_late(
    ended_after_due: int, faults: list[Fault], late: int
) -> None:
    ev = changed(
        "outcomes",
        lambda xs: [replace(o, ts_ms=T + ended_after_due) if o.key == "a" else o for o in xs],
    )
    got = judge(replace(ev, faults=faults))
    assert got["late_terminal"] == late
    assert got["terminal_lateness_ms"]["max"] == ended_after_due


def test_the_slack_is_a_rule() -> None:
    ev = changed(
        "outcomes", lambda xs: [replace(o, ts_ms=T + 10_000) if o.key == "a" else o for o in xs]
    )
    assert judge(ev, Rules(slack_ms=5_000))["late_terminal"] == 1
    assert judge(ev)["late_terminal"] == 0


# ------------------------------------------------------------------ early


@pytest.mark.parametrize(
    ("started", "skews", "early"),
    [
        (T, {}, 0),  # at the due time: not early (tolerance 0)
        (T - 1, {}, 1),
        (T + 3, {2: 5}, 1),  # its clock was 5 ms ahead: it really started at T - 2
        (T - 3, {2: -5}, 0),  # its clock was 5 ms behind: it really started at T + 2
    ],
)
def test_early_is_against_the_requested_time_corrected_by_the_runs_skew(
    started: int, skews: dict[int, int], early: int
) -> None:
    ev = changed(
        "runs", lambda xs: [run("a", started=started, pid=2) if r.key == "a" else r for r in xs]
    )
    got = judge(replace(ev, skews=skews))
    assert got["early"] == early
    if early:
        assert got["early_runs"][0]["key"] == "a"


def test_early_ignores_the_records_own_due_header() -> None:
    # the scheduler returned (and the record carries) a due time 1 s before the requested one
    fields = clean()
    fields["accepted"] = [Accepted("a", "ok", T - 1_000, T, "chaos-ok"), *fields["accepted"][1:]]
    fields["runs"] = [
        Run("a", "a", "t", 1, T - 500, T - 1_000, T - 1_000, 1, T - 490, "ok"),
        *fields["runs"][1:],
    ]
    got = judge(Evidence(**fields))
    assert got["early"] == 1
    assert got["due_mismatch"] == 1


def test_a_cron_run_before_its_occurrence_is_early() -> None:
    got = judge(plus("runs", run(f"c@{T + 2000}", 1, T + 1_999)))
    assert [e["key"] for e in got["early_runs"]] == [f"c@{T + 2000}"]


# ------------------------------------------------------------------ flaky and retries


def test_a_flaky_job_that_succeeded_on_attempt_1_is_wrong() -> None:
    ev = changed(
        "outcomes",
        lambda xs: [o for o in xs if o.key != "f"] + [out("f", "succeeded", 1, T + 30)],
    )
    ev = replace(ev, effects={**ev.effects, "f": Effect(1, T + 15, 1)})
    got = judge(ev)
    assert (got["flaky_wrong_attempt"], got["flaky_ok"]) == (1, 0)
    assert got["flaky_wrong"] == [{"key": "f", "want": 2, "succeeded": [1], "effect": 1}]


def test_a_flaky_job_whose_effect_came_from_another_attempt_is_wrong() -> None:
    ev = evidence()
    got = judge(replace(ev, effects={**ev.effects, "f": Effect(3, T + 15, 1)}))
    assert got["flaky_wrong_attempt"] == 1


@pytest.mark.parametrize(("second_start", "early"), [(T + 520, 0), (T + 519, 1)])
def test_a_retry_before_the_failure_plus_backoff_is_early(second_start: int, early: int) -> None:
    # attempt 1 ended (failed) at T + 20; the backoff is 500 ms
    ev = changed(
        "runs",
        lambda xs: [run("f", 2, second_start) if (r.key, r.attempt) == ("f", 2) else r for r in xs],
    )
    assert judge(ev)["retry_early"] == early


def test_retry_times_are_corrected_by_each_processs_skew() -> None:
    # attempt 2 ran in pid 2, whose clock is 100 ms ahead: it really started at T + 500
    ev = changed(
        "runs",
        lambda xs: [
            run("f", 2, T + 600, pid=2) if (r.key, r.attempt) == ("f", 2) else r for r in xs
        ],
    )
    assert judge(replace(ev, skews={2: 100}))["retry_early"] == 1
    assert judge(ev)["retry_early"] == 0


# ------------------------------------------------------------------ re-executions


KILLED = Fault("kill_worker", T + 100, T + 100, frozenset({1}))


@pytest.mark.parametrize(
    ("faults", "excused", "unexcused"),
    [
        ([KILLED], 1, 0),  # its first run's process was killed while running it
        ([], 0, 1),
        ([replace(KILLED, kind="remove_worker")], 0, 1),  # SIGTERM: it should have committed
        ([replace(KILLED, pids=frozenset({2}))], 0, 1),  # another process was killed
        ([replace(KILLED, at_ms=T + 5, until_ms=T + 5)], 0, 1),  # killed before it started
        ([Fault("restart_broker", T + 1_000, T + 4_000)], 1, 0),  # its commit could not happen
        ([Fault("restart_broker", T + 40_011, T + 44_000)], 0, 1),  # long after it started
    ],
)
def test_a_second_run_of_an_attempt_is_excused_only_by_a_fault_that_ended_the_first(
    faults: list[Fault], excused: int, unexcused: int
) -> None:
    # a ran in pid 1 at T + 10 and never ended; pid 2 ran it again at T + 50 s
    ev = changed(
        "runs",
        lambda xs: (
            [r for r in xs if r.key != "a"]
            + [run("a", started=T + 10, result=None), run("a", started=T + 50_000, pid=2)]
        ),
    )
    ev = changed_outcome_time(replace(ev, faults=faults), "a", T + 50_030)
    got = judge(ev)
    assert (got["reexecutions"], got["excused"], got["unexcused"]) == (1, excused, unexcused)


WEDGED = Dropped(1, T + 30_000, "worker restarting queue: transactional producer wedged")


@pytest.mark.parametrize(
    ("dropped", "skews", "excused"),
    [
        ([WEDGED], {}, 1),  # the first run's process gave up its uncommitted transaction
        ([replace(WEDGED, pid=2)], {}, 0),  # another process did
        ([replace(WEDGED, at_ms=T - 91)], {}, 0),  # over 100 ms before the first run started
        # 100 ms before: the first run was dispatched before the drop, its handler began after
        ([replace(WEDGED, at_ms=T - 90)], {}, 1),
        ([replace(WEDGED, at_ms=T + 50_001)], {}, 0),  # after the second run started
        ([replace(WEDGED, at_ms=T + 50_004)], {1: 5}, 1),  # its clock was 5 ms ahead
        # dropped after the second run started, by a commit that was stuck from before it
        ([replace(WEDGED, at_ms=T + 60_000, in_doubt_since_ms=T + 43_000)], {}, 1),
        ([replace(WEDGED, at_ms=T + 60_000, in_doubt_since_ms=T + 50_001)], {}, 0),  # after
        ([replace(WEDGED, at_ms=T + 60_004, in_doubt_since_ms=T + 50_004)], {1: 5}, 1),
        ([replace(WEDGED, at_ms=T - 91, in_doubt_since_ms=T - 200)], {}, 0),  # before the first run
    ],
)
def test_a_rerun_is_excused_by_its_first_processs_own_drop_of_uncommitted_work(
    dropped: list[Dropped], skews: dict[int, int], excused: int
) -> None:
    # a ran in pid 1 (and ended, never committed); pid 2 ran it again at T + 50 s
    ev = changed(
        "runs",
        lambda xs: (
            [r for r in xs if r.key != "a"]
            + [run("a", started=T + 10), run("a", started=T + 50_000, pid=2)]
        ),
    )
    ev = changed_outcome_time(replace(ev, dropped=dropped, skews=skews), "a", T + 50_030)
    got = judge(ev)
    assert (got["excused"], got["unexcused"]) == (excused, 1 - excused)
    assert got["worker_drops"] == {WEDGED.reason: 1}


def changed_outcome_time(ev: Evidence, key: str, ts: int) -> Evidence:
    return replace(ev, outcomes=[replace(o, ts_ms=ts) if o.key == key else o for o in ev.outcomes])


def test_a_run_after_a_committed_outcome_is_unexcused_even_after_a_kill() -> None:
    # a's success was committed at T + 30; its process was killed later; a ran again
    got = judge(replace(plus("runs", run("a", started=T + 50_000, pid=2)), faults=[KILLED]))
    assert got["unexcused"] == 1
    assert "after a committed outcome" in got["unexcused_runs"][0]["why"]


def test_a_rerun_of_an_attempt_whose_retry_was_committed_is_unexcused() -> None:
    # f's attempt 1 committed "retrying" at T + 30; attempt 1 ran again at T + 40
    got = judge(plus("runs", run("f", 1, T + 40, pid=2, result="failed")))
    assert got["unexcused"] == 1
    assert got["unexcused_runs"][0]["attempt"] == 1


STOPPED = Fault("stop_worker", T + 35, T + 9_400, frozenset({1}))


def zombie_commit(*, stop: Fault | None, zombie_offset: int, own_offset: int) -> Evidence:
    """CI's case: f's attempt 1 failed in pid 1, which produced its "retrying" outcome
    at T + 30 and was SIGSTOPped (``stop``); pid 2 got the partition and ran attempt 1
    again at T + 7_000, committing its own "retrying" (``own_offset``); pid 1's outcome
    is at ``zombie_offset``. Attempt 2 ran after pid 2's failure."""
    ev = changed(
        "runs",
        lambda xs: (
            [r for r in xs if r.key != "f"]
            + [
                run("f", 1, T + 10, result="failed"),
                run("f", 1, T + 7_000, pid=2, result="failed"),
                run("f", 2, T + 7_600, pid=2),
            ]
        ),
    )
    outcomes = [o for o in ev.outcomes if o.key != "f"] + [
        Outcome("f", "f", "retrying", 1, T + 30, 1, zombie_offset),
        Outcome("f", "f", "retrying", 1, T + 7_030, 2, own_offset),
        Outcome("f", "f", "succeeded", 2, T + 7_630, 2, 12),
    ]
    effects = {**ev.effects, "f": Effect(2, T + 7_605, 2)}
    faults = [stop] if stop is not None else []
    return replace(ev, outcomes=outcomes, effects=effects, faults=faults)


AFTER_COMMIT = "started 6970 ms after a committed outcome"
NO_FAULT = "no fault ended an earlier run of this attempt"


@pytest.mark.parametrize(
    ("stop", "zombie_offset", "own_offset", "why"),
    [
        # appended after pid 2's own outcome: committed after pid 2 ran (seen in CI),
        # a re-execution the stop excuses
        (STOPPED, 14, 10, ""),
        # the same without the stop: a re-execution nothing excuses, not a run after
        # a commit
        (None, 14, 10, NO_FAULT),
        # appended first, but its writer froze 5 ms after producing it: the commit
        # may have gone on at SIGCONT, after pid 2's run
        (STOPPED, 9, 10, ""),
        # appended first and nothing delayed its commit: pid 2 ran after it
        (None, 9, 10, AFTER_COMMIT),
        # a freeze long after the outcome did not catch its commit
        (replace(STOPPED, at_ms=T + 3_000), 9, 10, AFTER_COMMIT),
        # the freeze of another process says nothing about this one's commit
        (replace(STOPPED, pids=frozenset({3})), 9, 10, AFTER_COMMIT),
    ],
)
def test_an_outcome_counts_from_when_its_commit_can_be_shown(
    stop: Fault | None, zombie_offset: int, own_offset: int, why: str
) -> None:
    got = judge(zombie_commit(stop=stop, zombie_offset=zombie_offset, own_offset=own_offset))
    assert got["reexecutions"] == 1
    assert [r["why"] for r in got["unexcused_runs"]] == ([why] if why else [])
    assert got["excused"] == (0 if why else 1)


FROZEN = Fault("stop_worker", T + 5, T + 9_405, frozenset({2}))


@pytest.mark.parametrize(
    ("freeze", "recorded_start", "why"),
    [
        # pid 2 was calling the handler when it froze; the handler recorded its
        # start on waking, after pid 1's success was committed (seen in CI)
        (FROZEN, T + 9_405, ""),
        (FROZEN, T + 10_405, ""),  # up to thaw_slack_ms after SIGCONT
        # recorded a few ms before the tool noted the freeze's end (seen in CI: 17 ms)
        (FROZEN, T + 9_388, ""),
        # started well after waking: a new start after the commit
        (FROZEN, T + 10_406, "started 10376 ms after a committed outcome"),
        (None, T + 9_405, "started 9375 ms after a committed outcome"),
        # the freeze of another process says nothing about this run
        (
            replace(FROZEN, pids=frozenset({1})),
            T + 9_405,
            "started 9375 ms after a committed outcome",
        ),
    ],
)
def test_a_run_recorded_on_waking_from_a_freeze_counts_from_the_freeze(
    freeze: Fault | None, recorded_start: int, why: str
) -> None:
    # a ran in pid 1 at T + 10 and committed at T + 30; pid 2's run of it is recorded
    # at ``recorded_start``
    ev = plus("runs", run("a", started=recorded_start, pid=2))
    got = judge(replace(ev, faults=[freeze] if freeze is not None else []))
    assert [r["why"] for r in got["unexcused_runs"]] == ([why] if why else [])
    assert got["excused"] == (0 if why else 1)


def test_a_run_of_the_next_attempt_after_a_retrying_outcome_is_fine() -> None:
    got = judge(evidence())
    assert got["unexcused"] == 0  # f attempt 2 started after attempt 1's "retrying"


# ------------------------------------------------------------------ Kafka's view


def test_a_one_shot_job_fired_twice_is_a_double_fire_unless_resent() -> None:
    got = judge(plus("fires", Fire("a", "a")))
    assert (got["double_fires"], got["double_fire_keys"]) == (1, ["a"])
    assert got["fires_per_key_max"] == 2
    assert judge(plus("fires", Fire("a", "a", resent=True)))["double_fires"] == 0


def test_a_double_fire_is_legitimate_but_its_second_run_is_not() -> None:
    """Firing without transactions, a takeover fires copies: the run passes as long
    as the copy is not run again (workers skip it)."""
    assert broken(judge(plus("fires", Fire("a", "a")))) == []
    fields = clean()
    fields["fires"] = [*fields["fires"], Fire("a", "a")]
    fields["runs"] = [*fields["runs"], run("a", 1, T + 20, pid=2)]  # the copy, run too
    got = judge(Evidence(**fields))
    assert got["unexcused"] == 1
    assert broken(got) == ["unexcused = 1"]


def test_a_cron_occurrence_fired_twice_is_a_double_fire() -> None:
    assert judge(plus("fires", Fire(f"c@{T}", f"c@{T}")))["double_fire_keys"] == [f"c@{T}"]


def test_two_dead_letters_without_a_redrive_are_a_duplicate() -> None:
    got = judge(plus("dead_letters", DeadLetter("d", "d", "exhausted", 3)))
    assert got["duplicate_keys"] == ["d"]
    assert got["dlq_expected"] == 1  # d is no longer dead-lettered exactly once
    redriven = judge(plus("dead_letters", DeadLetter("d", "d", "exhausted", 3, redriven=True)))
    assert (redriven["duplicates"], redriven["dlq_expected"]) == (0, 2)


def test_two_succeeded_outcomes_are_a_duplicate() -> None:
    assert judge(plus("outcomes", out("a", "succeeded", 1, T + 31)))["duplicate_keys"] == ["a"]


def test_a_dead_letter_of_a_job_that_should_succeed_is_unexpected() -> None:
    got = judge(plus("dead_letters", DeadLetter("a", "a", "timeout", 1)))
    assert (got["dlq_unexpected"], got["dlq_unexpected_keys"]) == (1, ["a"])
    assert got["duplicate_keys"] == ["a"]  # it also succeeded


@pytest.mark.parametrize(
    "letters",
    [
        [DeadLetter("p", "p", "permanent_error", 1)],  # d never dead-lettered
        [DeadLetter("d", "d", "exhausted", 2), DeadLetter("p", "p", "permanent_error", 1)],
        [DeadLetter("d", "d", "permanent_error", 3), DeadLetter("p", "p", "permanent_error", 1)],
    ],
)
def test_an_always_fail_job_must_be_dead_lettered_once_as_planned(
    letters: list[DeadLetter],
) -> None:
    got = judge(evidence(dead_letters=letters))
    assert (got["dlq_expected"], got["dlq_expected_of"]) == (1, 2)
    assert got["dlq_problems"][0]["key"] == "d"
    assert any("dlq expected" in b for b in broken(got))


def test_an_always_fail_job_needs_exactly_one_dead_outcome() -> None:
    got = judge(plus("outcomes", out("p", "dead", 1, T + 40)))
    assert got["dlq_expected"] == 1


# ------------------------------------------------------------------ faults


def test_faults_ok_says_whether_each_kind_reached_its_minimum() -> None:
    ev = evidence()
    assert judge(ev, Rules(fault_minimums={"kill_worker": 1}))["faults_ok"] is True
    got = judge(ev, Rules(fault_minimums={"kill_worker": 2, "restart_broker": 1}))
    assert got["faults_ok"] is False
    assert got["faults_missing"] == {"kill_worker": 1, "restart_broker": 0}
    assert got["faults_by_kind"] == {"kill_worker": 1}


def test_a_fault_log_entry_without_its_fields_is_refused() -> None:
    entry = {"kind": "kill_worker", "at_ms": 5, "until_ms": 6, "pids": [3]}
    assert Fault.from_log(entry) == Fault("kill_worker", 5, 6, frozenset({3}))
    for name in ("kind", "at_ms", "until_ms", "pids"):
        with pytest.raises(ValueError, match=name):
            Fault.from_log({k: v for k, v in entry.items() if k != name})
    with pytest.raises(ValueError, match="until_ms before"):
        Fault.from_log({**entry, "until_ms": 4})


def test_retry_plan_waits() -> None:
    assert DEFAULT_PLAN.total_ms == 500 + 2000 + 2000
    assert [DEFAULT_PLAN.delay_after(n) for n in (1, 2, 3)] == [500, 2000, 2000]
    assert RetryPlan(1).total_ms == 0


def test_the_workload_plan_is_reproducible_and_covers_every_kind() -> None:
    one = plan_jobs(rng=random.Random(7), duration_s=180, rate_per_s=8)
    two = plan_jobs(rng=random.Random(7), duration_s=180, rate_per_s=8)
    assert one == two
    assert {j.kind for j in one} == {"ok", "flaky", "doomed", "permanent"}
    assert all(j.send_at_s + j.delay_s <= 200 for j in one)
    assert max(j.delay_s for j in one) > 40  # beyond the wheel's top level


# ------------------------------------------------------------------ steering


def steered_run(key: str, started: int, *, version: str | None = None, v: int | None = None) -> Run:
    return Run(key, key, "chaos-ok", 1, started, T, T, 1, started + 10, "ok", version, v)


def steering(
    *commands: Steered, runs: list[Run] | None = None, outcomes: list[Outcome]
) -> Evidence:
    """The clean evidence plus job ``s`` (due at T + 5 s) steered by ``commands``."""
    ev = plus("accepted", Accepted("s", "ok", T + 5_000, T + 5_000, "chaos-ok"))
    return replace(
        ev,
        steered=list(commands),
        runs=[*ev.runs, *(runs or [])],
        outcomes=[*ev.outcomes, *outcomes],
    )


def cmd(
    op: str, *, acked: int = T + 1_000, new: int = T + 5_000, state: str = "accepted"
) -> Steered:
    return Steered("s", op, acked - 5, acked, T + 5_000, new, state)


def test_a_job_cancelled_before_its_due_time_that_never_ran_breaks_nothing() -> None:
    ev = steering(cmd("cancel"), outcomes=[out("s", "cancelled", 1, T + 1_010)])
    got = judge(ev)
    assert broken(got) == []
    assert got["steered"] == {"cancel accepted": 1}
    assert got["steered_binding"] == {"cancel": 1}
    assert unfinished(ev) == []


def test_a_job_cancelled_before_its_due_time_that_ran_breaks_the_rule() -> None:
    ev = steering(
        cmd("cancel"),
        runs=[steered_run("s", T + 5_010)],
        outcomes=[out("s", "cancelled", 1, T + 1_010), out("s", "succeeded", 1, T + 5_030)],
    )
    got = judge(ev)
    assert got["steer_cancel_ran"] == 1
    assert "steer_cancel_ran = 1" in broken(got)
    # without its cancelled outcome it is unconfirmed too, and not finished
    ev = steering(cmd("cancel"), outcomes=[])
    got = judge(ev)
    assert got["steer_cancel_unconfirmed"] == 1
    assert got["lost_keys"] == ["s"]
    assert unfinished(ev) == ["s"]


def test_a_cancel_acknowledged_after_the_due_time_may_lose_the_race() -> None:
    late = cmd("cancel", acked=T + 5_500)
    ran = steering(
        late, runs=[steered_run("s", T + 5_010)], outcomes=[out("s", "succeeded", 1, T + 5_030)]
    )
    assert broken(judge(ran)) == []
    held = steering(late, outcomes=[out("s", "cancelled", 1, T + 5_510)])
    assert broken(judge(held)) == []
    # a call that failed may or may not have written its command: the same
    unknown = cmd("cancel", state="unknown")
    assert broken(judge(replace(ran, steered=[unknown]))) == []
    assert broken(judge(replace(held, steered=[unknown]))) == []


def test_a_job_moved_later_runs_its_new_version_at_its_new_time() -> None:
    move = cmd("later", new=T + 9_000)
    good = steering(
        move,
        runs=[steered_run("s", T + 9_010, version="v1")],
        outcomes=[out("s", "rescheduled", 1, T + 1_010), out("s", "succeeded", 1, T + 9_030)],
    )
    assert broken(judge(good)) == []
    # its original timer ran (at the old time): the old version ran, and early
    old = replace(good, runs=[*good.runs[:-1], steered_run("s", T + 5_010)])
    got = judge(old)
    assert got["steer_ran_old"] == 1
    assert got["early"] == 1
    assert "steer_ran_old = 1" in broken(got)
    # the new version, before its new time: early
    rushed = replace(good, runs=[*good.runs[:-1], steered_run("s", T + 8_000, version="v1")])
    got = judge(rushed)
    assert (got["early"], got["steer_ran_old"]) == (1, 0)


def test_a_job_moved_earlier_runs_at_its_new_time_not_its_old_one() -> None:
    move = cmd("earlier", new=T + 3_000)
    good = steering(
        move,
        runs=[steered_run("s", T + 3_010, version="v1")],
        outcomes=[out("s", "rescheduled", 1, T + 1_010), out("s", "succeeded", 1, T + 3_030)],
    )
    assert broken(judge(good)) == []
    old = replace(good, runs=[*good.runs[:-1], steered_run("s", T + 5_010)])
    assert judge(old)["steer_ran_old"] == 1
    # a move acknowledged after the due time binds nothing: either time is right
    late = steering(
        cmd("earlier", acked=T + 5_100, new=T + 6_000),
        runs=[steered_run("s", T + 5_010)],
        outcomes=[out("s", "succeeded", 1, T + 5_030)],
    )
    assert broken(judge(late)) == []


def test_a_job_updated_before_its_due_time_runs_the_new_payload() -> None:
    good = steering(
        cmd("update"),
        runs=[steered_run("s", T + 5_010, version="v1", v=2)],
        outcomes=[out("s", "updated", 1, T + 1_010), out("s", "succeeded", 1, T + 5_030)],
    )
    assert broken(judge(good)) == []
    old = replace(good, runs=[*good.runs[:-1], steered_run("s", T + 5_010)])
    got = judge(old)
    assert got["steer_ran_old"] == 1
    assert got["steer_problems"] == [{"key": "s", "rule": "updated, ran the old payload"}]


def test_a_command_the_sdk_refused_changes_nothing() -> None:
    ev = steering(
        cmd("cancel", state="refused"),
        runs=[steered_run("s", T + 5_010)],
        outcomes=[out("s", "succeeded", 1, T + 5_030)],
    )
    got = judge(ev)
    assert broken(got) == []
    assert got["steered_binding"] == {}


def test_steering_is_planned_for_waiting_jobs_that_succeed_only() -> None:
    jobs = plan_jobs(rng=random.Random(3), duration_s=600, rate_per_s=8)
    planned = plan_steering(jobs, rng=random.Random(4))
    by_n = {j.n: j for j in jobs}
    assert planned
    assert {s.op for s in planned} == {"cancel", "later", "earlier", "update"}
    for s in planned:
        job = by_n[s.n]
        assert job.kind == "ok"
        assert job.delay_s >= 3.0
        assert job.send_at_s < s.at_s <= job.send_at_s + job.delay_s - 1.5
