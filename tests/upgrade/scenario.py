"""An upgrade scenario as a list of steps, run in order against one deployment.

A step is a small frozen dataclass with ``run(stage)``; :func:`run_steps`
runs a list of them and times each. The steps here are the vocabulary of
``tests/integration/test_upgrade.py``; a change that needs more (a command of
its own, another setting on the new processes, a check of what its records
did) adds a step or a :class:`Check` to the list there (see tests/README.md,
"Upgrade tests"). Releases are named by their key in :attr:`Stage.releases`:
``tests.upgrade.release.PREVIOUS`` (the tag) and ``CURRENT`` (this tree).
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from tests.integration.pipeline_support import wait_for
from tests.support.worker_process import dead_letters
from tests.upgrade.deployment import QUEUE, RETRY_TIERS_MS, Deployment, Stream
from tests.upgrade.release import Release
from tests.upgrade.verdict import Verdict, judge, planned_jobs


@dataclass
class Stage:
    """What the steps share: the deployment, the scheduling stream, the releases by
    name, ``notes`` that one step leaves for a later one, and the job ids a step
    steers itself (``exempt``: cancelled, moved...), which the verdict leaves to that
    step's own check."""

    deployment: Deployment
    stream: Stream
    releases: Mapping[str, Release]
    notes: dict[str, Any] = field(default_factory=dict)
    exempt: set[str] = field(default_factory=set)
    timeline: list[tuple[str, float]] = field(default_factory=list)

    def release(self, name: str) -> Release:
        return self.releases[name]

    def verdict(self) -> Verdict:
        """Every planned job judged from the ledger and the DLQ as they are now."""
        dead: dict[str, list[str]] = {}
        for entry in dead_letters(self.deployment.settings, QUEUE):
            dead.setdefault(entry.job_id, []).append(entry.reason)
        return judge(
            [p for p in planned_jobs(self.stream.facts()) if p.job_id not in self.exempt],
            [r for r in self.deployment.ledger.runs() if r.job_id not in self.exempt],
            dead,
            tiers_ms=RETRY_TIERS_MS,
            aborted=self.deployment.aborted_commits(),
            ends=self.deployment.attempt_ends(),
            starts=self.deployment.attempt_starts(),
        )


class Step(Protocol):
    def run(self, stage: Stage) -> None: ...


def run_steps(stage: Stage, steps: Sequence[Step]) -> None:
    """Run ``steps`` in order; ``stage.timeline`` gets each one's duration."""
    for step in steps:
        started = time.monotonic()
        step.run(stage)
        stage.timeline.append((repr(step), round(time.monotonic() - started, 1)))


# ----------------------------------------------------------------- the steps


@dataclass(frozen=True)
class Start:
    """``count`` processes of ``role`` (emitter, worker, status) of a release, started
    together and waited for until each is ready. ``env``: more settings for them;
    ``app_id``: a status view's app id (default ``<prefix>.status``)."""

    role: str
    release: str
    count: int = 1
    env: Mapping[str, str] = field(default_factory=dict)
    app_id: str | None = None

    def run(self, stage: Stage) -> None:
        release = stage.release(self.release)
        app_id = None if self.app_id is None else f"{stage.deployment.prefix}.{self.app_id}"
        started = [
            stage.deployment.start(self.role, release, dict(self.env), app_id=app_id)
            for _ in range(self.count)
        ]
        for member in started:
            stage.deployment.wait_ready(member)


@dataclass(frozen=True)
class Replace:
    """A rolling update's step: one process of ``role`` replaced by one of ``by``.
    ``which``: ``oldest`` (the longest running), ``standby`` or ``active`` (emitters), or
    for a status view its app id without the prefix (``status``: the default view).
    A worker gets its SIGTERM while it runs a job and has a retry pending
    (``when_busy``, see :meth:`Deployment.replace`)."""

    role: str
    by: str
    which: str = "oldest"
    env: Mapping[str, str] = field(default_factory=dict)
    when_busy: bool = True

    def run(self, stage: Stage) -> None:
        d = stage.deployment
        if self.which == "active":
            old = d.active_emitter()
        elif self.which == "standby":
            old = d.standby_emitter()
        elif self.role == "status" and self.which != "oldest":
            old = d.status_view(f"{d.prefix}.{self.which}")
        else:
            old = next(m for m in d.members if m.role == self.role)
        assert old.role == self.role, (old.name, self.role)
        d.replace(old, stage.release(self.by), dict(self.env), when_busy=self.when_busy)


