"""What a chaos run proved (pure: no I/O, no clock): the judge of :class:`Evidence`.

The truth is what Kafka committed (outcomes, dead letters and exec records,
read with read_committed) and what the client asked for (the workload's
requested due times, the cron expressions); the handlers' ledger says when
and where each run started and ended. Every time a process wrote is
corrected by its clock skew first: ``Evidence.skews`` maps a pid to how far
its clock was ahead (ms; absent = 0), so a true time is the written time
minus the skew. Ledger times carry the run's pid; an outcome's timestamp the
pid in its ``worker`` field.

Expected jobs are the accepted one-shot jobs and the expected cron
occurrences (below). The rules, each a number that must be 0 (or equal):

- **lost**: an expected job without a committed terminal outcome
  (``succeeded`` or ``dead``) at the end. (Not read from the ledger: a job the
  handler ran and Kafka never committed is lost to its users.)
- **late_terminal**: a terminal outcome later than due + bound, where bound =
  the job's retry plan (every backoff of all its attempts) + ``slack_ms``
  (default 60 s) + the whole length of each broker outage (fault kinds in
  ``outage_kinds``) that overlapped [due, terminal outcome]. Reported with the
  distribution of (terminal outcome time - due).
- **early**: a run (any attempt) that started before the due time the client
  asked for: the workload's requested ``run_at``, or for a cron occurrence the
  occurrence time from the expression (the chaos schedules have no jitter),
  never a record's own due header. Tolerance ``early_tolerance_ms`` (0 ms:
  early means start < due).
- **retry_early**: a run of attempt n > 1 that started before the earliest
  recorded failure (ledger end, result ``failed``) of attempt n - 1 plus the
  task's backoff after attempt n - 1. (The earliest: a failure that was run
  again after a kill may leave two ends; the check never blames a correct
  worker.) ``retry_orphans``: attempt n ran and no failure of n - 1 was
  recorded (informational).
- **flaky**: a job with ``fail_times = k`` must succeed on attempt k + 1
  exactly: its committed ``succeeded`` outcomes and its ledger effect all from
  attempt k + 1. ``flaky_wrong_attempt`` counts the jobs where one is not;
  ``flaky_ok`` of ``flaky_jobs`` the ones that did it right.
- **always-fail jobs**: ``doomed`` (retriable until exhausted) and
  ``permanent`` (DLQ at once) must each have exactly one dead letter (not
  counting dead letters of redriven records) with reason ``exhausted`` after
  the plan's attempts / ``permanent_error`` after 1, and exactly one ``dead``
  outcome: ``dlq_expected`` of ``dlq_expected_of``. ``dlq_unexpected``:
  dead letters of jobs that should have succeeded.
- **re-executions**: for each (key, attempt) with more than one run, a later
  run is **excused** when every earlier run of it was hit by a fault while it
  could still be uncommitted: a fault naming the earlier run's pid (any kind
  but ``graceful_kinds``: a SIGTERM'd worker finishes and commits its jobs)
  that began between that run's start and the later run's start; or a broker
  outage (``outage_kinds``) going on when the earlier run started or beginning
  at most ``outage_lookback_ms`` (30 s) after it, and beginning before the
  later run started (the earlier run's transaction could not commit: the
  worker abandons it and reads its records again); or the earlier run's
  process dropped its uncommitted work between the two starts, as its own log
  says (``Evidence.dropped``: "worker restarting queue", e.g. a transactional
  producer wedged after a broker restart and abandoned at its deadline, or
  "partitions lost"; ``worker_drops`` counts them by reason, so a worker that
  drops work without a fault shows), the earlier run's recorded start at most
  ``drop_slack_ms`` (100 ms) after the drop (seen in CI: "job.started" logged
  1 ms before "worker restarting queue", the handler's start 1 ms after it).
  A wedged commit's drop comes only at its deadline, after the partitions may
  have moved (a SIGTERM'd worker stuck in it stops heartbeating): it excuses a
  later run from the commit's start on (``in_doubt_since_ms`` in the worker's
  log) when the earlier run started before the drop. Otherwise **unexcused**. And
  any run that started after a committed terminal outcome of its key, or after
  a committed outcome (``succeeded``/``retrying``/``dead``) of its own attempt,
  is unexcused whatever the faults. When such an outcome committed is not in
  the record: its timestamp is when it was produced, and its transaction
  commits after that. Two things move it later. An outcome appended after the
  run's own outcome of that attempt (a higher offset: a key's outcomes share a
  partition) committed after the run, and does not count for it. And when the
  outcome's writer was frozen (``freeze_kinds``: SIGSTOP) within
  ``freeze_slack_ms`` (2 s) after its timestamp, its commit may have gone on
  after SIGCONT: it counts from the freeze's end (seen in CI: a worker stopped
  5 ms after producing a ``retrying`` outcome committed it 9.4 s later, after
  the new owner of its partition had run the attempt again). Likewise a run
  whose recorded start is at most ``thaw_slack_ms`` (1 s) after a freeze of its
  process ended counts from the freeze's start: the worker was calling the
  handler when it froze, and the handler recorded its start on waking.
- **duplicates**: a key Kafka saw finish more than once: two ``succeeded``
  outcomes, two dead letters (not counting redrives), or a dead letter and a
  success (outcome or ledger effect).
- **double_fires** (reported, not a failure): keys with more than one exec
  record not resent by an operator (``df-redriven-at``/``df-replayed-from``),
  and ``fires_per_key_max``. An emitter firing without transactions fires
  again, after a takeover or a restarted active period, what it fired after
  its last commit, and a stopped one that resumes fires until it learns it
  lost the lease: legitimate, because the workers skip a copy of a job whose
  key is final (or that runs in the same process). What must never happen
  twice is a *run*: the re-execution and duplicate rules above judge the runs
  and what Kafka committed, whatever the number of copies. (With
  ``emitter.transactional`` a job is fired once, and 0 double fires is what
  such a run should show.)
- **cron**: a schedule's expected occurrences are those strictly after
  ``added_ms`` (its ``add_schedule`` acknowledged) + ``cron_read_margin_ms``
  (2 s) + the largest clock skew ahead of any emitter, up to its deletion -
  ``cron_end_margin_ms`` (3 s). The emitter places a schedule's first
  occurrence strictly after the time it reads the schedule
  (``placement_needed``: "the first occurrence after now"), so occurrences in
  between may or may not fire; the margin is the time the active emitter takes
  to read a new schedule. When a fault that can stop the active emitter (a
  broker outage, or a fault naming an emitter's pid) overlaps
  [added_ms - ``cron_takeover_ms``, that start], the start moves to the
  fault's end + ``cron_takeover_ms`` (15 s: session timeout, restart, read), or
  + the takeover the run measured for it + ``cron_read_margin_ms`` when that is
  longer (a takeover during a broker outage took 18 s).
  Each expected occurrence is an expected job (lost, late, duplicates, ...).
- **faults_ok**: each kind in ``Rules.fault_minimums`` was injected at least
  that many times (``faults_missing`` lists the others).
- **steering** (commands the workload sent to the owner of a job's partition,
  ``Evidence.steered``; one per job): a command is *binding* when the broker
  acknowledged it (``accepted``) before the job's due time (the ack's time is
  after the append's, and the emitter fires a job into the same partition only
  once the broker's clock reached its due time: the command is before it in
  the log). ``steer_cancel_ran``: a run of a job cancelled by a binding command
  (it must never start); ``steer_cancel_unconfirmed``: such a job without a
  committed ``cancelled`` outcome. ``steer_ran_old``: a run of a job moved by a
  binding command from its original timer (no ``df-version``: it ran at its old
  time), or of a job updated by one with the old payload (``v`` not 2). A moved
  job's due time for **early**, **lost** and **late** is its new one: it never
  starts before it. A command that is not binding (acknowledged after the due
  time, or its call failed: it may or may not have been written) may or may not
  take effect: a cancelled job then ends ``cancelled`` or ``succeeded``, and a
  moved one must not start before the earlier of its two due times and is late
  from the later. A command the SDK refused wrote nothing and changes nothing.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from dueflow.rules.cron import occurrences, parse_cron
from tests.chaos.facts import (
    ATTEMPT_ENDS,
    TERMINAL,
    DeadLetter,
    Evidence,
    Fault,
    Outcome,
    RetryPlan,
    Rules,
)
from tests.chaos.ledger import Run
from tests.chaos.workload import CronRun, Steered

# kind -> the DLQ reason an always-fail job must end with
EXPECTED_DEATH = {"doomed": "exhausted", "permanent": "permanent_error"}
LISTED = 20  # keys listed per finding


@dataclass(frozen=True, slots=True)
class Job:
    """An expected job: a one-shot job or a cron occurrence, due when the client asked."""

    key: str
    kind: str  # ok, flaky, doomed, permanent, cron
    task: str
    due_ms: int
    fail_times: int = 0


def percentiles(values: Iterable[int]) -> dict[str, int | None]:
    ordered = sorted(values)

    def at(q: float) -> int | None:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else None

    return {"p50": at(0.5), "p90": at(0.9), "p99": at(0.99), "max": at(1.0)}


class Clocks:
    """Corrects times written by a process by that process's skew."""

    def __init__(self, skews: dict[int, int]) -> None:
        self.skews = skews

    def true(self, ms: int, pid: int | None) -> int:
        return ms if pid is None else ms - self.skews.get(pid, 0)

    def start(self, run: Run) -> int:
        return self.true(run.started_ms, run.pid)

    def end(self, run: Run) -> int | None:
        return None if run.ended_ms is None else self.true(run.ended_ms, run.pid)

    def outcome(self, o: Outcome) -> int:
        return self.true(o.ts_ms, o.pid)


