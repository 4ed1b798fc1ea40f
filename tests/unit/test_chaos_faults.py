"""The chaos suite's pure parts: the fault-kind plan, gaps, report statistics, the
faketime environment, log parsing and the choice of a node to hit."""

from __future__ import annotations

import itertools
import json
import random
from collections import Counter
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.chaos.fault_plan import (
    ANY,
    BROKER_KINDS,
    CLUSTER_WEIGHTS,
    EXPECTED_S,
    NODE_KINDS,
    QUIET_KINDS,
    SINGLE_NODE_WEIGHTS,
    KindQueue,
    coverage_rounds,
    fault_target,
    fault_weights,
    gap_s,
    ms_stats,
    shortfall,
)
from tests.chaos.logwatch import LogWatch, parse_line, parse_ts_ms
from tests.chaos.nodes import LeaderTarget, choose_target, resolve
from tests.chaos.skew import (
    draw_skew_ms,
    faketime_command,
    faketime_spec,
    skewed_env,
)

# ------------------------------------------------------------------ the plan


def test_every_kind_has_an_expected_duration() -> None:
    assert set(SINGLE_NODE_WEIGHTS) | set(CLUSTER_WEIGHTS) <= set(EXPECTED_S)


def test_cluster_runs_hit_nodes_instead_of_the_only_broker() -> None:
    single, cluster = fault_weights(cluster_nodes=1), fault_weights(cluster_nodes=3)
    assert set(single) >= BROKER_KINDS
    assert not NODE_KINDS & set(single)
    assert set(cluster) >= NODE_KINDS
    assert not BROKER_KINDS & set(cluster)
    assert set(single) - BROKER_KINDS == set(cluster) - NODE_KINDS


@pytest.mark.parametrize("minimum", [0, 1, 2, 3])
def test_coverage_rounds_hold_every_kind_the_minimum_times(minimum: int) -> None:
    kinds = list(SINGLE_NODE_WEIGHTS)
    plan = coverage_rounds(kinds, min_per_kind=minimum, rng=random.Random(minimum))
    assert Counter(plan) == dict.fromkeys(kinds, minimum) if minimum else plan == []
    # rounds: each block of len(kinds) is every kind once, so occurrences spread out
    for i in range(minimum):
        assert sorted(plan[i * len(kinds) : (i + 1) * len(kinds)]) == sorted(kinds)


@given(seed=st.integers(0, 2**32), minimum=st.integers(1, 4))
def test_no_kind_twice_in_a_row_across_rounds(seed: int, minimum: int) -> None:
    plan = coverage_rounds(SINGLE_NODE_WEIGHTS, min_per_kind=minimum, rng=random.Random(seed))
    assert all(a != b for a, b in itertools.pairwise(plan))


def test_queue_serves_the_coverage_first_and_skips_what_cannot_run_now() -> None:
    q = KindQueue({"a": 1.0, "b": 1.0, "c": 1.0}, 1, 3, random.Random(1))
    first = q.pending[0]
    got = q.take(lambda k: k != first)  # the first one cannot run now
    assert got == q.taken[-1] != first
    assert q.pending[0] == first  # it keeps its place at the front
    assert q.take(lambda k: True) == first


def test_queue_draws_no_extra_before_every_owed_kind_ran() -> None:
    q = KindQueue({"a": 1.0, "b": 1.0}, 1, 10, random.Random(2))
    q.take(lambda k: k == "a")
    assert q.pending == ["b"]
    assert q.take(lambda k: k == "a") is None  # "b" is owed: no extra "a" yet
    assert q.take(lambda k: True) == "b"
    assert q.take(lambda k: k == "a") == "a"  # now random draws among the feasible


def test_queue_put_back_makes_a_kind_owed_again() -> None:
    q = KindQueue({"a": 1.0, "b": 1.0}, 1, 2, random.Random(3))
    kind = q.take(lambda k: True)
    assert kind is not None
    q.put_back(kind)
    assert q.taken == []
    assert q.pending[0] == kind
    assert sorted(q.pending) == ["a", "b"]


