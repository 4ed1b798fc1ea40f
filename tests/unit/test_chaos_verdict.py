"""The chaos suite's judge counts what it must: it can fail."""

from __future__ import annotations

import random

from tests.chaos.ledger import Run
from tests.chaos.verdict import Evidence, judge
from tests.chaos.workload import Accepted, CronRun, plan_jobs

T = 1_700_000_000_000  # a whole second: cron "*/2 * * * * *" fires on it


def run(key: str, attempt: int = 1, started: int = T, due: int = T, nb: int = T) -> Run:
    return Run(key, key, "t", attempt, started, due, nb, 1)


def evidence(**over: object) -> Evidence:
    base: dict[str, object] = {
        "accepted": [
            Accepted("a", "ok", T),
            Accepted("b", "ok", T),
            Accepted("d", "doomed", T),
        ],
        "cron": [CronRun("c", "*/2 * * * * *", T - 1, T + 10_000)],
        "runs": [run("a"), run("b"), run("d"), *(run(f"c@{T + i}") for i in (0, 2000, 4000, 6000))],
        "effects": {"a": T, "b": T, **{f"c@{T + i}": T for i in (0, 2000, 4000, 6000)}},
        "effect_conflicts": 0,
        "succeeded": {"a": 1, "b": 1},
        "dead_letters": {"d": ["exhausted"]},
    }
    base.update(over)
    return Evidence(**base)  # type: ignore[arg-type]


def test_a_clean_run_has_nothing_lost_doubled_or_early() -> None:
    got = judge(evidence())
    assert (got["lost"], got["duplicates"], got["early"]) == (0, 0, 0)
    assert got["jobs"] == 3 + 4  # occurrences T, +2 s, +4 s, +6 s up to deletion - 3 s
    assert got["dlq_expected"] == 1


def test_lost_duplicated_and_early_jobs_are_counted() -> None:
    ev = evidence(
        effects={"a": T, f"c@{T}": T},  # b and two cron occurrences missing
        succeeded={"a": 2},  # Kafka saw a succeed twice
        runs=[run("a", started=T - 1), run("a", started=T + 5), run("b", attempt=2, nb=T + 9)],
    )
    got = judge(ev)
    assert set(got["lost_keys"]) == {"b", f"c@{T + 2000}", f"c@{T + 4000}", f"c@{T + 6000}"}
    assert got["duplicates"] == 1
    assert got["early"] == 2
    assert got["reexecutions"] == 1


def test_a_job_that_succeeded_and_was_dead_lettered_is_a_duplicate() -> None:
    got = judge(evidence(dead_letters={"d": ["exhausted"], "a": ["timeout"]}))
    assert got["duplicate_keys"] == ["a"]
    assert got["dlq_unexpected"] == 1


def test_the_workload_plan_is_reproducible_and_covers_every_kind() -> None:
    one = plan_jobs(rng=random.Random(7), duration_s=180, rate_per_s=8)
    two = plan_jobs(rng=random.Random(7), duration_s=180, rate_per_s=8)
    assert one == two
    assert {j.kind for j in one} == {"ok", "flaky", "doomed", "permanent"}
    assert all(j.send_at_s + j.delay_s <= 200 for j in one)
    assert max(j.delay_s for j in one) > 40  # beyond the wheel's top level