# ------------------------------------------------------------------ expectations


def stops_emitter(f: Fault, ev: Evidence, rules: Rules) -> bool:
    return f.kind in rules.outage_kinds or bool(f.pids & ev.emitter_pids)


def takeover_of(f: Fault, rules: Rules) -> int:
    """How long after ``f`` ended a new active emitter may read a new schedule: the
    takeover the run measured, then the read margin; at least ``cron_takeover_ms``."""
    measured = 0 if f.takeover_ms is None else f.takeover_ms + rules.cron_read_margin_ms
    return max(rules.cron_takeover_ms, measured)


def cron_window(run: CronRun, ev: Evidence, rules: Rules) -> tuple[int, int]:
    """``(after, until]``: where ``run``'s occurrences must each end exactly once."""
    ahead = max((ev.skews.get(p, 0) for p in ev.emitter_pids), default=0)
    after = run.added_ms + rules.cron_read_margin_ms + max(0, ahead)
    hits = [
        f.until_ms + takeover_of(f, rules)
        for f in ev.faults
        if stops_emitter(f, ev, rules)
        and f.at_ms <= after
        and f.until_ms >= run.added_ms - takeover_of(f, rules)
    ]
    if hits:
        after = max(after, max(hits))
    if run.deleted_ms is None:
        return after, after  # never deleted: the run broke off, nothing is known
    return after, run.deleted_ms - rules.cron_end_margin_ms


