"""Upgrading a running deployment from the previous release, and rolling it back.

The previous release (git tag ``tests.upgrade.release.PREVIOUS_TAG``) runs as
processes of its own interpreter (``tests/upgrade/release.py`` builds and
caches its virtualenv); the current one is this tree. Jobs are in flight the
whole time: a scheduling service (``tests/upgrade/stream.py``, 20 jobs a
second due 0.5-10 s out, some that fail once and are retried through a retry
tier, some that fail for good into the DLQ) and cron schedules every 2 and 3
seconds. Each process is replaced as a rolling update does it (the new one
started and ready, then SIGTERM to the old one), workers first, then the
standby emitter, then the active one, and the scheduling service switches
SDKs half way. Then every job scheduled, by either SDK, and every cron
occurrence ran exactly the attempts its kind says, each once, none before it
was due or before its retry delay, and ended in the DLQ once or not at all
(``tests/upgrade/verdict.py``); both releases ran jobs.

The scenarios are lists of steps (``tests/upgrade/scenario.py``): a change to
the wire, a topic's layout or the offsets adds its own steps and checks to
them (tests/README.md, "Upgrade tests").
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import Consumer, TopicPartition

from dueflow import headers as hdr
from dueflow.config import Settings
from dueflow.consumers.testing import ExecWriter, exec_headers, make_job
from dueflow.kafka.topics import names
from dueflow.records import codec
from tests.conftest import KafkaCluster
from tests.integration.pipeline_support import wait_for
from tests.integration.records import read_all
from tests.integration.worker_support import read_topic
from tests.support.worker_process import dead_letters
from tests.upgrade.deployment import QUEUE, Deployment, Stream
from tests.upgrade.ledger import Run
from tests.upgrade.release import (
    CURRENT,
    PREVIOUS,
    ROOT,
    Release,
    ReleaseUnavailable,
    current_release,
    previous_release,
)
from tests.upgrade.scenario import (
    Check,
    Command,
    CronPlan,
    Freeze,
    JobsRun,
    Replace,
    Schedule,
    Settle,
    Stage,
    Start,
    Step,
    StopScheduling,
    Until,
    run_steps,
)
from tests.upgrade.verdict import judge_redrives

# Jobs the previous SDK schedules first, due this far out: after the rolling update,
# so the current emitter fires them from the slots the previous release's SDK chose.
FAR_S = 60.0
TASK = "upgrade-job"
# The previous emitters' transactions may stay open this long: one that an emitter
# stopped while active left open is ended that soon only by its successor's fence.
LONG_TRANSACTIONS = {"DUEFLOW_EMITTER_TRANSACTION_TIMEOUT_MS": "60000"}
# What the previous release's tools say of a DeadLetter/2 record.
NO_V2 = "no released version 2 of schema dueflow.DeadLetter"


@pytest.fixture(scope="session")
def previous() -> Release:
    """The previous release, built once per commit into the dueflow cache."""
    try:
        return previous_release(say=print)
    except ReleaseUnavailable as exc:
        pytest.fail(str(exc), pytrace=False)


@pytest.fixture
def stage(kafka: KafkaCluster, prefix: str, tmp_path: Path, previous: Release) -> Iterator[Stage]:
    deployment = Deployment(kafka.bootstrap, prefix, tmp_path)
    stream = Stream(deployment, rate=20)
    stage = Stage(deployment, stream, {PREVIOUS: previous, CURRENT: current_release()})
    try:
        yield stage
    finally:
        deployment.stop_all()
        _report(stage)


# ----------------------------------------------------------------- checks


def every_job_once(stage: Stage) -> None:
    """Every planned job, from both SDKs and every cron schedule, ran its attempts once
    each, never early, and reached its end; a retry went from one release to the other
    (the last worker of a release was stopped with a retry pending)."""
    verdict = stage.notes["verdict"]
    assert not verdict.problems(), "\n".join(verdict.problems()) + stage.deployment.logs()
    # A run the verdict did not count (its worker forgot it) must not have been
    # committed either: one terminal outcome per attempt of such a job.
    excused = {entry.split()[0] for entry in verdict.uncommitted}
    ends = committed_ends(stage.deployment.settings, excused)
    twice = {key: n for key, n in ends.items() if n > 1}
    assert not twice, f"an attempt the verdict excused has two committed ends: {twice}"
    by_sdk = Counter(d["sdk"] for d in stage.stream.facts() if d["type"] == "job")
    assert by_sdk[PREVIOUS] > 50, by_sdk
    assert by_sdk[CURRENT] > 50, by_sdk
    assert verdict.retries_across >= 1, "no retry went from one release to the other"


TERMINAL = frozenset({"succeeded", "retrying", "dead"})  # an attempt's end


def committed_ends(settings: Settings, job_ids: set[str]) -> Counter[tuple[str, int, str]]:
    """(job id, attempt, state) -> how many committed outcomes end that attempt so."""
    ends: Counter[tuple[str, int, str]] = Counter()
    if not job_ids:
        return ends
    for r in read_topic(settings, names(settings).outcomes):
        job = (r.key or b"").decode(errors="replace")
        if job not in job_ids:
            continue
        version = codec.parse_schema_header(r.headers.get(hdr.SCHEMA), expected="outcome")
        out = codec.decode("outcome", r.value or b"", writer_version=version)
        if out["state"] in TERMINAL:
            ends[(job, int(out["attempt"]), str(out["state"]))] += 1
    return ends


# after a worker's SIGTERM, time for its replacement to join and take its partitions
TAKE_OVER_MS = 15_000


def both_releases_ran(stage: Stage) -> None:
    """Workers of both releases ran jobs, each from its own release's code; the cron
    schedules of the previous SDK ran on both (on the current release's workers when
    occurrences were due after every worker was replaced: a loaded machine may reach
    the replacements after a short schedule's end)."""
    runs = stage.deployment.ledger.runs()
    by_release = Counter(r.release for r in runs)
    assert by_release[PREVIOUS] > 0, by_release
    assert by_release[CURRENT] > 0, by_release
    previous = stage.release(PREVIOUS)
    for run in runs:
        if run.release == PREVIOUS:
            assert run.dueflow_path.startswith(str(previous.python.parents[1])), run
        else:
            assert run.dueflow_path.startswith(str(ROOT)), run
    cron = Counter(r.release for r in runs if r.job_id.startswith("every-2s@"))
    steps = [s for s in stage.deployment.replacements if s.old.role == "worker"]
    assert steps, "no worker was replaced"
    first, then = steps[0].old.release.name, steps[-1].new.release.name
    assert cron[first] > 0, cron
    ends = [
        int(doc["end_ms"])
        for doc in stage.stream.facts()
        if doc["type"] == "cron" and doc["schedule_id"] == "every-2s"
    ]
    replaced_ms = steps[-1].term_ms
    if max(ends, default=0) > replaced_ms + TAKE_OVER_MS:
        assert cron[then] > 0, (cron, replaced_ms, ends)


def in_flight_at_each_sigterm(stage: Stage) -> None:
    """A job was running on each worker when it was told to stop (it finished it)."""
    runs = stage.deployment.ledger.runs()
    for step in stage.deployment.replacements:
        if step.old.role == "worker":
            old = step.old.pid
            running = [r for r in runs if r.pid == old and r.started_ms <= step.term_ms]
            assert [r for r in running if r.ended_ms >= step.term_ms], step.row()


def far_jobs_fired_by_current(stage: Stage) -> None:
    """The previous SDK's far jobs came due after its last emitter had left."""
    far = [d for d in stage.stream.facts() if d["type"] == "job" and d["far"]]
    assert far, "no far job was scheduled"
    last_previous_emitter = max(
        s.term_ms for s in stage.deployment.replacements if s.old.role == "emitter"
    )
    early = [d for d in far if d["due_ms"] < last_previous_emitter]
    assert not early, (
        f"{len(early)} far jobs came due before the last previous emitter left: the rolling "
        f"update took longer than {FAR_S} s; {stage.deployment.replacements[-1].row()}"
    )


def dead_letters_by(stage: Stage, release: str) -> dict[str, Run]:
    """The job ids whose dead letter a worker of ``release`` wrote (its last run)."""
    last: dict[str, Run] = {}
    for run in stage.deployment.ledger.runs():
        if not run.redriven and run.kind in ("permanent", "exhausted"):
            last[run.job_id] = run
    return {j: r for j, r in last.items() if r.release == release}


def redrive_previous_dead_letters(stage: Stage) -> None:
    """The current CLI lists the previous workers' dead letters and redrives them; each
    runs once more (and succeeds: a redriven job does)."""
    d = stage.deployment
    current = stage.release(CURRENT)
    old = dead_letters_by(stage, PREVIOUS)
    assert old, "no dead letter was written by a previous worker"
    listed = d.cli_json(current, "dlq", "list", "--queue", QUEUE, "--limit", "0")
    by_job = {e["job_id"]: e for e in listed["entries"]}
    for job_id, run in old.items():
        want = "permanent_error" if run.kind == "permanent" else "exhausted"
        assert by_job[job_id]["reason"] == want, by_job.get(job_id)
        assert by_job[job_id]["state"] == "dead", by_job[job_id]
    before = time.time_ns() // 1_000_000
    argv = ["dlq", "redrive", "--queue", QUEUE]
    for job_id in sorted(old):
        argv += ["--job-id", job_id]
    report = d.cli_json(current, *argv)
    assert report["redriven"] == len(old), report
    wait_for(
        "the redriven jobs ran",
        lambda: not judge_redrives(old, d.ledger.runs(), after_ms=before),
        90,
    )
    stage.notes["redriven_previous"] = len(old)


def nothing_set_aside(stage: Stage) -> None:
    """No process of either release quarantined a record of the other, or logged a
    traceback, or abandoned a job at its SIGTERM."""
    d = stage.deployment
    quarantined = read_all(d.settings, names(d.settings).quarantine)
    assert not quarantined, [(m.topic(), m.headers(), m.value()) for m in quarantined[:3]]
    for proc in d.everyone():
        text = proc.log()
        assert "Traceback" not in text, f"{proc.name}:\n{text[-4000:]}"
        assert "abandoning" not in text, f"{proc.name}:\n{text[-4000:]}"


def count_copies(stage: Stage) -> None:
    """How many deliveries the workers skipped as copies of a finished job (outcome
    ``duplicate``): an emitter that fires without transactions may fire a job again
    at a takeover, and the workers run it once; reported, not asserted."""
    d = stage.deployment
    copies: Counter[str] = Counter()
    for record in read_topic(d.settings, names(d.settings).outcomes):
        version = codec.parse_schema_header(record.headers.get(hdr.SCHEMA), expected="outcome")
        outcome = codec.decode("outcome", record.value or b"", writer_version=version)
        if outcome["state"] == "duplicate":
            copies[outcome["job_id"]] += 1
    stage.notes["copies_skipped"] = f"{sum(copies.values())} of {len(copies)} jobs"


def job_answers(cli: str, sdk: str, worker: str) -> Check:
    """``dueflow job ID`` of release ``cli`` (read from Kafka) answers for a job that
    ``sdk``'s SDK scheduled and ``worker``'s workers failed once and then ran: succeeded
    after 2 attempts, every outcome record read."""

    def check(stage: Stage) -> None:
        runs: dict[str, list[Run]] = {}
        for run in stage.deployment.ledger.runs():
            runs.setdefault(run.job_id, []).append(run)
        found = [
            d["job_id"]
            for d in stage.stream.facts()
            if d["type"] == "job"
            and d["sdk"] == sdk
            and d["kind"] == "flaky"
            and [r.release for r in runs.get(d["job_id"], [])] == [worker, worker]
        ]
        assert found, f"no flaky job of the {sdk} SDK ran on {worker} workers only"
        doc = stage.deployment.cli_json(stage.release(cli), "job", found[0], "--kafka")
        assert doc["found"], doc
        assert doc["scan"]["undecodable"] == 0, doc
        assert doc["job"]["state"] == "succeeded", doc
        assert doc["job"]["attempts"] == 2, doc

    return Check(f"dueflow job of {cli} on a job of the {sdk} SDK run by {worker}", check)


# ----------------------------------------------------------------- rollback checks


def out_of_range_dead_letter(stage: Stage) -> None:
    """A record only the current worker refuses (df-attempt 0): dead-lettered as
    ``out_of_range``, a ``DeadLetter/2``, which the previous release has no schema for."""
    d = stage.deployment
    job = make_job(TASK, {"kind": "ok", "work_ms": 10}, queue=QUEUE, key="out-of-range-attempt")
    writer = ExecWriter(d.settings)
    headers = hdr.replace(exec_headers(job), [(hdr.ATTEMPT, b"0")])
    writer.write_raw(
        QUEUE, job.idempotency_key.encode(), codec.encode("job", job.to_record()), headers
    )
    writer.flush()

    def dead() -> bool:
        return any(
            e.job_id == job.job_id and e.reason == "out_of_range"
            for e in dead_letters(d.settings, QUEUE)
        )

    wait_for("the out-of-range record dead-lettered", dead, 60)
    stage.notes["out_of_range_job"] = job.job_id


def committed_timer_offsets(settings: Settings, group: str) -> dict[int, int]:
    """The timer offsets ``group`` holds (partitions without one left out): the stable
    ones, read without waiting for the previous emitter's open transaction (a
    read_committed client asks for stable offsets and is answered "unstable" for as
    long as a transaction with offsets for the group is open)."""
    consumer = Consumer(
        settings.client_config(**{"group.id": group, "isolation.level": "read_uncommitted"})
    )
    try:
        tps = [
            TopicPartition(names(settings).timers, p)
            for p in range(settings.wheel.total_partitions)
        ]
        got = consumer.committed(tps, timeout=30)
    finally:
        consumer.close()
    return {tp.partition: tp.offset for tp in got if tp.offset >= 0}


def previous_emitter_went_on_from_the_current_commits(stage: Stage) -> None:
    """The previous emitter reads its timer offsets only from the offsets group; the
    current ones (firing without transactions) commit theirs through the lease group
    and copy each accepted commit there. So the previous one, just after taking
    over, stands at or after every offset the current ones committed: it fires
    again nothing that a clean handover committed."""
    d = stage.deployment
    n = names(d.settings)
    lease = committed_timer_offsets(d.settings, n.emitter_group)
    offsets = committed_timer_offsets(d.settings, n.emitter_offsets_group)
    assert lease, "the current emitters committed no timer offset"
    behind = {p: (at, offsets.get(p, -1)) for p, at in lease.items() if offsets.get(p, -1) < at}
    assert not behind, f"offsets group behind the lease group (lease, offsets): {behind}"
    stage.notes["timer_partitions_handed_over"] = len(lease)


def previous_tools_on_current_dead_letters(stage: Stage) -> None:
    """After a rollback the previous CLI lists every dead letter: the current workers'
    version-1 records as they are, the ``DeadLetter/2`` one as a record that does not
    decode (never a crash); it redrives the version-1 ones and refuses the other with
    its reason; the current CLI redrives that one, and each runs once more."""
    d = stage.deployment
    previous, current = stage.release(PREVIOUS), stage.release(CURRENT)
    bad = stage.notes["out_of_range_job"]
    written = dead_letters_by(stage, CURRENT)
    assert written, "no dead letter was written by a current worker"
    listed = d.cli_json(previous, "dlq", "list", "--queue", QUEUE, "--limit", "0")
    by_job = {e["job_id"]: e for e in listed["entries"]}
    for job_id, run in written.items():
        want = "permanent_error" if run.kind == "permanent" else "exhausted"
        assert by_job[job_id]["reason"] == want, by_job.get(job_id)
    assert by_job[bad]["reason"] == "undecodable", by_job[bad]
    assert NO_V2 in by_job[bad]["error_message"], by_job[bad]
    shown = d.cli_json(previous, "dlq", "show", "--queue", QUEUE, by_job[bad]["ref"])
    assert NO_V2 in shown["problem"], shown

    before = time.time_ns() // 1_000_000
    argv = ["dlq", "redrive", "--queue", QUEUE]
    for job_id in [*sorted(written), bad]:
        argv += ["--job-id", job_id]
    report = d.cli_json(previous, *argv)
    items = {i["job_id"]: i for i in report["items"]}
    assert {j for j, i in items.items() if i["redriven"]} == set(written), report
    assert "does not decode" in items[bad]["why"], items[bad]
    # as docs/deployment.md says: the current CLI redrives what the previous one cannot
    again = d.cli_json(current, "dlq", "redrive", "--queue", QUEUE, "--reason", "out_of_range")
    assert [i["job_id"] for i in again["items"] if i["redriven"]] == [bad], again
    wait_for(
        "the redriven jobs ran",
        lambda: not judge_redrives({*written, bad}, d.ledger.runs(), after_ms=before),
        90,
    )


# ----------------------------------------------------------------- scenarios

UPGRADE: list[Step] = [
    Command(PREVIOUS, ("topics", "ensure")),
    Start("emitter", PREVIOUS, count=2),
    Start("worker", PREVIOUS, count=2),
    Schedule(
        PREVIOUS,
        far=6,
        far_delay_s=FAR_S,
        cron=(CronPlan("every-2s", 2, "ok", 3, 60), CronPlan("flaky-3s", 3, "flaky", 3, 60)),
    ),
    JobsRun(80),  # the previous release alone
    Until("a dead letter by a previous worker", lambda s: dead_letters_by(s, PREVIOUS)),
    Command(CURRENT, ("topics", "ensure")),  # what a new version reads
    Replace("worker", by=CURRENT),
    Replace("worker", by=CURRENT),
    Schedule(CURRENT, cron=(CronPlan("current-2s", 2, "flaky", 3, 20),)),
    Replace("emitter", by=CURRENT, which="standby"),
    Replace("emitter", by=CURRENT, which="active"),
    JobsRun(60),
    StopScheduling(),
    Settle(),
    Check("every job ran once or reached the DLQ once, never early", every_job_once),
    Check("both releases ran jobs", both_releases_ran),
    Check("nothing quarantined, no traceback", nothing_set_aside),
    Check("jobs in flight at the workers' SIGTERMs", in_flight_at_each_sigterm),
    Check("copies skipped by the workers (reported)", count_copies),
    Check("far jobs came due after the rolling update", far_jobs_fired_by_current),
    Check(
        "the current CLI redrives the previous workers' dead letters", redrive_previous_dead_letters
    ),
    job_answers(cli=CURRENT, sdk=PREVIOUS, worker=PREVIOUS),
]

ROLLBACK: list[Step] = [
    Command(CURRENT, ("topics", "ensure")),
    # Emitters that write each job when it is due (docs/deployment.md, "Rolling back").
    Start("emitter", CURRENT, count=2, env={"DUEFLOW_EMITTER_FIRE_AHEAD_MS": "0"}),
    Start("worker", CURRENT, count=2),
    Schedule(CURRENT, cron=(CronPlan("every-2s", 2, "flaky", 3, 45),)),
    JobsRun(80),
    Until("a dead letter by a current worker", lambda s: dead_letters_by(s, CURRENT)),
    Check("a DeadLetter/2 in the DLQ", out_of_range_dead_letter),
    Replace("worker", by=PREVIOUS),
    Replace("worker", by=PREVIOUS),
    Schedule(PREVIOUS),
    Replace("emitter", by=PREVIOUS, which="standby"),
    Replace("emitter", by=PREVIOUS, which="active"),
    Check(
        "the previous emitter went on from the current ones' commits",
        previous_emitter_went_on_from_the_current_commits,
    ),
    JobsRun(60),
    StopScheduling(),
    Settle(),
    Check("every job ran once or reached the DLQ once, never early", every_job_once),
    Check("both releases ran jobs", both_releases_ran),
    Check("nothing quarantined, no traceback", nothing_set_aside),
    Check("jobs in flight at the workers' SIGTERMs", in_flight_at_each_sigterm),
    Check("copies skipped by the workers (reported)", count_copies),
    Check(
        "the previous CLI on the current release's dead letters",
        previous_tools_on_current_dead_letters,
    ),
    job_answers(cli=PREVIOUS, sdk=CURRENT, worker=CURRENT),
]


# ----------------------------------------------------------------- a stopped emitter


def verdict_holds(stage: Stage) -> None:
    """Every planned job ran its attempts once each, never early, and reached its end."""
    verdict = stage.notes["verdict"]
    assert not verdict.problems(), "\n".join(verdict.problems()) + stage.deployment.logs()


def stopped_emitter_fenced(stage: Stage) -> None:
    """The previous emitter, stopped while active and resumed after the current one
    took over, could commit nothing more: what it tried was refused as fenced (the
    current emitter fenced its transactional ids at the takeover), and it went on as
    a standby until its SIGTERM (exit 0, checked by the replacement)."""
    frozen = stage.notes["frozen"]
    d = stage.deployment
    (proc,) = [m.proc for m in [*d.retired, *d.members] if m.name == frozen["stopped"]]
    fenced = [
        e
        for e in proc.events("abort failed") + proc.events("emitter fenced")
        if "fenced" in str(e.get("error", "")).lower()
    ]
    assert fenced, proc.log()[-4000:]
    assert frozen["successor"], frozen


STOPPED_PREVIOUS_EMITTER: list[Step] = [
    Command(PREVIOUS, ("topics", "ensure")),
    Start("emitter", PREVIOUS, env=LONG_TRANSACTIONS),
    Start("worker", CURRENT, count=2),
    Schedule(PREVIOUS, cron=(CronPlan("every-2s", 2, "ok", 3, 40),)),
    JobsRun(60),
    Start("emitter", CURRENT),
    Freeze(),  # the previous one, active: the current one takes over, then it resumes
    JobsRun(60),
    Replace("emitter", by=CURRENT, which="standby"),
    JobsRun(40),
    StopScheduling(),
    Settle(),
    Check("every job ran once or reached the DLQ once, never early", verdict_holds),
    Check("nothing quarantined, no traceback", nothing_set_aside),
    Check("the stopped previous emitter was fenced", stopped_emitter_fenced),
    Check("copies skipped by the workers (reported)", count_copies),
]


@pytest.mark.timeout(420)  # the first run builds the previous release (about 30 s)
def test_rolling_upgrade_from_the_previous_release_loses_doubles_and_rushes_nothing(
    stage: Stage,
) -> None:
    run_steps(stage, UPGRADE)


@pytest.mark.timeout(420)
def test_rolling_back_to_the_previous_release_loses_doubles_and_rushes_nothing(
    stage: Stage,
) -> None:
    run_steps(stage, ROLLBACK)


@pytest.mark.timeout(420)
def test_a_previous_emitter_stopped_while_active_is_fenced_by_the_current_one(
    stage: Stage,
) -> None:
    run_steps(stage, STOPPED_PREVIOUS_EMITTER)


def _report(stage: Stage) -> None:
    verdict = stage.notes.get("verdict")
    print(f"\n{len(stage.stream.facts())} stream facts; verdict: {verdict and verdict.problems()}")
    if verdict is not None:
        print(
            f"  runs by release {dict(verdict.runs_by_release)}, "
            f"retries across releases {verdict.retries_across}, "
            f"runs not committed (their worker started over) {verdict.uncommitted[:5]}"
        )
    for step in stage.deployment.replacements:
        print("  ", step.row())
    for name, seconds in stage.timeline:
        print(f"  {seconds:6.1f} s  {name}")
    for key in ("redriven_previous", "copies_skipped", "timer_partitions_handed_over", "frozen"):
        if key in stage.notes:
            print(f"  {key}: {stage.notes[key]}")
