"""What became of every job of an upgrade test, judged from the ledger (pure).

The inputs are facts: the jobs the streams scheduled and the cron schedules
they added (``tests/upgrade/stream.py``'s lines), the ledger's runs
(``tests/upgrade/ledger.py``) and the dead letters by job id. Every planned
job must have run exactly the attempts its kind says (``RESULTS``), each once,
none before it was due, and ended in the DLQ once with the kind's reason, or
not at all. Runs of a redriven record are judged apart
(:func:`judge_redrives`).
"""

from __future__ import annotations

import itertools
import re
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.upgrade.ledger import Run

# The results of a job's attempts, in order, by kind (tests/upgrade/app/upgrade_tasks.py).
RESULTS: dict[str, tuple[str, ...]] = {
    "ok": ("ok",),
    "slow": ("ok",),
    "flaky": ("fail", "ok"),
    "permanent": ("permanent",),
    "exhausted": ("fail", "fail"),
}
# The DLQ reason of a kind that ends there.
DEAD_REASON = {"permanent": "permanent_error", "exhausted": "exhausted"}

_EVERY_N_SECONDS = re.compile(r"^\*/(\d+) \* \* \* \* \*$")


@dataclass(frozen=True, slots=True)
class Planned:
    """A job that must run: scheduled by a stream, or an occurrence of a cron schedule."""

    job_id: str
    kind: str
    due_ms: int
    source: str  # the SDK's release, or "cron <schedule id>"