def expected_jobs(ev: Evidence, rules: Rules) -> tuple[list[Job], dict[str, Any]]:
    """The jobs that must end, and per schedule its window and count."""
    jobs = [Job(a.key, a.kind, a.task, a.asked_ms, a.fail_times) for a in ev.accepted]
    per_schedule: dict[str, Any] = {}
    for run in ev.cron:
        after, until = cron_window(run, ev, rules)
        found = (
            occurrences(parse_cron(run.cron), after_ms=after, until_ms=until, tz="UTC", limit=10**6)
            if until > after
            else []
        )
        jobs.extend(Job(f"{run.schedule_id}@{o}", "cron", "", o) for o in found)
        per_schedule[run.schedule_id] = {
            "expected": len(found),
            "from_ms": after,
            "until_ms": until,
        }
    return jobs, per_schedule


def cron_due(key: str, schedule_ids: set[str]) -> int | None:
    """The occurrence time of a cron occurrence's key ``<schedule>@<ms>``."""
    sid, sep, at = key.rpartition("@")
    return int(at) if sep and sid in schedule_ids and at.isdigit() else None


@dataclass(frozen=True, slots=True)
class SteerView:
    """What a command means for its job's judgment."""

    command: Steered
    binding: bool  # accepted before the job's due time: it must take effect
    early_due_ms: int  # no run before this
    late_due_ms: int  # lateness counts from this
    ends: frozenset[str]  # the outcomes that end the job