def test_owed_lists_the_coverage_then_the_random_draws_to_the_total() -> None:
    q = KindQueue({"a": 1.0, "b": 1.0}, 2, 7, random.Random(4))
    assert sorted(q.owed()[:4]) == ["a", "a", "b", "b"]
    assert q.owed()[4:] == [ANY] * 3
    while q.pending:
        q.take(lambda k: True)
    for _ in range(3):
        q.take(lambda k: True)
    assert q.owed() == [ANY]  # total reached: one more at a time


def test_random_draws_follow_the_weights_among_feasible_kinds() -> None:
    q = KindQueue({"a": 9.0, "b": 1.0, "c": 5.0}, 0, 0, random.Random(5))
    drawn = Counter(q.take(lambda k: k != "c") for _ in range(2000))
    assert set(drawn) == {"a", "b"}
    assert 0.85 < drawn["a"] / 2000 < 0.95


def simulate(
    *, minutes: float, min_per_kind: int, seed: int, quiet_s: float = 15.0
) -> tuple[list[str], list[float]]:
    """The driver's loop on a simulated clock: each fault takes its expected time,
    quiet kinds wait ``quiet_s`` after the last one, gaps as the driver computes them."""
    rng = random.Random(seed)
    weights = fault_weights()
    total = fault_target(
        minutes=minutes,
        faults_per_minute=6.0,
        min_faults=20,
        min_per_kind=min_per_kind,
        kinds=len(weights),
    )
    q = KindQueue(weights, min_per_kind, total, rng)
    end = minutes * 60.0
    now = gap_s(left_s=end, owed=q.owed(), rng=rng, min_gap_s=2.0)
    quiet_until = 0.0
    done: list[str] = []
    starts: list[float] = []
    while now < end:
        allowed = set(weights) - (QUIET_KINDS if now < quiet_until else set())
        kind = q.take(allowed.__contains__)
        if kind is None:
            now += 0.5
            continue
        starts.append(now)
        now += EXPECTED_S[kind]
        done.append(kind)
        if kind in QUIET_KINDS:
            quiet_until = now + quiet_s
        now += gap_s(left_s=end - now, owed=q.owed(), rng=rng, min_gap_s=2.0)
    return done, starts


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32))
def test_a_three_minute_plan_covers_every_kind_once(seed: int) -> None:
    done, _ = simulate(minutes=3, min_per_kind=1, seed=seed)
    assert shortfall(done, fault_weights(), min_per_kind=1) == {}


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32))
def test_a_ten_minute_plan_covers_every_kind_twice_with_40_faults(seed: int) -> None:
    done, _ = simulate(minutes=10, min_per_kind=2, seed=seed)
    assert shortfall(done, fault_weights(), min_per_kind=2) == {}
    assert len(done) >= 40


def test_gap_shares_the_free_time_and_never_drops_below_the_minimum() -> None:
    rng = random.Random(6)
    # 100 s left, owed faults expected to take 20 s: 80 s among 4 faults, jittered
    gaps = [
        gap_s(left_s=100, owed=["a"] * 4, rng=rng, min_gap_s=2, expected_s={"a": 5.0})
        for _ in range(200)
    ]
    assert min(gaps) >= 0.6 * 20 - 1e-9
    assert max(gaps) <= 1.2 * 20 + 1e-9
    # behind schedule: the minimum gap
    assert gap_s(left_s=10, owed=["a"] * 4, rng=rng, min_gap_s=2, expected_s={"a": 5.0}) == 2


