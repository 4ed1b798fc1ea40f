"""Which faults a chaos run injects, in which order, and how far apart (pure).

The driver (:mod:`tests.chaos.faults`) asks :class:`KindQueue` for the next kind
it can inject now. The queue starts with every kind ``min_per_kind`` times, in
rounds (each round every kind once, shuffled), so a kind's occurrences are
spread over the run and a short run still covers every kind; after them come
weighted random draws. A kind that cannot run now (a broker fault too soon
after the last one, no standby emitter to take over) is skipped for the next
one and stays at the front.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field

# Relative weights of the random draws after the minimums, one broker node.
SINGLE_NODE_WEIGHTS: dict[str, float] = {
    "kill_active_emitter": 2.0,
    "stop_active_emitter": 2.0,
    "kill_worker": 2.0,
    "stop_worker": 2.0,
    "rolling_restart": 0.6,
    "skew_worker": 1.0,
    "skew_emitter": 1.0,
    "restart_broker": 0.8,
    "kill9_broker": 0.6,
    "pause_broker": 0.8,
    "add_worker": 1.2,
    "remove_worker": 1.2,
}
# On a cluster, faults hit one node (the one that matters) instead of the only broker.
CLUSTER_WEIGHTS: dict[str, float] = {
    **{k: w for k, w in SINGLE_NODE_WEIGHTS.items() if not k.endswith("_broker")},
    "kill_leader": 1.5,
    "pause_leader": 1.5,
}
# Faults of the brokers: the cluster needs quiet time after each.
BROKER_KINDS = frozenset({"restart_broker", "kill9_broker", "pause_broker"})
NODE_KINDS = frozenset({"kill_leader", "pause_leader"})
QUIET_KINDS = BROKER_KINDS | NODE_KINDS
# Faults whose report carries ``takeover_ms`` (another emitter active and firing).
TAKEOVER_KINDS = frozenset({"kill_active_emitter", "stop_active_emitter"})
# Rough seconds a fault keeps the driver busy (the gaps are what is left over).
EXPECTED_S: dict[str, float] = {
    "kill_active_emitter": 1.0,
    "stop_active_emitter": 7.0,
    "kill_worker": 1.0,
    "stop_worker": 10.0,
    "rolling_restart": 20.0,
    "skew_worker": 5.0,
    "skew_emitter": 6.0,
    "restart_broker": 8.0,
    "kill9_broker": 7.0,
    "pause_broker": 7.0,
    "add_worker": 0.5,
    "remove_worker": 2.0,
    "kill_leader": 12.0,
    "pause_leader": 7.0,
}
ANY = "*"  # a random draw still owed (its expected duration: a typical fault's)
EXPECTED_ANY_S = 4.0


def fault_weights(*, cluster_nodes: int = 1) -> dict[str, float]:
    """The kinds of a run and their weights: the node kinds replace the broker kinds
    on a cluster of more than one node."""
    return dict(CLUSTER_WEIGHTS if cluster_nodes > 1 else SINGLE_NODE_WEIGHTS)


def fault_target(
    *, minutes: float, faults_per_minute: float, min_faults: int, min_per_kind: int, kinds: int
) -> int:
    """Faults to plan for a run: the rate's, at least ``min_faults`` and the coverage."""
    return max(min_faults, round(faults_per_minute * minutes), min_per_kind * kinds)


def coverage_rounds(kinds: Iterable[str], *, min_per_kind: int, rng: random.Random) -> list[str]:
    """Every kind ``min_per_kind`` times: round after round, each a shuffle of all kinds,
    without the same kind twice in a row across a round's border where avoidable."""
    names = sorted(kinds)
    out: list[str] = []
    for _ in range(max(0, min_per_kind)):
        round_ = names[:]
        rng.shuffle(round_)
        if out and len(round_) > 1 and round_[0] == out[-1]:
            round_[0], round_[-1] = round_[-1], round_[0]
        out.extend(round_)
    return out


def draw_kind(weights: Mapping[str, float], rng: random.Random) -> str:
    names = sorted(weights)
    return rng.choices(names, weights=[weights[k] for k in names])[0]


@dataclass
class KindQueue:
    """The kinds still to inject: the coverage rounds, then weighted draws up to ``total``."""

    weights: Mapping[str, float]
    min_per_kind: int
    total: int
    rng: random.Random
    pending: list[str] = field(default_factory=list)
    taken: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.pending = coverage_rounds(self.weights, min_per_kind=self.min_per_kind, rng=self.rng)

    def owed(self) -> list[str]:
        """Kinds planned and not taken yet: the coverage ones, then ``ANY`` for each
        random draw still owed to reach the total (at least one)."""
        extra = max(0, self.total - len(self.taken) - len(self.pending))
        return self.pending + [ANY] * extra or [ANY]

    def put_back(self, kind: str) -> None:
        """``kind`` was taken but could not run: first in line again."""
        if self.taken and self.taken[-1] == kind:
            self.taken.pop()
        self.pending.insert(0, kind)

    def take(self, feasible: Callable[[str], bool]) -> str | None:
        """The first pending kind that is feasible now (removed), else a feasible random
        draw once the coverage rounds are done; None when nothing can run now."""
        for i, kind in enumerate(self.pending):
            if feasible(kind):
                del self.pending[i]
                self.taken.append(kind)
                return kind
        if self.pending:
            return None  # owed kinds wait for their turn; no extras before them
        candidates = {k: w for k, w in self.weights.items() if feasible(k)}
        if not candidates:
            return None
        kind = draw_kind(candidates, self.rng)
        self.taken.append(kind)
        return kind


def gap_s(
    *,
    left_s: float,
    owed: Iterable[str],
    rng: random.Random,
    min_gap_s: float,
    expected_s: Mapping[str, float] = EXPECTED_S,
) -> float:
    """Seconds until the next fault: the time left after the owed faults' expected
    durations, shared among them (jittered), never below ``min_gap_s``."""
    owed = list(owed)
    busy = sum(expected_s.get(k, EXPECTED_ANY_S) for k in owed)
    free = max(0.0, left_s - busy)
    return max(min_gap_s, rng.uniform(0.6, 1.2) * free / max(1, len(owed)))


def shortfall(
    done: Iterable[str], kinds: Iterable[str], *, min_per_kind: int
) -> dict[str, dict[str, int]]:
    """Kinds injected fewer than ``min_per_kind`` times: ``{kind: {"got": n, "min": m}}``."""
    counts = Counter(done)
    return {
        k: {"got": counts[k], "min": min_per_kind}
        for k in sorted(kinds)
        if counts[k] < min_per_kind
    }


def ms_stats(values: Iterable[int | None]) -> dict[str, int | None]:
    """``n`` measured, ``missing`` (None: not seen), ``p50`` and ``max`` of the rest."""
    all_ = list(values)
    seen = sorted(v for v in all_ if v is not None)
    return {
        "n": len(seen),
        "missing": len(all_) - len(seen),
        "p50": seen[(len(seen) - 1) // 2] if seen else None,
        "max": seen[-1] if seen else None,
    }