def steering_views(ev: Evidence) -> dict[str, SteerView]:
    """Each steered job's :class:`SteerView` (refused commands changed nothing)."""
    out: dict[str, SteerView] = {}
    for c in ev.steered:
        if c.state == "refused":
            continue
        binding = c.state == "accepted" and 0 <= c.acked_ms < c.old_due_ms
        early, late = c.old_due_ms, c.old_due_ms
        ends = TERMINAL
        if c.op == "cancel":
            ends = frozenset({"cancelled"}) if binding else TERMINAL | {"cancelled"}
        elif c.op in ("later", "earlier"):
            if binding:
                early = late = c.new_due_ms
            else:
                early, late = min(c.old_due_ms, c.new_due_ms), max(c.old_due_ms, c.new_due_ms)
        out[c.key] = SteerView(c, binding, early, late, ends)
    return out


def judge_steering(
    ev: Evidence, views: dict[str, SteerView], outcomes: dict[str, list[Outcome]]
) -> dict[str, Any]:
    """The steering rules (module docstring)."""
    runs: dict[str, list[Run]] = defaultdict(list)
    for r in ev.runs:
        if r.key in views:
            runs[r.key].append(r)
    problems: list[dict[str, Any]] = []
    cancel_ran = cancel_unconfirmed = ran_old = 0
    for key, view in views.items():
        if not view.binding:
            continue
        c = view.command
        own = runs.get(key, [])
        if c.op == "cancel":
            if own:
                cancel_ran += 1
                problems.append({"key": key, "rule": "cancelled, ran", "runs": len(own)})
            if not any(o.state == "cancelled" for o in outcomes.get(key, [])):
                cancel_unconfirmed += 1
                problems.append({"key": key, "rule": "cancelled, no cancelled outcome"})
        elif c.op in ("later", "earlier"):
            old = [r for r in own if r.version is None]
            if old:
                ran_old += 1
                problems.append({"key": key, "rule": f"moved {c.op}, ran its original timer"})
        elif c.op == "update":
            old = [r for r in own if r.payload_v != 2]
            if old:
                ran_old += 1
                problems.append({"key": key, "rule": "updated, ran the old payload"})
    return {
        "steered": dict(Counter(f"{c.op} {c.state}" for c in ev.steered)),
        "steered_binding": dict(Counter(v.command.op for v in views.values() if v.binding)),
        "steer_cancel_ran": cancel_ran,
        "steer_cancel_unconfirmed": cancel_unconfirmed,
        "steer_ran_old": ran_old,
        "steer_problems": problems[:LISTED],
    }


# ------------------------------------------------------------------ rules


def run_start(r: Run, ev: Evidence, rules: Rules, clocks: Clocks) -> int:
    """When run ``r`` began, for the re-execution rules: its recorded start, or the
    start of a freeze of its process (``freeze_kinds``) that ended at most
    ``thaw_slack_ms`` before it. A worker frozen while it called the handler
    records the start on waking (seen in CI: "job.started" in the worker's log
    2 ms before SIGSTOP, the handler's start 0 ms after SIGCONT, 9.4 s later)."""
    start = clocks.start(r)
    for f in ev.faults:
        thawed = r.pid in f.pids and f.kind in rules.freeze_kinds
        # From the freeze's start: the end the chaos tool notes comes after its SIGCONT,
        # a few ms after the woken handler may have recorded its start (seen: 17 ms).
        if thawed and f.at_ms <= start <= f.until_ms + rules.thaw_slack_ms:
            return min(start, f.at_ms)
    return start