@dataclass(frozen=True)
class Freeze:
    """The active emitter stopped (SIGSTOP) until another emitter holds the lease and
    ``jobs`` runs of jobs due after that takeover happened, then resumed (SIGCONT):
    a zombie. ``notes["frozen"]``: who, and when (wall ms) it was stopped, taken over
    and resumed."""

    jobs: int = 20
    timeout_s: float = 60.0

    def run(self, stage: Stage) -> None:
        d = stage.deployment
        old = d.active_emitter()
        os.kill(old.pid, signal.SIGSTOP)
        stopped_ms = time.time_ns() // 1_000_000
        try:

            def successor() -> object:
                holders = {pid for pid, active in d.emitter_group().items() if active}
                return next((m for m in d.emitters() if m.pid in holders and m is not old), None)

            new = wait_for(f"another emitter than {old.name} active", successor, self.timeout_s)
            took_ms = time.time_ns() // 1_000_000
            wait_for(
                f"{self.jobs} jobs due after the takeover run while {old.name} is stopped",
                lambda: sum(1 for r in d.ledger.runs() if r.due_ms > took_ms) >= self.jobs,
                self.timeout_s,
            )
        finally:
            os.kill(old.pid, signal.SIGCONT)
        stage.notes["frozen"] = {
            "stopped": old.name,
            "successor": getattr(new, "name", None),
            "stopped_ms": stopped_ms,
            "took_over_after_ms": took_ms - stopped_ms,
            "resumed_after_ms": time.time_ns() // 1_000_000 - stopped_ms,
        }


@dataclass(frozen=True)
class CronPlan:
    """A cron schedule a :class:`Schedule` step adds: every ``every_s`` seconds from
    ``starts_in_s`` after the stream adds it, for ``lasts_s``, with jobs of ``kind``.
    The emitter places a schedule's first occurrence after the time it reads it, so
    ``starts_in_s`` is the margin it has to read the schedule."""

    schedule_id: str
    every_s: int
    kind: str
    starts_in_s: float
    lasts_s: float

    def spec(self) -> str:
        """``ID|EXPRESSION|KIND|STARTS_IN_MS|LASTS_MS``: the stream turns the window into
        times by its own clock when it adds the schedule, so a stream slow to start
        never adds a schedule whose first planned occurrences are already past."""
        starts_in, lasts = int(self.starts_in_s * 1000), int(self.lasts_s * 1000)
        return f"{self.schedule_id}|*/{self.every_s} * * * * *|{self.kind}|{starts_in}|{lasts}"


@dataclass(frozen=True)
class Schedule:
    """The scheduling service runs ``release``'s SDK from now on (started, scheduling,
    then the one before it stopped). ``far`` jobs due ``far_delay_s`` out first, and
    the ``cron`` schedules added."""

    release: str
    far: int = 0
    far_delay_s: float = 60.0
    cron: tuple[CronPlan, ...] = ()

    def run(self, stage: Stage) -> None:
        stage.stream.start(
            stage.release(self.release),
            far=self.far,
            far_delay_s=self.far_delay_s,
            cron=tuple(plan.spec() for plan in self.cron),
        )


@dataclass(frozen=True)
class StopScheduling:
    """The scheduling service stops (after its last job is acknowledged)."""

    def run(self, stage: Stage) -> None:
        stage.stream.stop()


@dataclass(frozen=True)
class JobsRun:
    """Until ``count`` more attempts ran (the ledger grew): jobs flow on."""

    count: int
    timeout_s: float = 90.0

    def run(self, stage: Stage) -> None:
        ledger = stage.deployment.ledger
        target = ledger.count() + self.count
        wait_for(f"{self.count} more runs", lambda: ledger.count() >= target, self.timeout_s)


@dataclass(frozen=True)
class Command:
    """``dueflow ARGV`` of a release against the deployment; its exit code one of
    ``ok``; its output kept in ``notes[note]`` when ``note`` is given (parsed when
    ``ARGV`` has ``--json``)."""

    release: str
    argv: tuple[str, ...]
    note: str | None = None
    ok: tuple[int, ...] = (0,)

    def run(self, stage: Stage) -> None:
        done = stage.deployment.cli(stage.release(self.release), *self.argv)
        assert done.returncode in self.ok, (
            f"dueflow {' '.join(self.argv)} ({self.release}) exited {done.returncode}:\n"
            f"{done.stdout[-3000:]}{done.stderr[-3000:]}"
        )
        if self.note is not None:
            output = done.stdout
            stage.notes[self.note] = json.loads(output) if "--json" in self.argv else output


@dataclass(frozen=True)
class Until:
    """Until ``predicate(stage)`` holds (an event a later step needs)."""

    name: str
    predicate: Callable[[Stage], object]
    timeout_s: float = 90.0

    def run(self, stage: Stage) -> None:
        wait_for(self.name, lambda: self.predicate(stage), self.timeout_s)

    def __repr__(self) -> str:
        return f"Until({self.name!r})"


@dataclass(frozen=True)
class Settle:
    """Until every planned job reached its end (or the deadline: the last due time
    plus ``margin_s``); ``notes["verdict"]`` is the verdict then."""

    margin_s: float = 60.0

    def run(self, stage: Stage) -> None:
        last_due = max(p.due_ms for p in planned_jobs(stage.stream.facts()))
        deadline = max(0.0, (last_due - time.time_ns() // 1_000_000) / 1000) + self.margin_s

        def settled() -> bool:
            stage.notes["verdict"] = verdict = stage.verdict()
            return not verdict.unfinished

        with contextlib.suppress(AssertionError):  # the verdict says what did not finish
            wait_for("every planned job at its end", settled, deadline)


@dataclass(frozen=True)
class Check:
    """Any assertion on the stage, under a name for the timeline."""

    name: str
    check: Callable[[Stage], None]

    def run(self, stage: Stage) -> None:
        self.check(stage)

    def __repr__(self) -> str:
        return f"Check({self.name!r})"
