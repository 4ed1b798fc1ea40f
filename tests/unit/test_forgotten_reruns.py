"""Which handler runs a worker forgot (and ran again) are not doubles (pure)."""

from __future__ import annotations

from tests.chaos.facts import Dropped
from tests.integration.worker_support import COMMIT_WINDOW_MS, forgotten_reruns

T = 1_800_000_000.0  # seconds, as the ledger stores them


def run(key: str, at_s: float, pid: int, attempt: int = 1) -> tuple[str, int, float, int]:
    return (key, attempt, at_s, pid)


def drop(pid: int, at_s: float) -> Dropped:
    return Dropped(pid, int(at_s * 1000), "worker restarting queue: commit failed")


def test_a_run_again_after_its_workers_restart_is_forgotten() -> None:
    runs = [run("a", T, 1), run("a", T + 2, 2)]
    assert forgotten_reruns(runs, [drop(1, T + 1)]) == {"a"}


def test_a_run_again_without_a_restart_in_between_is_a_double() -> None:
    runs = [run("a", T, 1), run("a", T + 2, 2)]
    assert forgotten_reruns(runs, []) == set()
    assert forgotten_reruns(runs, [drop(2, T + 1)]) == set()  # another worker's restart
    assert forgotten_reruns(runs, [drop(1, T - 1)]) == set()  # before the run
    assert forgotten_reruns(runs, [drop(1, T + 3)]) == set()  # after the run again


def test_a_restart_after_the_commit_window_excuses_nothing() -> None:
    late = T + COMMIT_WINDOW_MS / 1000 + 1
    runs = [run("a", T, 1), run("a", late + 1, 2)]
    assert forgotten_reruns(runs, [drop(1, late)]) == set()


def test_every_rerun_of_an_attempt_needs_its_own_restart() -> None:
    runs = [run("a", T, 1), run("a", T + 2, 1), run("a", T + 4, 1)]
    assert forgotten_reruns(runs, [drop(1, T + 1)]) == set()
    assert forgotten_reruns(runs, [drop(1, T + 1), drop(1, T + 3)]) == {"a"}


def test_attempts_are_judged_apart() -> None:
    runs = [run("a", T, 1, attempt=1), run("a", T + 2, 1, attempt=2)]  # a retry: not a rerun
    assert forgotten_reruns(runs, []) == set()
    runs += [run("a", T + 3, 1, attempt=2)]  # attempt 2 twice, no restart
    assert forgotten_reruns(runs, [drop(1, T + 1)]) == set()