def excused_by(earlier: Run, later_start: int, ev: Evidence, rules: Rules, clocks: Clocks) -> str:
    """The kind of the fault that explains running ``earlier``'s attempt again ("" : none)."""
    start = run_start(earlier, ev, rules, clocks)
    for d in ev.dropped:
        if d.pid != earlier.pid or clocks.true(d.at_ms, d.pid) + rules.drop_slack_ms < start:
            continue
        if clocks.true(d.at_ms, d.pid) <= later_start:
            return f"dropped: {d.reason}"
        # A wedged commit is given up only at its deadline: what it held was in
        # doubt from its start, and a later run in between is the redelivery.
        since = d.in_doubt_since_ms
        if since is not None and clocks.true(since, d.pid) <= later_start:
            return f"dropped: {d.reason}"
    for f in ev.faults:
        if earlier.pid in f.pids and f.kind not in rules.graceful_kinds:
            if start <= f.at_ms <= later_start:
                return f.kind
        elif (
            f.kind in rules.outage_kinds
            and f.at_ms - rules.outage_lookback_ms <= start <= f.until_ms
            and f.at_ms <= later_start
        ):
            return f.kind
    return ""


def committed_by(o: Outcome, ev: Evidence, rules: Rules, clocks: Clocks) -> int:
    """The earliest time outcome ``o``'s transaction can be shown to have committed by:
    its timestamp, or, when its writer was frozen (``freeze_kinds``) within
    ``freeze_slack_ms`` after it, the end of that freeze (the commit under way
    went on after SIGCONT)."""
    at = clocks.outcome(o)
    for f in sorted(ev.faults, key=lambda f: f.at_ms):  # a resumed commit can freeze again
        frozen = o.pid in f.pids and f.kind in rules.freeze_kinds
        if frozen and at <= f.at_ms <= at + rules.freeze_slack_ms:
            at = max(at, f.until_ms)
    return at


def closed_before(
    r: Run, attempt: int, closing: list[Outcome], ev: Evidence, rules: Rules, clocks: Clocks
) -> int | None:
    """When ``closing`` (the outcomes that end ``r``'s attempt) first committed, as
    far as run ``r`` is concerned; None: none did before it.

    An outcome appended after ``r``'s own end of the attempt (a higher offset in
    the key's partition) was committed after ``r`` ran: it does not count for
    ``r``, whatever its timestamp (a zombie's transaction that committed late)."""
    own = [
        o.offset
        for o in closing
        if o.pid == r.pid and o.attempt == attempt and o.offset >= 0 and o.state in ATTEMPT_ENDS
    ]
    first_own = min(own, default=None)
    times = [
        committed_by(o, ev, rules, clocks)
        for o in closing
        if first_own is None or o.offset < 0 or o.offset < first_own
    ]
    return min(times, default=None)


