"""Upgrading a running deployment of the previous release to steerable jobs.

The previous release (``tests.upgrade.release.PREVIOUS_TAG``) runs two
emitters, two workers and two status views, with the scheduling service of
``test_upgrade.py`` (20 jobs a second, retries, dead letters, a cron schedule)
in flight the whole time. Its SDK schedules jobs due minutes and 30 days out
and cancels and reschedules some of them the only way it knows: the records of
the release before (an idempotency ``cancelled``; a second timer and a
reschedule record). Then, as docs/operations.md "Upgrading to steerable jobs"
says: ``topics ensure``; one status view replaced (the other left behind on
purpose, to show what an old view does); the workers replaced one by one, with
``queue finalize`` refused each time an old worker is still a member, naming
it; the emitters; ``queue finalize``, which now succeeds; and the current SDK
cancels, moves (later, and earlier: a replace) and updates jobs by command,
some of them the previous SDK's jobs due 30 days out, some it had rescheduled.

Then: every job of the stream ran once or reached the DLQ once, never early;
the legacy cancels were honoured by the current workers and the legacy moves
ran once at their new time; every job cancelled by a command never ran; every
moved job ran once, never before its new due time, not at its old one; every
updated job ran once with its new payload; and firing every timer those jobs
still have, as the wheel will when they come due (30 days out for some), runs
nothing more. The status view that was upgraded shows the commands' outcomes;
the one left behind quarantines every outcome of version 3 (and only those)
and keeps folding the rest.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dueflow import headers as hdr
from dueflow.kafka.topics import names
from dueflow.records import codec
from tests.conftest import KafkaCluster
from tests.integration.pipeline_support import wait_for
from tests.integration.test_upgrade import (
    both_releases_ran,
    committed_ends,
    every_job_once,
    in_flight_at_each_sigterm,
    previous,  # noqa: F401  (the session fixture)
)
from tests.integration.worker_support import read_topic
from tests.upgrade.deployment import QUEUE, Deployment, Stream
from tests.upgrade.release import CURRENT, PREVIOUS, Release, current_release
from tests.upgrade.scenario import (
    Check,
    Command,
    CronPlan,
    JobsRun,
    Replace,
    Schedule,
    Settle,
    Stage,
    Start,
    Step,
    StopScheduling,
    run_steps,
)
from tests.upgrade.steering import (
    DAY_MS,
    NO_OUTCOME_V3,
    OUTCOME_V3,
    Steer,
    answers,
    capture,
    fire_all,
    group,
    ids,
    now_ms,
    outcome_states,
    outcome_versions,
    quarantined,
    runs_of,
    timers_of,
    view_state,
)
from tests.upgrade.verdict import uncommitted_run

WAIT_S = 30  # how long the current SDK waits for each command's verdict
LEFT_BEHIND = "status-left-behind"  # the status view that is not upgraded


@pytest.fixture
def stage(kafka: KafkaCluster, prefix: str, tmp_path: Path, previous: Release) -> Iterator[Stage]:  # noqa: F811
    deployment = Deployment(kafka.bootstrap, prefix, tmp_path)
    stream = Stream(deployment, rate=20)
    stage = Stage(deployment, stream, {PREVIOUS: previous, CURRENT: current_release()})
    try:
        yield stage
    finally:
        deployment.stop_all()
        _report(stage)


# ----------------------------------------------------------------- the plans


def legacy_plan(stage: Stage) -> list[dict[str, Any]]:
    """What the previous SDK does before the upgrade.

    Its cancels and moves are slow (it scans for each job), slower under load. So
    the jobs that must still be pending when the last previous worker has left, or
    when the previous SDK cancels them after the queue was finalized, are scheduled
    (and moved) last, their due times counted from then, not from the step's start.
    """
    stage.notes["t0"] = now_ms()
    far = 30 * DAY_MS
    return [
        {"op": "schedule", "group": "far-cancel", "n": 3, "delay_ms": far, "kind": "ok"},
        {"op": "schedule", "group": "far-later", "n": 3, "delay_ms": far, "kind": "ok"},
        {"op": "schedule", "group": "far-earlier", "n": 3, "delay_ms": far, "kind": "ok"},
        {"op": "schedule", "group": "far-update", "n": 3, "delay_ms": far, "kind": "ok"},
        # beyond the idempotency retention: the records of the release before cannot
        {"op": "cancel", "group": "far-cancel"},
        {"op": "schedule", "group": "legacy-then-cmd", "n": 3, "delay_ms": 300_000, "kind": "ok"},
        {"op": "reschedule", "group": "legacy-then-cmd", "in_ms": 320_000},
        {"op": "schedule", "group": "legacy-earlier", "n": 3, "delay_ms": 300_000, "kind": "ok"},
        {"op": "reschedule", "group": "legacy-earlier", "in_ms": 150_000},
        {"op": "schedule", "group": "legacy-later", "n": 3, "delay_ms": 90_000, "kind": "ok"},
        {"op": "reschedule", "group": "legacy-later", "in_ms": 170_000},
        {"op": "schedule", "group": "legacy-after", "n": 3, "delay_ms": 150_000, "kind": "ok"},
        {"op": "schedule", "group": "legacy-cancel", "n": 4, "delay_ms": 150_000, "kind": "ok"},
        {"op": "cancel", "group": "legacy-cancel"},
    ]


def legacy_after_plan(_stage: Stage) -> list[dict[str, Any]]:
    """The previous SDK, still running after the queue was finalized, cancels jobs."""
    return [{"op": "cancel", "group": "legacy-after"}]


def command_jobs_plan(stage: Stage) -> list[dict[str, Any]]:
    """The jobs the current SDK schedules on the finalized queue (``t1``: now); their
    timers are captured before the commands, which may take longer than the 45 s to
    the first due time under load (the emitter deletes a slot's records once fired)."""
    stage.notes["t1"] = now_ms()
    return [
        {"op": "schedule", "group": "cmd-cancel", "n": 4, "delay_ms": 45_000, "kind": "ok"},
        {"op": "schedule", "group": "cmd-later", "n": 4, "delay_ms": 45_000, "kind": "ok"},
        {"op": "schedule", "group": "cmd-update", "n": 4, "delay_ms": 45_000, "kind": "ok"},
        {"op": "schedule", "group": "cmd-earlier", "n": 3, "delay_ms": 600_000, "kind": "ok"},
    ]


def command_plan(stage: Stage) -> list[dict[str, Any]]:
    """What the current SDK does to those jobs and the older ones, the most pressing
    first."""
    t1 = stage.notes["t1"]
    w = WAIT_S
    return [
        {"op": "cancel", "group": "cmd-cancel", "wait": w},
        {"op": "reschedule", "group": "cmd-later", "due_ms": t1 + 60_000, "wait": w},
        {"op": "update", "group": "cmd-update", "tag": "updated", "wait": w},
        {"op": "reschedule", "group": "cmd-earlier", "due_ms": t1 + 35_000, "wait": w},
        {"op": "cancel", "group": "far-cancel", "wait": w},
        {"op": "reschedule", "group": "far-later", "due_ms": t1 + 31 * DAY_MS, "wait": w},
        {"op": "reschedule", "group": "far-earlier", "due_ms": t1 + 35_000, "wait": w},
        {"op": "update", "group": "far-update", "tag": "updated", "wait": w},
        {"op": "reschedule", "group": "legacy-then-cmd", "due_ms": t1 + 35_000, "wait": w},
    ]


# ----------------------------------------------------------------- finalize


def finalize_refused(remaining: int) -> Check:
    """``queue finalize`` refuses (exit 1) while ``remaining`` previous workers are members,
    naming each of them, and no current one."""

    def check(stage: Stage) -> None:
        d = stage.deployment
        old = [w for w in d.workers() if w.release.name == PREVIOUS]
        assert len(old) == remaining, [w.name for w in d.workers()]
        doc = d.cli_json(stage.release(CURRENT), "queue", "finalize", QUEUE, ok=(1,))
        assert not doc["finalized"], doc
        [refused] = doc["refused"]
        assert refused["queue"] == QUEUE, doc
        assert len(refused["members"]) == remaining, doc
        for member in refused["members"]:
            assert not member.startswith("dueflow-worker/"), doc
        stage.notes.setdefault("finalize_refused", []).append(refused["members"])

    return Check(f"queue finalize refused with {remaining} previous worker(s)", check)


def finalized(stage: Stage) -> None:
    """``queue finalize`` succeeds once every member is a current worker."""
    d = stage.deployment
    doc = d.cli_json(stage.release(CURRENT), "queue", "finalize", QUEUE)
    assert not doc["refused"], doc
    [done] = doc["finalized"]
    assert done["written"], doc
    assert len(done["workers"]) == 2, doc
    assert all(w.startswith("dueflow-worker/") for w in done["workers"]), doc
    stage.notes["finalized"] = done["workers"]


# ----------------------------------------------------------------- legacy records


def legacy_answers(stage: Stage) -> None:
    """The previous SDK wrote its cancels and moves; it refused the cancel of a job due
    beyond the idempotency retention."""
    legacy_cancel = answers(stage, "cancel", ids(stage, "legacy-cancel"), PREVIOUS)
    assert all(a["result"]["cancelled"] for a in legacy_cancel.values()), legacy_cancel
    for name in ("legacy-later", "legacy-earlier", "legacy-then-cmd"):
        moved = answers(stage, "reschedule", ids(stage, name), PREVIOUS)
        assert all(a["result"]["rescheduled"] for a in moved.values()), moved
    far = answers(stage, "cancel", ids(stage, "far-cancel"), PREVIOUS)
    assert all("retention" in a.get("error", "") for a in far.values()), far


def last_previous_worker_left(stage: Stage) -> int:
    return max(
        s.term_ms
        for s in stage.deployment.replacements
        if s.old.role == "worker" and s.old.release.name == PREVIOUS
    )


def legacy_jobs_due(stage: Stage) -> None:
    """Until the jobs the previous SDK cancelled were fired and the ones it moved ran
    (their due times lie past the upgrade; how far depends on the machine's pace)."""
    d = stage.deployment
    cancelled = set(ids(stage, "legacy-cancel") + ids(stage, "legacy-after"))
    moved = ids(stage, "legacy-later") + ids(stage, "legacy-earlier")
    dues = [f["due_ms"] for f in group(stage, "legacy-cancel") + group(stage, "legacy-after")]
    for name in ("legacy-later", "legacy-earlier"):
        dues += [
            a["result"]["due_ms"]
            for a in answers(stage, "reschedule", ids(stage, name), PREVIOUS).values()
        ]

    def reached() -> bool:
        fired = {
            r.headers[hdr.JOB_ID].decode()
            for r in read_topic(d.settings, names(d.settings).exec(QUEUE))
            if hdr.FIRED in r.headers and r.headers.get(hdr.JOB_ID, b"").decode() in cancelled
        }
        return fired == cancelled and all(runs_of(stage, moved).values())

    wait_for("the legacy jobs' due times", reached, max(0, max(dues) - now_ms()) / 1000 + 90)


def legacy_cancels_honoured(stage: Stage) -> None:
    """Jobs the previous SDK cancelled (before the upgrade, and after the queue was
    finalized) were fired after the last previous worker had left, and never ran;
    firing every timer they have again runs nothing."""
    after = answers(stage, "cancel", ids(stage, "legacy-after"), PREVIOUS)
    assert all(a["result"]["cancelled"] for a in after.values()), after
    job_ids = ids(stage, "legacy-cancel") + ids(stage, "legacy-after")
    d = stage.deployment
    left = last_previous_worker_left(stage)
    fired = {
        r.headers[hdr.JOB_ID].decode(): int(r.headers[hdr.FIRED])
        for r in read_topic(d.settings, names(d.settings).exec(QUEUE))
        if r.headers.get(hdr.JOB_ID, b"").decode() in job_ids and hdr.FIRED in r.headers
    }
    assert set(fired) == set(job_ids), fired
    assert min(fired.values()) > left, f"fired {fired}, last previous worker left at {left}"
    fire_all(stage, job_ids)
    assert all(not runs for runs in runs_of(stage, job_ids).values()), runs_of(stage, job_ids)


def ran_once_at(stage: Stage, job_ids: list[str], due_ms: dict[str, int], tag: str) -> None:
    """Each job ran exactly once, not before ``due_ms``, with payload ``tag``, on a
    current worker. A run its worker forgot (it lost its partitions or started its
    queue over before committing it: a stalled machine) is not counted, and such a job
    must have exactly one committed end."""
    aborted = stage.deployment.aborted_commits()
    attempt_ends = stage.deployment.attempt_ends()
    attempt_starts = stage.deployment.attempt_starts()
    forgotten: set[str] = set()
    for job_id, runs in runs_of(stage, job_ids).items():
        assert all(r.started_ms >= due_ms[job_id] for r in runs), (job_id, runs, due_ms[job_id])
        kept = [
            r for r in runs if not uncommitted_run(r, runs, aborted, attempt_ends, attempt_starts)
        ]
        if len(kept) < len(runs):
            forgotten.add(job_id)
        assert len(kept) == 1, (job_id, runs, aborted)
        [run] = kept
        assert run.tag == tag, (job_id, run)
        assert run.release == CURRENT, (job_id, run)
    ends = committed_ends(stage.deployment.settings, forgotten)
    twice = {key: n for key, n in ends.items() if n > 1}
    assert not twice, f"a job with a forgotten run has two committed ends: {twice}"


def legacy_moves_ran_once_at_their_new_time(stage: Stage) -> None:
    """Jobs the previous SDK moved (later, earlier) ran once, at their new time, on
    current workers; firing every timer they have (the original and the move's) runs
    nothing more."""
    for name in ("legacy-later", "legacy-earlier"):
        job_ids = ids(stage, name)
        moved = answers(stage, "reschedule", job_ids, PREVIOUS)
        due = {j: int(a["result"]["due_ms"]) for j, a in moved.items()}
        ran_once_at(stage, job_ids, due, "original")
        fire_all(stage, job_ids)
        ran_once_at(stage, job_ids, due, "original")


# ----------------------------------------------------------------- commands


def applied(stage: Stage, op: str, name: str, flag: str) -> dict[str, dict[str, Any]]:
    """The current SDK's answers to ``op`` for group ``name``: each applied by the owner."""
    got = answers(stage, op, ids(stage, name), CURRENT)
    for job_id, a in got.items():
        result = a.get("result")
        assert result is not None, (name, job_id, a)
        assert result[flag], (name, job_id, a)
        assert result["verdict"] in ("cancelled", "rescheduled", "updated"), (name, job_id, a)
    return got


def commanded_cancels_never_ran(stage: Stage) -> None:
    """Jobs cancelled by a command (due in 45 s, and due in 30 days) never ran: not when
    their timers fired, nor when every timer they have is fired again."""
    for name in ("cmd-cancel", "far-cancel"):
        applied(stage, "cancel", name, "cancelled")
    near = ids(stage, "cmd-cancel")
    due = max(int(f["due_ms"]) for f in group(stage, "cmd-cancel"))
    wait_for("the cancelled jobs' due time", lambda: now_ms() > due + 2_000, 120)
    job_ids = near + ids(stage, "far-cancel")
    fire_all(stage, job_ids)
    assert all(not runs for runs in runs_of(stage, job_ids).values()), runs_of(stage, job_ids)
    states = outcome_states(stage.deployment, job_ids)
    assert all("cancelled" in s for s in states.values()), states


def commanded_moves_ran_at_their_new_time(stage: Stage) -> None:
    """Jobs moved by a command ran once, never before their new due time (a move later
    in 45 s, a move earlier from 10 minutes and from 30 days, one the previous SDK had
    moved already), not at their old one: firing every timer they have runs nothing
    more."""
    groups = ("cmd-later", "cmd-earlier", "far-earlier", "legacy-then-cmd")
    due: dict[str, int] = {}
    for name in groups:
        for job_id, a in applied(stage, "reschedule", name, "rescheduled").items():
            due[job_id] = int(a["result"]["due_ms"])
    job_ids = list(due)
    wait_for(
        "the moved jobs ran",
        lambda: all(runs_of(stage, job_ids).values()),
        max(0, (max(due.values()) - now_ms()) / 1000) + 90,
    )
    ran_once_at(stage, job_ids, due, "original")
    fire_all(stage, job_ids)
    ran_once_at(stage, job_ids, due, "original")


def commanded_updates_ran_with_the_new_payload(stage: Stage) -> None:
    """Jobs updated by a command ran once, with the new payload, not before their due
    time; one due in 30 days is redirected when its timer fires (a new timer, nothing
    run), and runs with the new payload when that one fires."""
    applied(stage, "update", "cmd-update", "updated")
    near = {f["job_id"]: int(f["due_ms"]) for f in group(stage, "cmd-update")}
    wait_for(
        "the updated jobs ran",
        lambda: all(runs_of(stage, near).values()),
        max(0, (max(near.values()) - now_ms()) / 1000) + 90,
    )
    ran_once_at(stage, list(near), near, "updated")
    fire_all(stage, near)
    ran_once_at(stage, list(near), near, "updated")

    applied(stage, "update", "far-update", "updated")
    far = ids(stage, "far-update")
    fire_all(stage, far)
    assert all(not runs for runs in runs_of(stage, far).values()), runs_of(stage, far)
    d = stage.deployment

    def redirected() -> bool:
        now = timers_of(d, far)
        return all(any(hdr.VERSION in t.headers for t in now[j]) for j in far)

    wait_for("the updated far jobs' new timers", redirected, 60)
    new = timers_of(d, far)
    for job_id in far:
        versions = {r.headers.get(hdr.VERSION) for r in new[job_id]} - {None}
        assert versions, (job_id, [r.headers for r in new[job_id]])
    fire_all(stage, far)
    ran_once_at(stage, far, {j: 0 for j in far}, "updated")


def far_moves_later_redirected(stage: Stage) -> None:
    """A job due in 30 days moved a day later: when its original timer fires, the owner
    writes a timer due at the new time (``df-version``) and runs nothing."""
    answered = applied(stage, "reschedule", "far-later", "rescheduled")
    far = list(answered)
    fire_all(stage, far)
    assert all(not runs for runs in runs_of(stage, far).values()), runs_of(stage, far)
    d = stage.deployment

    def redirected() -> bool:
        now = timers_of(d, far)
        return all(any(hdr.VERSION in t.headers for t in now[j]) for j in far)

    wait_for("the far jobs' new timers", redirected, 60)
    for job_id, timers in timers_of(d, far).items():
        new = [t for t in timers if hdr.VERSION in t.headers]
        assert new, job_id
        want = int(answered[job_id]["result"]["due_ms"])
        assert {int(t.headers[hdr.DUE]) for t in new} == {want}, (job_id, want)


# ----------------------------------------------------------------- status views


def views_after_the_commands(stage: Stage) -> None:
    """Before the jobs cancelled by command come due (30 days out): the upgraded view
    shows them cancelled; the one left behind has quarantined the commands' outcomes
    and shows them as the SDK scheduled them."""
    d = stage.deployment
    upgraded, left = f"{d.prefix}.status", f"{d.prefix}.{LEFT_BEHIND}"
    cancelled = ids(stage, "far-cancel")
    v3 = outcome_versions(d).get(OUTCOME_V3, 0)
    assert v3 > 0
    wait_for(
        "the upgraded view shows the cancels",
        lambda: all(view_state(d, upgraded, j) == "cancelled" for j in cancelled),
        60,
    )
    wait_for("the left-behind view quarantined them", lambda: len(quarantined(d)) >= v3, 60)
    states = {j: view_state(d, left, j) for j in cancelled}
    assert set(states.values()) == {"scheduled"}, states
    stage.notes["left_behind_before_due"] = Counter(states.values())


def status_views(stage: Stage) -> None:
    """The upgraded view shows the commands' outcomes; the one left behind quarantined
    every outcome of version 3 with its reason (and nothing else) and kept folding the
    other outcomes. Neither logged a traceback."""
    d = stage.deployment
    versions = outcome_versions(d)
    v3 = versions.get(OUTCOME_V3, 0)
    stage.notes["outcome_versions"] = {k.decode(): n for k, n in versions.items()}

    def all_quarantined() -> bool:
        return len(quarantined(d)) >= v3

    wait_for("the left-behind view quarantined every outcome of version 3", all_quarantined, 60)
    records = [codec.decode("quarantined", r.value or b"") for r in quarantined(d)]
    reasons = Counter((q["component"], q["reason"]) for q in records)
    assert len(records) == v3, reasons
    for component, reason in reasons:
        assert component == "status_view", reasons
        assert NO_OUTCOME_V3 in reason, reasons
    stage.notes["quarantined_by_left_behind_view"] = len(records)

    upgraded, left = f"{d.prefix}.status", f"{d.prefix}.{LEFT_BEHIND}"
    expect = {
        **dict.fromkeys(ids(stage, "cmd-cancel") + ids(stage, "far-cancel"), "cancelled"),
        **dict.fromkeys(ids(stage, "legacy-cancel") + ids(stage, "legacy-after"), "cancelled"),
        **dict.fromkeys(ids(stage, "cmd-update") + ids(stage, "cmd-later"), "succeeded"),
        **dict.fromkeys(ids(stage, "far-earlier") + ids(stage, "legacy-then-cmd"), "succeeded"),
    }

    def shown() -> bool:
        return all(view_state(d, upgraded, j) == s for j, s in expect.items())

    wait_for("the upgraded view shows every steered job's state", shown, 60)
    # the view left behind: what the outcomes of versions 1 and 2 say
    got = {j: view_state(d, left, j) for j in expect}
    stage.notes["left_behind_at_the_end"] = Counter(
        f"{want} -> {got[j]}" for j, want in expect.items()
    )
    for job_id in ids(stage, "legacy-cancel") + ids(stage, "cmd-later"):
        assert got[job_id] == expect[job_id], (job_id, got[job_id])
    for member in d.members + d.retired:
        if member.role == "status":
            assert "Traceback" not in member.proc.log(), member.proc.log()[-4000:]


def no_traceback(stage: Stage) -> None:
    """No process logged a traceback or abandoned a job at its SIGTERM."""
    for proc in stage.deployment.everyone():
        text = proc.log()
        assert "Traceback" not in text, f"{proc.name}:\n{text[-4000:]}"
        assert "abandoning" not in text, f"{proc.name}:\n{text[-4000:]}"


# ----------------------------------------------------------------- the scenario

STEERING: list[Step] = [
    Command(PREVIOUS, ("topics", "ensure")),
    Start("emitter", PREVIOUS, count=2),
    Start("worker", PREVIOUS, count=2),
    Start("status", PREVIOUS),
    Start("status", PREVIOUS, app_id=LEFT_BEHIND),
    Schedule(PREVIOUS, cron=(CronPlan("every-2s", 2, "ok", 5, 150),)),
    JobsRun(60),
    Steer("legacy", PREVIOUS, legacy_plan),
    Check("timers of the steered jobs", capture),
    Check("the previous SDK's cancels and moves", legacy_answers),
    Command(CURRENT, ("topics", "ensure")),  # the steering topic
    finalize_refused(remaining=2),
    Replace("status", by=CURRENT, which="status"),
    Replace("worker", by=CURRENT),
    finalize_refused(remaining=1),
    Replace("worker", by=CURRENT),
    Schedule(CURRENT),
    Replace("emitter", by=CURRENT, which="standby"),
    Replace("emitter", by=CURRENT, which="active"),
    Check("queue finalize", finalized),
    Steer("legacy after finalize", PREVIOUS, legacy_after_plan),
    Steer("jobs for the commands", CURRENT, command_jobs_plan),
    Check("timers of the steered jobs", capture),
    Steer("commands", CURRENT, command_plan),
    Check("timers of the steered jobs", capture),
    Check("the status views after the commands", views_after_the_commands),
    JobsRun(40),
    StopScheduling(),
    Settle(),
    Check("every job ran once or reached the DLQ once, never early", every_job_once),
    Check("both releases ran jobs", both_releases_ran),
    Check("jobs in flight at the workers' SIGTERMs", in_flight_at_each_sigterm),
    Check("the legacy jobs reached their due times", legacy_jobs_due),
    Check("legacy cancels honoured by current workers", legacy_cancels_honoured),
    Check("legacy moves ran once at their new time", legacy_moves_ran_once_at_their_new_time),
    Check("commanded cancels never ran", commanded_cancels_never_ran),
    Check("commanded moves ran at their new time", commanded_moves_ran_at_their_new_time),
    Check("commanded updates ran with the new payload", commanded_updates_ran_with_the_new_payload),
    Check("far moves later redirected", far_moves_later_redirected),
    Check("status views", status_views),
    Check("no traceback", no_traceback),
]


@pytest.mark.timeout(900)
def test_upgrading_to_steerable_jobs_with_jobs_in_flight_loses_doubles_and_rushes_nothing(
    stage: Stage,
) -> None:
    run_steps(stage, STEERING)


def _report(stage: Stage) -> None:
    verdict = stage.notes.get("verdict")
    print(f"\n{len(stage.stream.facts())} stream facts; verdict: {verdict and verdict.problems()}")
    if verdict is not None:
        print(
            f"  runs by release {dict(verdict.runs_by_release)}, "
            f"retries across releases {verdict.retries_across}"
        )
    for step in stage.deployment.replacements:
        print("  ", step.row())
    for name, seconds in stage.timeline:
        print(f"  {seconds:6.1f} s  {name}")
    for key in (
        "finalize_refused",
        "finalized",
        "outcome_versions",
        "left_behind_before_due",
        "left_behind_at_the_end",
    ):
        if key in stage.notes:
            print(f"  {key}: {stage.notes[key]}")
    if "quarantined_by_left_behind_view" in stage.notes:
        n = stage.notes["quarantined_by_left_behind_view"]
        print(f"  quarantined by the left-behind view: {n}")
