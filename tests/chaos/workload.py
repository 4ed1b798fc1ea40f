"""The chaos workload: what to schedule and when (a pure plan), and the loop that does it.

One-shot jobs are spread over the run with delays that land in every part of
the wheel (near, level 0, level 1, level 2, beyond the top level, where a
timer is placed again at every visit). Most succeed; some fail a few times
first; some always fail (DLQ, ``exhausted``) or fail permanently (DLQ at
once). A few cron schedules with seconds resolution fire all through the
run and are deleted at its end.

Some jobs that succeed are steered while they wait, by command to the worker
that owns their partition (the queue is finalized before the run): cancelled,
moved later, moved earlier (the SDK reads the job from its timer and replaces
it), or given a new payload (``v`` 2). :class:`Steered` records what the SDK
answered and when, for the judge.
"""

from __future__ import annotations

import random
import sys
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any, TypeVar

from dueflow.config import Settings
from dueflow.errors import DueflowError, InvalidInput
from dueflow.producers.scheduler import Scheduler
from dueflow.timeutil import from_utc_ms
from tests.chaos.handlers import QUEUE
from tests.chaos.ledger import now_ms

# (weight, low s, high s) of the delay between sending a job and its due time
DELAYS: tuple[tuple[float, float, float], ...] = (
    (35, 0.0, 0.3),  # near partitions
    (25, 0.5, 2.0),  # level 0
    (20, 2.0, 8.0),  # level 1
    (15, 8.0, 40.0),  # level 2
    (5, 40.0, 90.0),  # beyond the top level: placed again at each visit
)
# (weight, kind, task)
KINDS: tuple[tuple[float, str, str], ...] = (
    (80, "ok", "chaos-ok"),
    (10, "flaky", "chaos-flaky"),
    (5, "doomed", "chaos-doomed"),
    (5, "permanent", "chaos-permanent"),
)
CRON = (
    ("chaos-every-2s", "*/2 * * * * *"),
    ("chaos-every-3s", "*/3 * * * * *"),
    ("chaos-every-5s", "*/5 * * * * *"),
)
# (weight, op) of the steering commands
STEER_WEIGHTS: tuple[tuple[float, str], ...] = (
    (40, "cancel"),
    (30, "later"),
    (15, "earlier"),
    (15, "update"),
)
STEER_OPS = tuple(op for _w, op in STEER_WEIGHTS)
STEER_SHARE = 0.12  # of the jobs that succeed and are due at least STEER_MIN_DELAY_S out
STEER_MIN_DELAY_S = 3.0
STEER_MIN_LEAD_MS = 800  # a command is not sent this close to its job's due time
# A failed schedule call is retried (same job id, same due time) for this long.
RETRY_FOR_S = 120.0
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class PlannedJob:
    n: int
    kind: str
    task: str
    send_at_s: float  # after the run's start
    delay_s: float
    payload: dict[str, int]

    @property
    def job_id(self) -> str:
        return f"chaos-{self.n:06d}"


def _weighted(rng: random.Random, weights: list[float]) -> int:
    """Index drawn with the given weights."""
    x = rng.random() * sum(weights)
    for i, w in enumerate(weights):
        x -= w
        if x < 0:
            return i
    return len(weights) - 1


def plan_jobs(*, rng: random.Random, duration_s: float, rate_per_s: float) -> list[PlannedJob]:
    """The one-shot jobs of a run, by send time (pure: the random draws come from ``rng``)."""
    jobs = []
    for n in range(int(duration_s * 0.9 * rate_per_s)):
        send_at = rng.uniform(0.0, duration_s * 0.9)
        _w, low, high = DELAYS[_weighted(rng, [d[0] for d in DELAYS])]
        delay = min(rng.uniform(low, high), duration_s + 20.0 - send_at)
        _w2, kind, task = KINDS[_weighted(rng, [k[0] for k in KINDS])]
        payload = {"n": n, "sleep_ms": rng.choice((0, 0, 0, 5, 20, 100))}
        if kind == "flaky":
            payload["fail_times"] = rng.choice((1, 2))
        jobs.append(PlannedJob(n, kind, task, send_at, max(0.0, delay), payload))
    jobs.sort(key=lambda j: j.send_at_s)
    return jobs