def judge_runs(
    ev: Evidence, rules: Rules, clocks: Clocks, outcomes: dict[str, list[Outcome]]
) -> dict[str, Any]:
    """Re-executions (excused, unexcused) and runs after a committed outcome."""
    groups: dict[tuple[str, int], list[Run]] = defaultdict(list)
    for r in ev.runs:
        groups[(r.key, r.attempt)].append(r)
    unexcused: list[dict[str, Any]] = []
    excused_by_kind: Counter[str] = Counter()
    reruns = 0
    for (key, attempt), runs in groups.items():
        runs.sort(key=lambda r: run_start(r, ev, rules, clocks))
        closing = [
            o
            for o in outcomes.get(key, [])
            if o.state in TERMINAL or (o.state in ATTEMPT_ENDS and o.attempt == attempt)
        ]
        for i, r in enumerate(runs):
            start = run_start(r, ev, rules, clocks)
            why = ""
            closed_at = closed_before(r, attempt, closing, ev, rules, clocks)
            if closed_at is not None and start > closed_at:
                why = f"started {start - closed_at} ms after a committed outcome"
            elif i > 0:
                kinds = [excused_by(e, start, ev, rules, clocks) for e in runs[:i]]
                if all(kinds):
                    excused_by_kind.update({kinds[-1]: 1})
                else:
                    why = "no fault ended an earlier run of this attempt"
            reruns += i > 0
            if why:
                unexcused.append(
                    {"key": key, "attempt": attempt, "pid": r.pid, "started_ms": start, "why": why}
                )
    return {
        "reexecutions": reruns,
        "excused": sum(excused_by_kind.values()),
        "excused_by_kind": dict(excused_by_kind),
        "unexcused": len(unexcused),
        "unexcused_runs": unexcused[:LISTED],
    }


def judge_retries(ev: Evidence, clocks: Clocks, plan_of: dict[str, RetryPlan]) -> dict[str, Any]:
    """Attempt n > 1 never starts before attempt n - 1's failure + its backoff."""
    failures: dict[tuple[str, int], int] = {}
    for r in ev.runs:
        end = clocks.end(r)
        if r.result == "failed" and end is not None:
            k = (r.key, r.attempt)
            failures[k] = min(end, failures.get(k, end))
    early: list[dict[str, Any]] = []
    orphans = 0
    for r in ev.runs:
        if r.attempt <= 1:
            continue
        failed = failures.get((r.key, r.attempt - 1))
        if failed is None:
            orphans += 1
            continue
        plan = plan_of.get(r.key, ev.default_plan)
        not_before = failed + plan.delay_after(r.attempt - 1)
        if clocks.start(r) < not_before:
            early.append(
                {
                    "key": r.key,
                    "attempt": r.attempt,
                    "started_ms": clocks.start(r),
                    "not_before_ms": not_before,
                }
            )
    return {"retry_early": len(early), "retry_early_runs": early[:LISTED], "retry_orphans": orphans}


def judge_flaky(
    flaky: list[Job], ev: Evidence, outcomes: dict[str, list[Outcome]]
) -> dict[str, Any]:
    ok = 0
    wrong: list[dict[str, Any]] = []
    for job in flaky:
        want = job.fail_times + 1
        won = [o.attempt for o in outcomes.get(job.key, []) if o.state == "succeeded"]
        effect = ev.effects.get(job.key)
        effect_attempt = None if effect is None else effect.attempt
        if any(a != want for a in won) or effect_attempt not in (None, want):
            wrong.append({"key": job.key, "want": want, "succeeded": won, "effect": effect_attempt})
        elif won and effect_attempt == want:
            ok += 1
    return {
        "flaky_jobs": len(flaky),
        "flaky_ok": ok,
        "flaky_wrong_attempt": len(wrong),
        "flaky_wrong": wrong[:LISTED],
    }


def judge_dlq(
    jobs: list[Job],
    ev: Evidence,
    outcomes: dict[str, list[Outcome]],
    plan_of: dict[str, RetryPlan],
) -> dict[str, Any]:
    letters: dict[str, list[DeadLetter]] = defaultdict(list)
    for d in ev.dead_letters:
        letters[d.key].append(d)
    doomed = {j.key: j for j in jobs if j.kind in EXPECTED_DEATH}
    good = 0
    problems: list[dict[str, Any]] = []
    for key, job in doomed.items():
        own = [d for d in letters.get(key, []) if not d.redriven]
        dead = [o for o in outcomes.get(key, []) if o.state == "dead"]
        attempts = plan_of.get(key, ev.default_plan).max_attempts if job.kind == "doomed" else 1
        if (
            len(own) == 1
            and len(dead) == 1
            and own[0].reason == EXPECTED_DEATH[job.kind]
            and own[0].attempts == attempts
        ):
            good += 1
        else:
            problems.append(
                {
                    "key": key,
                    "kind": job.kind,
                    "dead_letters": [(d.reason, d.attempts) for d in own],
                    "dead_outcomes": len(dead),
                }
            )
    unexpected = sorted(k for k in letters if k not in doomed)
    return {
        "dlq": len(ev.dead_letters),
        "dlq_reasons": dict(Counter(d.reason for d in ev.dead_letters)),
        "dlq_expected": good,
        "dlq_expected_of": len(doomed),
        "dlq_problems": problems[:LISTED],
        "dlq_unexpected": len(unexpected),
        "dlq_unexpected_keys": unexpected[:LISTED],
    }