def cron_occurrences(expr: str, start_ms: int, end_ms: int) -> list[int]:
    """The occurrences (epoch ms) of ``*/N * * * * *`` (N dividing 60) in UTC from
    ``start_ms`` to ``end_ms``, both included: the only cron form the tests use, so the
    oracle is arithmetic, not the cron rules under test."""
    found = _EVERY_N_SECONDS.match(expr)
    if not found or 60 % int(found.group(1)):
        raise ValueError(f"cron: got {expr!r}; accepted: '*/N * * * * *' with N dividing 60")
    step = int(found.group(1)) * 1000
    first = -(-start_ms // step) * step
    return list(range(first, end_ms + 1, step))


def planned_jobs(facts: Iterable[Mapping[str, Any]]) -> list[Planned]:
    """Every job the streams' facts promise: their jobs, and each occurrence of their
    cron schedules (job id ``<schedule id>@<occurrence ms>``)."""
    out: list[Planned] = []
    for doc in facts:
        if doc["type"] == "job":
            out.append(Planned(doc["job_id"], doc["kind"], int(doc["due_ms"]), doc["sdk"]))
        elif doc["type"] == "cron":
            sid = doc["schedule_id"]
            for t in cron_occurrences(doc["cron"], doc["start_ms"], doc["end_ms"]):
                out.append(Planned(f"{sid}@{t}", doc["kind"], t, f"cron {sid}"))
    return out


@dataclass
class Verdict:
    """Job ids by what went wrong, and counts for the report."""

    planned: int = 0
    unfinished: list[str] = field(default_factory=list)  # not (yet) at its end
    doubled: list[str] = field(default_factory=list)  # an attempt twice, or two dead letters
    early: list[str] = field(default_factory=list)  # started before due (or its retry delay)
    wrong: list[str] = field(default_factory=list)  # other results, or another DLQ reason
    unplanned: list[str] = field(default_factory=list)  # ran, but nobody scheduled it
    runs_by_release: Counter[str] = field(default_factory=Counter)
    retries_across: int = 0  # attempt k and k+1 on different releases
    # runs whose worker aborted their commit and started its queue over (a stall
    # longer than the commit window): the attempt ran again, as docs/workers.md says
    uncommitted: list[str] = field(default_factory=list)

    def problems(self) -> list[str]:
        """One line per kind of failure, with up to five examples; empty when all is well."""
        out = []
        for name in ("unfinished", "doubled", "early", "wrong", "unplanned"):
            found: list[str] = getattr(self, name)
            if found:
                out.append(f"{name}: {len(found)} of {self.planned}, e.g. {found[:5]}")
        return out


def judge(
    planned: Sequence[Planned],
    runs: Sequence[Run],
    dead: Mapping[str, Sequence[str]],
    *,
    tiers_ms: Sequence[int],
    aborted: Mapping[int, Sequence[int]] | None = None,
    ends: Mapping[tuple[str, int, int], int] | None = None,
    starts: Mapping[tuple[str, int, int], Sequence[int]] | None = None,
) -> Verdict:
    """Judge every planned job by its runs (redriven ones aside) and dead letters
    (job id -> the reason of each of its DLQ records). ``aborted``: pid -> when that
    worker aborted a commit and started its queue over (epoch ms); a run it ended
    before such an abort, of an attempt run again after it, was not committed and
    is not judged (``Verdict.uncommitted``); ``ends`` and ``starts``: when each
    worker ended and started each attempt (see :func:`uncommitted_run`)."""
    verdict = Verdict(planned=len(planned))
    by_job: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        if not run.redriven:
            by_job[run.job_id].append(run)
            verdict.runs_by_release[run.release] += 1
    known = {p.job_id for p in planned}
    verdict.unplanned = sorted(set(by_job) - known)
    for job in planned:
        mine = _committed(
            verdict, by_job.get(job.job_id, []), aborted or {}, ends or {}, starts or {}
        )
        _judge_one(verdict, job, sorted(mine, key=_order), dead, tiers_ms)
    return verdict


# A worker commits a batch within its commit window (the session timeout less a
# heartbeat) or starts its queue over: a restart later than this after a run is
# about something else, and a run again after it a double.
COMMIT_WINDOW_MS = 30_000


def uncommitted_run(
    run: Run,
    runs: Sequence[Run],
    aborted: Mapping[int, Sequence[int]],
    ends: Mapping[tuple[str, int, int], int] | None = None,
    starts: Mapping[tuple[str, int, int], Sequence[int]] | None = None,
) -> bool:
    """``run`` was not committed: its worker started its queue over (which forgets
    every attempt not committed yet, the running ones too) after the run began and
    within a commit window after it ended, and the same attempt began again after
    that restart. It ended when its worker ended it (``ends``: (job id, attempt,
    pid) -> epoch ms, from the worker's log), if that is later than the handler's
    own end; it began when its worker started it (``starts``: the same key -> the
    times of its "job.started", from the log), if that is earlier than the
    handler's own start (a handler on a thread of a stalled machine begins late:
    seen 92 ms and 4.4 s after the worker started it, a restart in between)."""
    again = [
        r.started_ms for r in runs if r.attempt == run.attempt and r.started_ms > run.started_ms
    ]
    if not again:
        return False
    key = (run.job_id, run.attempt, run.pid)
    ended = max(run.ended_ms, (ends or {}).get(key, 0))
    # the worker's last start of this attempt before the handler's own (a worker may
    # run an attempt again itself after a restart)
    begun = max(
        (t for t in (starts or {}).get(key, ()) if t <= run.started_ms), default=run.started_ms
    )
    return any(
        begun <= t <= min(max(again), ended + COMMIT_WINDOW_MS) for t in aborted.get(run.pid, ())
    )


def _committed(
    verdict: Verdict,
    runs: Sequence[Run],
    aborted: Mapping[int, Sequence[int]],
    ends: Mapping[tuple[str, int, int], int],
    starts: Mapping[tuple[str, int, int], Sequence[int]],
) -> list[Run]:
    out = []
    for run in runs:
        if uncommitted_run(run, runs, aborted, ends, starts):
            verdict.uncommitted.append(f"{run.job_id} attempt {run.attempt} pid {run.pid}")
        else:
            out.append(run)
    return out


def _order(run: Run) -> tuple[int, int]:
    return run.attempt, run.started_ms


def _judge_one(
    verdict: Verdict,
    job: Planned,
    runs: list[Run],
    dead: Mapping[str, Sequence[str]],
    tiers_ms: Sequence[int],
) -> None:
    expected = RESULTS[job.kind]
    reasons = list(dead.get(job.job_id, ()))
    want_dead = DEAD_REASON.get(job.kind)
    attempts = Counter(r.attempt for r in runs)
    if any(n > 1 for n in attempts.values()) or len(reasons) > 1:
        verdict.doubled.append(f"{job.job_id} attempts {sorted(attempts.elements())} dlq {reasons}")
        return
    got = tuple(r.result for r in runs)
    if got != expected[: len(got)] or [r.attempt for r in runs] != list(range(1, len(got) + 1)):
        verdict.wrong.append(f"{job.job_id} ({job.kind}) ran {got}")
        return
    if reasons and (want_dead is None or reasons != [want_dead]):
        verdict.wrong.append(f"{job.job_id} ({job.kind}) dead letter {reasons}")
        return
    if len(got) < len(expected) or (want_dead is not None and not reasons):
        verdict.unfinished.append(f"{job.job_id} ({job.kind}, {job.source}) ran {got}")
        return
    if runs and runs[0].started_ms < job.due_ms:
        verdict.early.append(f"{job.job_id} started {job.due_ms - runs[0].started_ms} ms early")
    for before, after in itertools.pairwise(runs):
        due = before.ended_ms + tiers_ms[min(before.attempt, len(tiers_ms)) - 1]
        if after.started_ms < due:
            verdict.early.append(
                f"{job.job_id} attempt {after.attempt} started {due - after.started_ms} ms "
                "before its retry delay"
            )
        if after.release != before.release:
            verdict.retries_across += 1


def judge_redrives(redriven: Iterable[str], runs: Sequence[Run], *, after_ms: int) -> list[str]:
    """Each redriven job ran exactly once more, after ``after_ms``, and succeeded."""
    by_job: dict[str, list[Run]] = defaultdict(list)
    for run in runs:
        if run.redriven:
            by_job[run.job_id].append(run)
    out = []
    for job_id in sorted(redriven):
        got = by_job.get(job_id, [])
        if len(got) != 1 or got[0].result != "ok" or got[0].started_ms < after_ms:
            out.append(f"{job_id}: redriven runs {[(r.result, r.started_ms) for r in got]}")
    out += [f"{j}: ran redriven, never redriven" for j in sorted(set(by_job) - set(redriven))]
    return out