def test_shortfall_names_each_kind_below_its_minimum() -> None:
    assert shortfall(["a", "a", "b"], ["a", "b", "c"], min_per_kind=2) == {
        "b": {"got": 1, "min": 2},
        "c": {"got": 0, "min": 2},
    }
    assert shortfall(["a"], ["a"], min_per_kind=1) == {}


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ([], {"n": 0, "missing": 0, "p50": None, "max": None}),
        ([None], {"n": 0, "missing": 1, "p50": None, "max": None}),
        ([3000], {"n": 1, "missing": 0, "p50": 3000, "max": 3000}),
        ([4000, 3000, None, 9000], {"n": 3, "missing": 1, "p50": 4000, "max": 9000}),
        ([1, 2, 3, 4], {"n": 4, "missing": 0, "p50": 2, "max": 4}),
    ],
)
def test_ms_stats(values: list[int | None], expected: dict[str, int | None]) -> None:
    assert ms_stats(values) == expected


# ------------------------------------------------------------------ faketime


@pytest.mark.parametrize(
    ("skew_ms", "spec"),
    [(2000, "+2.000"), (-2000, "-2.000"), (1500, "+1.500"), (-250, "-0.250"), (0, "+0.000")],
)
def test_faketime_spec_is_a_signed_offset_in_seconds(skew_ms: int, spec: str) -> None:
    assert faketime_spec(skew_ms) == spec


def test_faketime_command_wraps_the_argv() -> None:
    assert faketime_command(["python", "-m", "dueflow"], skew_ms=-2000) == [
        "faketime",
        "-f",
        "-2.000",
        "python",
        "-m",
        "dueflow",
    ]


def test_skewed_env_preloads_the_shim_before_libfaketime() -> None:
    base = {"PATH": "/bin", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}
    env = skewed_env(base, skew_ms=2000, libfaketime=Path("/lib/ft.so"), shim=Path("/run/cw.so"))
    assert env["LD_PRELOAD"] == "/run/cw.so /lib/ft.so"
    assert env["FAKETIME"] == "+2.000"
    assert env["NO_FAKE_STAT"] == "1"
    assert env["PATH"] == "/bin"
    assert "FAKETIME_DONT_FAKE_MONOTONIC" not in env  # breaks time.sleep in 0.9.10
    assert base == {"PATH": "/bin", "FAKETIME_DONT_FAKE_MONOTONIC": "1"}  # not changed


def test_skewed_env_keeps_an_existing_preload_last() -> None:
    env = skewed_env(
        {"LD_PRELOAD": "/x.so"}, skew_ms=-2000, libfaketime=Path("/ft.so"), shim=Path("/cw.so")
    )
    assert env["LD_PRELOAD"] == "/cw.so /ft.so /x.so"
    assert env["FAKETIME"] == "-2.000"


def test_skew_is_two_seconds_either_way() -> None:
    rng = random.Random(7)
    assert {draw_skew_ms(rng) for _ in range(50)} == {2000, -2000}


# ------------------------------------------------------------------ logs


def line(event: str, ts: str = "2026-11-29T13:00:49.597Z", **fields: object) -> str:
    return json.dumps({"ts": ts, "level": "info", "logger": "x", "event": event, **fields})


def test_parse_ts() -> None:
    assert parse_ts_ms("1970-01-01T00:00:01.250Z") == 1250


def test_log_events_are_on_the_real_clock() -> None:
    ev = parse_line(line("emitter is active", ts="1970-01-01T00:00:05.000Z"), skew_ms=2000)
    assert ev is not None
    assert ev.at_ms == 3000
    assert ev.name == "emitter is active"
    assert parse_line(line("emitter is active", ts="1970-01-01T00:00:05.000Z"), skew_ms=-2000)


@pytest.mark.parametrize(
    "text",
    [
        line("job.started", job_id="j"),
        "Traceback (most recent call last):",
        '{"ts": "not a time", "event": "x"}',
        '{"event": "no ts"}',
        "{broken json",
    ],
)
def test_job_lines_and_noise_are_no_events(text: str) -> None:
    assert parse_line(text) is None


class _Child:
    def __init__(self, path: Path, skew_ms: int = 0) -> None:
        self.log_path = path
        self.skew_ms = skew_ms

    @property
    def pid(self) -> int:
        return 1