def duplicate_keys(ev: Evidence, outcomes: dict[str, list[Outcome]]) -> list[str]:
    won = {k: sum(o.state == "succeeded" for o in os) for k, os in outcomes.items()}
    letters = Counter(d.key for d in ev.dead_letters if not d.redriven)
    return sorted(
        {k for k, n in won.items() if n > 1}
        | {k for k, n in letters.items() if n > 1}
        | {k for k in letters if won.get(k) or k in ev.effects}
    )


def judge_faults(ev: Evidence, rules: Rules) -> dict[str, Any]:
    by_kind = Counter(f.kind for f in ev.faults)
    missing = {k: by_kind[k] for k, least in rules.fault_minimums.items() if by_kind[k] < least}
    return {
        "worker_drops": dict(Counter(d.reason for d in ev.dropped)),
        "faults": len(ev.faults),
        "faults_by_kind": dict(by_kind),
        "faults_missing": missing,
        "faults_ok": not missing,
    }


# ------------------------------------------------------------------ the judge


def judge(ev: Evidence, rules: Rules | None = None) -> dict[str, Any]:
    """The run's numbers (JSON-ready); see the module docstring for each rule."""
    rules = rules or Rules()
    clocks = Clocks(dict(ev.skews))
    jobs, per_schedule = expected_jobs(ev, rules)
    outcomes: dict[str, list[Outcome]] = defaultdict(list)
    for o in sorted(ev.outcomes, key=clocks.outcome):
        outcomes[o.key].append(o)
    plan_of = {j.key: ev.plans.get(j.task, ev.default_plan) for j in jobs}
    schedule_ids = {c.schedule_id for c in ev.cron}
    views = steering_views(ev)
    due = {a.key: a.asked_ms for a in ev.accepted}
    due.update({k: v.early_due_ms for k, v in views.items()})

    def due_of(key: str) -> int | None:
        return due[key] if key in due else cron_due(key, schedule_ids)

    fired = Counter(f.key for f in ev.fires if not f.resent)
    ran = {r.key for r in ev.runs}
    lost: list[str] = []
    lost_state: Counter[str] = Counter()
    late: list[dict[str, Any]] = []
    to_end: list[int] = []
    for job in jobs:
        view = views.get(job.key)
        closing = TERMINAL if view is None else view.ends
        ends = [clocks.outcome(o) for o in outcomes.get(job.key, []) if o.state in closing]
        if not ends:
            lost.append(job.key)
            last = outcomes[job.key][-1].state if outcomes.get(job.key) else "none"
            where = "ran" if job.key in ran else ("fired" if job.key in fired else "never fired")
            lost_state[f"{where}, last outcome {last}"] += 1
            continue
        at = ends[0]
        job_due = job.due_ms if view is None else view.late_due_ms
        to_end.append(at - job_due)
        outage = sum(
            f.until_ms - f.at_ms
            for f in ev.faults
            if f.kind in rules.outage_kinds and f.at_ms <= at and f.until_ms >= job_due
        )
        bound = plan_of[job.key].total_ms + rules.slack_ms + outage
        if at - job_due > bound:
            late.append({"key": job.key, "late_ms": at - job_due, "bound_ms": bound})

    early: list[dict[str, Any]] = []
    unknown: set[str] = set()
    first_late: dict[str, int] = {}  # key -> its first run's start - due
    for r in ev.runs:
        wanted = due_of(r.key)
        if wanted is None:
            unknown.add(r.key)
            continue
        start = clocks.start(r)
        if r.attempt == 1:
            first_late[r.key] = min(start - wanted, first_late.get(r.key, start - wanted))
        if start + rules.early_tolerance_ms < wanted:
            early.append(
                {
                    "key": r.key,
                    "attempt": r.attempt,
                    "pid": r.pid,
                    "started_ms": start,
                    "due_ms": wanted,
                }
            )
    duplicates = duplicate_keys(ev, outcomes)
    doubles = sorted(k for k, n in fired.items() if n > 1)
    for sid, entry in per_schedule.items():
        entry["missing"] = [k for k in lost if k.startswith(sid + "@")][:10]
    report: dict[str, Any] = {
        "jobs": len(jobs),
        "one_shot_jobs": len(ev.accepted),
        "cron_occurrences": len(jobs) - len(ev.accepted),
        "lost": len(lost),
        "lost_keys": lost[:LISTED],
        "lost_by_stage": dict(lost_state),
        "late_terminal": len(late),
        "late_terminal_jobs": sorted(late, key=lambda x: -x["late_ms"])[:LISTED],
        "terminal_lateness_ms": percentiles(to_end),
        "early": len(early),
        "early_runs": early[:LISTED],
        "duplicates": len(duplicates),
        "duplicate_keys": duplicates[:LISTED],
        "double_fires": len(doubles),
        "double_fire_keys": doubles[:LISTED],
        "fires_per_key_max": max(fired.values(), default=0),
        "due_mismatch": sum(
            1 for a in ev.accepted if a.requested_ms >= 0 and a.requested_ms != a.due_ms
        ),
        "unknown_runs": len(unknown),
        "runs": len(ev.runs),
        "effects": len(ev.effects),
        "effect_conflicts": ev.effect_conflicts,
        "lateness_ms": percentiles(first_late.values()),
        "cron": per_schedule,
        "skews": {str(pid): ms for pid, ms in ev.skews.items()},
    }
    report.update(judge_runs(ev, rules, clocks, outcomes))
    report.update(judge_retries(ev, clocks, plan_of))
    report.update(judge_flaky([j for j in jobs if j.kind == "flaky"], ev, outcomes))
    report.update(judge_dlq(jobs, ev, outcomes, plan_of))
    report.update(judge_faults(ev, rules))
    report.update(judge_steering(ev, views, outcomes))
    return report


