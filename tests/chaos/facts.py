"""What the chaos judge is given (pure values): the evidence of one run and the rules.

The readers that fill these from Kafka, the ledger, the workload and the fault
driver are in :mod:`tests.chaos.evidence`; the judge is
:func:`tests.chaos.verdict.judge`. Times are UTC epoch milliseconds as the
process that recorded them saw them; the judge corrects them by
``Evidence.skews``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.chaos.ledger import Effect, Run
from tests.chaos.workload import Accepted, CronRun, Steered

TERMINAL = frozenset({"succeeded", "dead"})
# Outcomes that close one attempt (the worker commits one of these per attempt).
ATTEMPT_ENDS = frozenset({"succeeded", "retrying", "dead"})


@dataclass(frozen=True, slots=True)
class Outcome:
    """One committed record of the outcomes topic."""

    key: str  # idempotency key
    job_id: str
    state: str  # succeeded, retrying, dead, duplicate, ...
    attempt: int
    ts_ms: int  # the record's timestamp (before its transaction committed)
    pid: int | None = None  # the writer's process when known (its clock made ts_ms)
    # Its offset (-1: not known). Every outcome of a key is in one partition, so
    # offsets order a key's outcomes as the broker appended them.
    offset: int = -1


@dataclass(frozen=True, slots=True)
class DeadLetter:
    """One committed record of the queue's DLQ topic."""

    key: str
    job_id: str
    reason: str
    attempts: int
    redriven: bool = False  # the dead job was itself a redrive (df-redriven-at)


@dataclass(frozen=True, slots=True)
class Fire:
    """One committed record of an exec topic (what the emitter fired, or an operator resent)."""

    key: str
    job_id: str
    resent: bool = False  # df-redriven-at or df-replayed-from: not the emitter's fire


@dataclass(frozen=True, slots=True)
class Fault:
    """One injected fault: ``kind``, wall-clock start and end, victim process ids."""

    kind: str
    at_ms: int
    until_ms: int
    pids: frozenset[int] = frozenset()
    takeover_ms: int | None = None  # an emitter's fault: until a new one was active

    @classmethod
    def from_log(cls, entry: Mapping[str, Any]) -> Fault:
        """A fault log entry (``kind``, ``at_ms``, ``until_ms``, ``pids``) as a Fault;
        ValueError naming the field when one is missing or wrong."""
        for name in ("kind", "at_ms", "until_ms", "pids"):
            if name not in entry:
                raise ValueError(f"fault log entry {dict(entry)!r}: no {name!r}")
        at, until = int(entry["at_ms"]), int(entry["until_ms"])
        if until < at:
            raise ValueError(f"fault log entry {dict(entry)!r}: until_ms before at_ms")
        takeover = entry.get("takeover_ms")
        return cls(
            str(entry["kind"]),
            at,
            until,
            frozenset(int(p) for p in entry["pids"]),
            None if takeover is None else int(takeover),
        )


@dataclass(frozen=True, slots=True)
class Dropped:
    """A worker process dropped its uncommitted work, as its own log says: a queue
    restart (a wedged or fenced transactional producer) or lost partitions. What it
    ran and had not committed runs again (docs/workers.md)."""

    pid: int
    at_ms: int  # the process's own clock
    reason: str
    # A wedged commit: what it held was in doubt from this time on (own clock).
    in_doubt_since_ms: int | None = None


@dataclass(frozen=True, slots=True)
class RetryPlan:
    """How a task retries: attempts in all, and the wait after failed attempt n
    (``delays_ms[n - 1]``; the last one repeats)."""

    max_attempts: int
    delays_ms: tuple[int, ...] = (0,)

    def delay_after(self, attempt: int) -> int:
        return self.delays_ms[min(attempt, len(self.delays_ms)) - 1]

    @property
    def total_ms(self) -> int:
        """Every wait of a job that uses all its attempts."""
        return sum(self.delay_after(n) for n in range(1, self.max_attempts))


@dataclass(frozen=True, slots=True)
class Rules:
    """The judge's margins (see the module docstring of :mod:`tests.chaos.verdict`)."""

    slack_ms: int = 60_000  # late: terminal outcome after due + retry plan + this + outages
    early_tolerance_ms: int = 0  # early: a run started before due - this
    cron_read_margin_ms: int = 2_000  # the emitter reads a new schedule within this
    cron_takeover_ms: int = 15_000  # a new active emitter after an emitter/broker fault
    cron_end_margin_ms: int = 3_000  # occurrences this close to deletion may not fire
    outage_lookback_ms: int = 30_000  # a run this long before an outage may be uncommitted
    # Faults that make the cluster (or the leaders a run needs) unavailable for a while.
    outage_kinds: frozenset[str] = frozenset(
        {"restart_broker", "kill9_broker", "pause_broker", "kill_leader", "pause_leader"}
    )
    # Faults that end processes with SIGTERM: they drain and commit, so they excuse nothing.
    graceful_kinds: frozenset[str] = frozenset(
        {"add_worker", "remove_worker", "rolling_restart", "skew_worker", "skew_emitter"}
    )
    # Faults that freeze a process (SIGSTOP): a commit it had under way ends after it.
    freeze_kinds: frozenset[str] = frozenset({"stop_worker"})
    # A freeze this soon after an outcome's timestamp may have caught its commit.
    freeze_slack_ms: int = 2_000
    # A run whose recorded start is this soon after a freeze of its process ended
    # may have begun before it (the handler was being called when it froze).
    thaw_slack_ms: int = 1_000
    # A run whose recorded start is this soon after its process dropped its work
    # was dispatched before the drop (the handler records its start in its first
    # step, after the loop turn that began the restart).
    drop_slack_ms: int = 100
    fault_minimums: Mapping[str, int] = field(default_factory=dict)  # kind -> at least


@dataclass(frozen=True, slots=True)
class Evidence:
    """Everything one chaos run left behind."""

    accepted: Sequence[Accepted]  # one-shot jobs the broker acknowledged
    cron: Sequence[CronRun]  # schedules, when added and deleted
    runs: Sequence[Run]  # the handlers' ledger: every invocation
    effects: Mapping[str, Effect]  # the ledger's idempotent effects by key
    outcomes: Sequence[Outcome] = ()
    dead_letters: Sequence[DeadLetter] = ()
    fires: Sequence[Fire] = ()
    faults: Sequence[Fault] = ()
    dropped: Sequence[Dropped] = ()  # from the workers' logs
    skews: Mapping[int, int] = field(default_factory=dict)  # pid -> clock ahead by, ms
    plans: Mapping[str, RetryPlan] = field(default_factory=dict)  # task -> its retry plan
    default_plan: RetryPlan = RetryPlan(1)
    emitter_pids: frozenset[int] = frozenset()
    effect_conflicts: int = 0
    steered: Sequence[Steered] = ()  # commands the workload sent, with the SDK's answers