@dataclass(frozen=True, slots=True)
class PlannedSteer:
    """A command for job ``n``: ``op`` (cancel, later, earlier, update), sent ``at_s``
    after the run's start; ``share``: a later move adds ``share`` x 10 s to the due
    time, an earlier one puts it ``share`` of the time left from the command on."""

    n: int
    op: str
    at_s: float
    share: float


def plan_steering(jobs: list[PlannedJob], *, rng: random.Random) -> list[PlannedSteer]:
    """The commands of a run, by send time (pure): for a share of the jobs that succeed
    and are due at least :data:`STEER_MIN_DELAY_S` after they are sent, one command
    sent while they wait (at least 1.5 s before they are due, as planned)."""
    out = []
    for job in jobs:
        if job.kind != "ok" or job.delay_s < STEER_MIN_DELAY_S or rng.random() >= STEER_SHARE:
            continue
        _w, op = STEER_WEIGHTS[_weighted(rng, [o[0] for o in STEER_WEIGHTS])]
        at = job.send_at_s + rng.uniform(0.3, job.delay_s - 1.5)
        out.append(PlannedSteer(job.n, op, at, rng.uniform(0.2, 0.8)))
    out.sort(key=lambda s: s.at_s)
    return out


@dataclass(frozen=True, slots=True)
class Steered:
    """A command the workload sent for job ``key``, and what the SDK answered.

    ``state``: ``accepted`` (the broker acknowledged the command at ``acked_ms``),
    ``refused`` (the SDK wrote nothing: ``reason``), ``unknown`` (the call failed:
    the command may or may not be written). ``new_due_ms``: a move's new due time
    (else the old one)."""

    key: str
    op: str  # cancel, later, earlier, update
    sent_ms: int
    acked_ms: int
    old_due_ms: int
    new_due_ms: int
    state: str
    reason: str = ""


@dataclass(frozen=True, slots=True)
class Accepted:
    """A job the broker acknowledged.

    ``requested_ms`` is the due time the client asked for (``run_at``, whole
    milliseconds); ``due_ms`` the one the scheduler returned (equal, unless the
    client library changed it: the judge counts that).
    """

    key: str
    kind: str
    due_ms: int
    requested_ms: int = -1  # -1: same as due_ms
    task: str = ""
    fail_times: int = 0  # a flaky job's failing attempts (payload)

    @property
    def asked_ms(self) -> int:
        return self.due_ms if self.requested_ms < 0 else self.requested_ms


@dataclass(frozen=True, slots=True)
class CronRun:
    schedule_id: str
    cron: str
    added_ms: int
    deleted_ms: int | None