def unfinished(ev: Evidence, rules: Rules | None = None) -> list[str]:
    """Expected jobs without a committed terminal outcome yet (the run waits for these)."""
    jobs, _ = expected_jobs(ev, rules or Rules())
    views = steering_views(ev)
    done = {
        o.key for o in ev.outcomes if o.state in (views[o.key].ends if o.key in views else TERMINAL)
    }
    return [j.key for j in jobs if j.key not in done]


# The counts of a report that must be 0, each with the key of its evidence.
MUST_BE_ZERO = {
    "lost": "lost_keys",
    "unexcused": "unexcused_runs",
    "early": "early_runs",
    "duplicates": "duplicate_keys",
    "dlq_unexpected": "dlq_unexpected_keys",
    "retry_early": "retry_early_runs",
    "flaky_wrong_attempt": "flaky_wrong",
    "steer_cancel_ran": "steer_problems",
    "steer_cancel_unconfirmed": "steer_problems",
    "steer_ran_old": "steer_problems",
}


def broken(report: dict[str, Any]) -> list[str]:
    """The guarantees a report shows broken (empty: the run passed)."""
    out = [f"{k} = {report[k]}" for k in MUST_BE_ZERO if report[k]]
    if report["flaky_ok"] != report["flaky_jobs"]:
        out.append(f"flaky jobs right {report['flaky_ok']} of {report['flaky_jobs']}")
    if report["dlq_expected"] != report["dlq_expected_of"]:
        out.append(f"dlq expected {report['dlq_expected']} of {report['dlq_expected_of']}")
    return out