def test_log_watch_reads_on_and_waits_for_unfinished_lines(tmp_path: Path) -> None:
    path = tmp_path / "emitter-1.log"
    child = _Child(path, skew_ms=1000)
    watch = LogWatch()
    assert watch.events(child) == []  # no file yet
    first = line("emitter is standby", ts="1970-01-01T00:00:02.000Z")
    second = line("emitter is active", ts="1970-01-01T00:00:04.000Z")
    path.write_text(first + "\n" + second[:20])
    assert [e.name for e in watch.events(child)] == ["emitter is standby"]
    with path.open("a") as f:
        f.write(second[20:] + "\n" + line("job.succeeded") + "\n")
    assert [e.name for e in watch.events(child)] == ["emitter is standby", "emitter is active"]
    active = watch.first(child, "emitter is active", since_ms=2500)
    assert active is not None
    assert active.at_ms == 3000
    assert watch.first(child, "emitter is active", since_ms=3001) is None
    assert [e.name for e in watch.since(child, 1000)] == ["emitter is standby", "emitter is active"]


# ------------------------------------------------------------------ nodes


class FakeNodes:
    def __init__(self) -> None:
        self.calls: list[tuple[str, object]] = []

    def node_ids(self) -> list[int]:
        return [1, 2, 3]

    def pid(self, node: int) -> int | None:
        return 100 + node

    def kill(self, node: int) -> None:
        self.calls.append(("kill", node))

    def pause(self, node: int) -> None:
        self.calls.append(("pause", node))

    def resume(self, node: int) -> None:
        self.calls.append(("resume", node))

    def start(self, node: int) -> None:
        self.calls.append(("start", node))

    def leader_of(self, topic: str, partition: int) -> int | None:
        return 1 if topic.endswith("timers") else 2

    def txn_coordinator(self, txn_id: str) -> int | None:
        return 3

    def group_coordinator(self, group: str) -> int | None:
        return None

    def wait_recovered(self, node: int, timeout_s: float) -> bool:
        self.calls.append(("wait_recovered", node))
        return True


def test_targets_cover_partitions_transactions_and_groups() -> None:
    rng = random.Random(8)
    targets = [
        choose_target(
            rng,
            partitions=[("p.exec.chaos", 6), ("p.timers", 26)],
            transactional_ids=["p.emitter", "p.emitter.1"],
            groups=["p.worker.chaos"],
        )
        for _ in range(300)
    ]
    assert {t.kind for t in targets} == {"partition", "transaction", "group"}
    assert all(0 <= t.partition < 26 for t in targets if t.name == "p.timers")
    assert all(0 <= t.partition < 6 for t in targets if t.name == "p.exec.chaos")


def test_choose_target_takes_the_sort_asked_for_when_it_has_candidates() -> None:
    rng = random.Random(3)

    def draw(sort: str, groups: list[str]) -> str:
        return choose_target(
            rng,
            partitions=[("p.timers", 26)],
            transactional_ids=["p.emitter"],
            groups=groups,
            sort=sort,
        ).kind

    for sort in ("partition", "transaction", "group"):
        assert {draw(sort, ["g"]) for _ in range(20)} == {sort}
    # no group given: the sort asked for is not possible, another is drawn
    assert {draw("group", []) for _ in range(40)} == {"partition", "transaction"}


def test_choose_target_needs_something_to_aim_at() -> None:
    with pytest.raises(ValueError, match="no partitions"):
        choose_target(random.Random(), partitions=[], transactional_ids=[], groups=[])


def test_resolve_asks_the_cluster_for_the_node_that_matters() -> None:
    nodes = FakeNodes()
    assert resolve(nodes, LeaderTarget("partition", "p.timers", 3)) == 1
    assert resolve(nodes, LeaderTarget("partition", "p.exec.chaos", 0)) == 2
    assert resolve(nodes, LeaderTarget("transaction", "p.emitter")) == 3
    assert resolve(nodes, LeaderTarget("group", "p.worker.chaos")) is None
    assert LeaderTarget("transaction", "p.emitter").describe() == (
        "transaction coordinator of p.emitter"
    )