@dataclass
class Workload:
    """Schedules the plan from a thread; what was accepted is read after :meth:`join`."""

    settings: Settings
    plan: list[PlannedJob]
    duration_s: float
    steer_plan: list[PlannedSteer] = field(default_factory=list)
    accepted: list[Accepted] = field(default_factory=list)
    steered: list[Steered] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    cron: list[CronRun] = field(default_factory=list)
    errors: int = 0
    _thread: threading.Thread | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    delete_now: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    def start(self) -> Workload:
        self._thread = threading.Thread(target=self._main, name="chaos-workload", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self.delete_now.set()

    def cron_ids(self) -> list[str]:
        return [schedule_id for schedule_id, _cron in CRON]

    def join(self, timeout_s: float) -> None:
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                frame = sys._current_frames().get(self._thread.ident or -1)
                where = "".join(traceback.format_stack(frame)) if frame else "(no frame)"
                raise AssertionError(f"the workload thread did not finish; it waits in:\n{where}")
        if self.error is not None:
            raise self.error

    def _main(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # surfaced by join()
            self.error = exc

    def _retry(self, what: str, call: Callable[[], T]) -> T | None:
        deadline = time.monotonic() + RETRY_FOR_S
        while not self._stop.is_set():
            try:
                return call()
            except InvalidInput:
                raise
            except DueflowError:
                self.errors += 1
                if time.monotonic() > deadline:
                    self.failed.append(what)
                    return None
                time.sleep(0.5)
        return None

    def _steer(self, scheduler: Scheduler, cmd: PlannedSteer, job: Accepted) -> None:
        """Send ``cmd`` for ``job`` (once: a failed call is recorded as ``unknown``)."""
        sent = now_ms()
        old = job.asked_ms
        left = old - sent
        if left < STEER_MIN_LEAD_MS:
            return  # the workload fell behind its plan: too close to the due time
        new = old
        try:
            if cmd.op == "cancel":
                done: Any = scheduler.cancel(job.key, queue=QUEUE)
                ok, reason = done.cancelled, done.reason
            elif cmd.op in ("later", "earlier"):
                shift = round(cmd.share * 10_000) if cmd.op == "later" else -round(cmd.share * left)
                new = old + max(1, shift) if cmd.op == "later" else old + min(-1, shift)
                done = scheduler.reschedule(job.key, run_at=from_utc_ms(new), queue=QUEUE)
                ok, reason = done.rescheduled, done.reason
                new = int(done.due_ms) if ok else new
            else:
                payload = {"n": int(job.key.rsplit("-", 1)[-1]), "sleep_ms": 0, "v": 2}
                done = scheduler.update(job.key, payload=payload, queue=QUEUE)
                ok, reason = done.updated, done.reason
        except DueflowError as exc:
            self.errors += 1
            self.steered.append(Steered(job.key, cmd.op, sent, -1, old, new, "unknown", str(exc)))
            return
        state = "accepted" if ok else "refused"
        self.steered.append(
            Steered(job.key, cmd.op, sent, now_ms(), old, new, state, str(reason or ""))
        )

    def _run(self) -> None:
        began = time.monotonic()
        scheduler = Scheduler(self.settings, delivery_timeout_s=20.0)
        self._retry("start", scheduler.start)
        try:
            added: dict[str, int] = {}
            for schedule_id, cron in CRON:
                done = self._retry(
                    schedule_id,
                    partial(
                        scheduler.add_schedule,
                        schedule_id,
                        cron=cron,
                        timezone="UTC",
                        task="chaos-cron",
                        queue=QUEUE,
                        misfire="fire_all",
                    ),
                )
                if done is not None:
                    added[schedule_id] = now_ms()
            events = sorted(
                [(j.send_at_s, 0, j) for j in self.plan]
                + [(c.at_s, 1, c) for c in self.steer_plan],
                key=lambda e: (e[0], e[1]),
            )
            by_n: dict[int, Accepted] = {}
            for at_s, _order, item in events:
                wait = began + at_s - time.monotonic()
                if wait > 0 and self._stop.wait(wait):
                    break
                if isinstance(item, PlannedSteer):
                    target = by_n.get(item.n)
                    if target is not None:
                        self._steer(scheduler, item, target)
                    continue
                job = item
                # Whole milliseconds: the judge compares run starts with this exact time.
                requested = now_ms() + round(job.delay_s * 1000)
                result = self._retry(
                    job.job_id,
                    partial(
                        scheduler.schedule,
                        job.task,
                        job.payload,
                        run_at=from_utc_ms(requested),
                        queue=QUEUE,
                        job_id=job.job_id,
                    ),
                )
                if result is not None:
                    accepted = Accepted(
                        job.job_id,
                        job.kind,
                        result.due_ms,
                        requested_ms=requested,
                        task=job.task,
                        fail_times=job.payload.get("fail_times", 0),
                    )
                    self.accepted.append(accepted)
                    by_n[job.n] = accepted
            # The schedules are deleted once the driver says the cluster is healthy
            # and caught up: a deletion drops occurrences that are still pending,
            # also those missed while no emitter ran.
            self.delete_now.wait()
            for schedule_id, cron in CRON:
                if schedule_id not in added:
                    continue
                self._retry(
                    f"delete {schedule_id}",
                    partial(scheduler.delete_schedule, schedule_id),
                )
                self.cron.append(CronRun(schedule_id, cron, added[schedule_id], now_ms()))
        finally:
            scheduler.close()
