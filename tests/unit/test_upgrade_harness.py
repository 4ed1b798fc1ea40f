"""The upgrade tests' own logic, without a broker: the verdict over the ledger
(tests/upgrade/verdict.py), the handler's plan against it, and the failure when
the previous release's tag is missing (tests/upgrade/release.py)."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.upgrade.app.upgrade_tasks import outcome_of
from tests.upgrade.ledger import Run
from tests.upgrade.release import (
    PREVIOUS_TAG,
    RELEASE_COMMITS,
    ROOT,
    ReleaseUnavailable,
    tag_commit,
)
from tests.upgrade.verdict import (
    DEAD_REASON,
    RESULTS,
    Planned,
    cron_occurrences,
    judge,
    judge_redrives,
    planned_jobs,
)

TIERS = (2_000, 4_000)
DUE = 1_000_000


def run(
    job: str,
    attempt: int,
    result: str,
    started: int,
    *,
    release: str = "v0.1.0",
    ended: int | None = None,
    redriven: bool = False,
) -> Run:
    return Run(
        job_id=job,
        kind="?",
        attempt=attempt,
        due_ms=DUE,
        started_ms=started,
        ended_ms=started + 100 if ended is None else ended,
        result=result,
        pid=1,
        release=release,
        dueflow_path="/x",
        redriven=redriven,
    )


def verdict_of(kind: str, runs: list[Run], dead: list[str] | None = None) -> dict[str, list[str]]:
    v = judge([Planned("j", kind, DUE, "sdk")], runs, {"j": dead or []}, tiers_ms=TIERS)
    names = ("unfinished", "doubled", "early", "wrong", "unplanned")
    return {name: getattr(v, name) for name in names if getattr(v, name)}


RETRY = DUE + 100 + TIERS[0]  # attempt 1 ended at DUE + 100


@pytest.mark.parametrize(
    ("kind", "runs", "dead", "found"),
    [
        ("ok", [run("j", 1, "ok", DUE)], [], None),
        ("ok", [], [], "unfinished"),
        ("ok", [run("j", 1, "ok", DUE), run("j", 1, "ok", DUE + 5)], [], "doubled"),
        ("ok", [run("j", 1, "ok", DUE - 1)], [], "early"),
        ("ok", [run("j", 1, "fail", DUE)], [], "wrong"),
        ("ok", [run("j", 1, "ok", DUE)], ["exhausted"], "wrong"),
        ("flaky", [run("j", 1, "fail", DUE), run("j", 2, "ok", RETRY)], [], None),
        ("flaky", [run("j", 1, "fail", DUE)], [], "unfinished"),
        ("flaky", [run("j", 1, "fail", DUE), run("j", 2, "ok", RETRY - 1)], [], "early"),
        ("flaky", [run("j", 2, "ok", RETRY)], [], "wrong"),  # attempt 1 never ran
        ("permanent", [run("j", 1, "permanent", DUE)], ["permanent_error"], None),
        ("permanent", [run("j", 1, "permanent", DUE)], [], "unfinished"),
        (
            "permanent",
            [run("j", 1, "permanent", DUE)],
            ["permanent_error", "permanent_error"],
            "doubled",
        ),
        ("permanent", [run("j", 1, "permanent", DUE)], ["exhausted"], "wrong"),
        (
            "exhausted",
            [run("j", 1, "fail", DUE), run("j", 2, "fail", RETRY)],
            ["exhausted"],
            None,
        ),
        (
            "exhausted",
            [run("j", 1, "fail", DUE), run("j", 2, "fail", RETRY), run("j", 3, "fail", RETRY)],
            ["exhausted"],
            "wrong",
        ),
    ],
)
def test_the_verdict_finds_what_went_wrong_with_a_job(
    kind: str, runs: list[Run], dead: list[str], found: str | None
) -> None:
    got = verdict_of(kind, runs, dead)
    assert list(got) == ([] if found is None else [found]), got


def test_a_run_nobody_planned_and_runs_of_a_redriven_record_are_told_apart() -> None:
    runs = [
        run("j", 1, "ok", DUE),
        run("stray", 1, "ok", DUE),
        run("j", 1, "ok", DUE + 9_000, redriven=True),  # judged by judge_redrives
    ]
    v = judge([Planned("j", "ok", DUE, "sdk")], runs, {}, tiers_ms=TIERS)
    assert v.unplanned == ["stray"]
    assert v.problems() == ["unplanned: 1 of 1, e.g. ['stray']"]
    assert judge_redrives({"j"}, runs, after_ms=DUE + 8_000) == []
    assert judge_redrives({"j"}, runs, after_ms=DUE + 10_000) != []  # ran before the redrive
    assert judge_redrives({"j", "other"}, runs, after_ms=DUE) == ["other: redriven runs []"]


def test_a_retry_on_the_other_release_is_counted() -> None:
    runs = [run("j", 1, "fail", DUE), run("j", 2, "ok", RETRY, release="current")]
    v = judge([Planned("j", "flaky", DUE, "sdk")], runs, {}, tiers_ms=TIERS)
    assert v.problems() == []
    assert v.retries_across == 1
    assert v.runs_by_release == {"v0.1.0": 1, "current": 1}


@pytest.mark.parametrize(
    ("aborted_at", "uncommitted"),
    [
        ([DUE + 2_000], True),  # its worker started over after it: the run again is no double
        ([], False),  # no restart: a double
        ([DUE + 50], True),  # a restart while it ran forgets it (the run then ended)
        ([DUE - 50], False),  # a restart before it began is about an earlier batch
        ([DUE + 40_000], False),  # later than any commit window after the run
    ],
)
def test_a_run_its_worker_did_not_commit_is_not_a_double(
    aborted_at: list[int], uncommitted: bool
) -> None:
    runs = [run("j", 1, "ok", DUE), run("j", 1, "ok", DUE + 45_000)]
    v = judge([Planned("j", "ok", DUE, "sdk")], runs, {}, tiers_ms=TIERS, aborted={1: aborted_at})
    assert bool(v.uncommitted) is uncommitted
    assert (v.problems() == []) is uncommitted
    if not uncommitted:
        assert v.doubled == ["j attempts [1, 1] dlq []"]


@pytest.mark.parametrize(
    ("worker_end", "uncommitted"),
    [
        (DUE + 36_000, True),  # the worker ended it late (timed out): its restart is within
        (None, False),  # the handler's own end only: the restart is past the window
    ],
)
def test_a_run_is_uncommitted_within_a_commit_window_of_its_workers_end(
    worker_end: int | None, uncommitted: bool
) -> None:
    # The handler ended at once; its result reached its worker 36 s later (or the
    # worker timed it out then), and the worker started its queue over 6 s after that.
    runs = [run("j", 1, "ok", DUE), run("j", 1, "ok", DUE + 45_000)]
    ends = {} if worker_end is None else {("j", 1, 1): worker_end}
    v = judge(
        [Planned("j", "ok", DUE, "sdk")],
        runs,
        {},
        tiers_ms=TIERS,
        aborted={1: [DUE + 42_000]},
        ends=ends,
    )
    assert bool(v.uncommitted) is uncommitted
    assert (v.problems() == []) is uncommitted


@pytest.mark.parametrize(
    ("started", "uncommitted"),
    [
        ([DUE + 1_000], True),  # its worker started it before the restart: forgotten with it
        ([], False),  # the handler's own start only: after the restart, a double
        ([DUE + 3_000], False),  # a start after the handler's own is another run's
    ],
)
def test_a_run_begins_when_its_worker_started_it(started: list[int], uncommitted: bool) -> None:
    # The worker started the attempt, started its queue over 1 ms later and the
    # handler's thread, late on a stalled machine, began 90 ms after that; the
    # attempt ran again after the restart.
    runs = [run("j", 1, "ok", DUE + 1_091), run("j", 1, "ok", DUE + 10_000)]
    v = judge(
        [Planned("j", "ok", DUE, "sdk")],
        runs,
        {},
        tiers_ms=TIERS,
        aborted={1: [DUE + 1_001]},
        starts={("j", 1, 1): started},
    )
    assert bool(v.uncommitted) is uncommitted
    assert (v.problems() == []) is uncommitted


def test_cron_occurrences_are_every_n_seconds_edges_included() -> None:
    assert cron_occurrences("*/2 * * * * *", 1_000, 9_000) == [2_000, 4_000, 6_000, 8_000]
    assert cron_occurrences("*/3 * * * * *", 3_000, 9_000) == [3_000, 6_000, 9_000]
    for expr in ("*/7 * * * * *", "0 * * * *", "*/2 * * * *"):
        with pytest.raises(ValueError, match="accepted"):
            cron_occurrences(expr, 0, 10_000)


def test_planned_jobs_are_the_streams_jobs_and_each_cron_occurrence() -> None:
    facts: list[dict[str, Any]] = [
        {"type": "ready", "sdk": "v0.1.0"},
        {"type": "job", "job_id": "a", "due_ms": 5, "kind": "ok", "sdk": "v0.1.0"},
        {
            "type": "cron",
            "schedule_id": "s",
            "cron": "*/2 * * * * *",
            "kind": "flaky",
            "start_ms": 1_000,
            "end_ms": 5_000,
            "sdk": "current",
        },
    ]
    assert planned_jobs(facts) == [
        Planned("a", "ok", 5, "v0.1.0"),
        Planned("s@2000", "flaky", 2_000, "cron s"),
        Planned("s@4000", "flaky", 4_000, "cron s"),
    ]


@pytest.mark.parametrize("kind", sorted(RESULTS))
def test_the_handler_does_what_the_verdict_expects_of_each_kind(kind: str) -> None:
    planned = RESULTS[kind]
    got = tuple(outcome_of(kind, a, redriven=False) for a in range(1, len(planned) + 1))
    assert got == planned
    assert (planned[-1] != "ok") == (kind in DEAD_REASON)
    assert outcome_of(kind, 1, redriven=True) == "ok"  # a redriven job succeeds


def test_the_previous_releases_tag_resolves_in_this_clone() -> None:
    assert len(tag_commit(PREVIOUS_TAG)) == 40


def test_a_clone_without_tags_finds_the_release_by_its_commit(tmp_path: Path) -> None:
    clone = tmp_path / "no-tags"
    subprocess.run(
        ["git", "clone", "--quiet", "--no-tags", f"file://{ROOT}", str(clone)],
        check=True,
        capture_output=True,
    )
    assert (
        subprocess.run(
            ["git", "-C", str(clone), "tag"], check=True, capture_output=True, text=True
        ).stdout
        == ""
    )
    assert tag_commit(PREVIOUS_TAG, repo=clone) == RELEASE_COMMITS[PREVIOUS_TAG]
    assert tag_commit(PREVIOUS_TAG) == RELEASE_COMMITS[PREVIOUS_TAG]


def test_a_clone_without_the_release_fails_naming_the_fix(tmp_path: Path) -> None:
    clone = tmp_path / "shallow"
    subprocess.run(
        ["git", "clone", "--quiet", "--depth", "1", "--no-tags", f"file://{ROOT}", str(clone)],
        check=True,
        capture_output=True,
    )
    with pytest.raises(ReleaseUnavailable) as raised:
        tag_commit(PREVIOUS_TAG, repo=clone)
    message = str(raised.value)
    assert PREVIOUS_TAG in message
    assert "git fetch --unshallow --tags origin" in message
    with pytest.raises(ReleaseUnavailable, match="run `git fetch --tags origin`"):
        tag_commit("v0.0.0-no-such-tag")
