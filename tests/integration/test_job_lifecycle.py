"""The job lifecycle a user steers, on the real broker with the real emitter and worker:
where a job is (status, ``dueflow job``), cancel, reschedule, expiry, cron overlap."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

from dueflow import InvalidInput, task
from dueflow import headers as hdr
from dueflow.apps.cli.main import main
from dueflow.config import Settings
from dueflow.consumers import TaskContext, TaskRegistry
from dueflow.kafka.topics import names
from dueflow.producers import Scheduler
from dueflow.records import codec
from tests.conftest import KafkaCluster
from tests.integration.pipeline_support import wait_for
from tests.integration.worker_support import FAST_WORKER, WorkerThread, read_topic
from tests.support.emitters import FAST_EMITTER, SMALL_WHEEL, ensure_topics, threaded_emitter

QUEUE = "jobs"


@dataclass
class Runs:
    """What the handlers ran: (job id, attempt, wall ms at start), thread-safe."""

    items: list[tuple[str, int, int]] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, ctx: TaskContext) -> None:
        with self.lock:
            self.items.append((ctx.job_id, ctx.attempt, time.time_ns() // 1_000_000))

    def of(self, job_id: str) -> list[tuple[str, int, int]]:
        with self.lock:
            return [r for r in self.items if r[0] == job_id]


RUNS = Runs()


@task("record", queue=QUEUE)
def record(payload: Any, ctx: TaskContext) -> None:
    RUNS.add(ctx)


@pytest.fixture
def settings(kafka: KafkaCluster, prefix: str) -> Settings:
    s = kafka.settings(
        prefix,
        queues=[
            {"name": QUEUE, "partitions": 3, "retry_tiers_ms": [200]},
            {"name": "other", "partitions": 2, "retry_tiers_ms": [200]},
        ],
        wheel=SMALL_WHEEL,
        emitter=FAST_EMITTER,
        worker=FAST_WORKER,
    )
    ensure_topics(s)
    return s


@pytest.fixture
def pipeline(settings: Settings) -> Iterator[None]:
    """The active emitter and a worker of QUEUE, on threads of this process."""
    with threaded_emitter(settings) as em, WorkerThread(settings, TaskRegistry([record])):
        em.wait_active()
        yield


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@pytest.fixture
def cli_env(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """The command line sees the test's cluster, queues and wheel."""
    wheel = settings.wheel
    values = {
        "DUEFLOW_BOOTSTRAP": settings.bootstrap,
        "DUEFLOW_TOPIC_PREFIX": settings.topic_prefix,
        "DUEFLOW_QUEUES": ",".join(f"{q.name}:{q.partitions}" for q in settings.queues),
        "DUEFLOW_WHEEL_LEVELS": SMALL_WHEEL["levels"],
        "DUEFLOW_WHEEL_NEAR_PARTITIONS": str(wheel.near_partitions),
        "DUEFLOW_WHEEL_NEAR_WINDOW_MS": str(wheel.near_window_ms),
        "DUEFLOW_WHEEL_LOOKAHEAD_MS": str(wheel.lookahead_ms),
    }
    for key, value in values.items():
        monkeypatch.setenv(key, value)


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, Any]:
    """``dueflow ARGV`` in this process (needs the ``cli_env`` fixture)."""
    code = main(list(argv))
    out = capsys.readouterr().out
    return code, json.loads(out) if "--json" in argv and out.strip() else out


# ------------------------------------------------------------ where is my job


def test_a_pending_job_is_known_with_its_due_time_then_as_what_became_of_it(
    settings: Settings, pipeline: None, cli_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    with Scheduler(settings) as s:
        job = s.schedule("record", {"n": 1}, queue=QUEUE, delay="4s", idempotency_key="k-1")
        pending = s.status(job.job_id)
        assert pending is not None
        assert (pending.state, pending.pending, pending.due_ms) == ("scheduled", True, job.due_ms)
        assert (pending.queue, pending.task, pending.idempotency_key, pending.attempts) == (
            QUEUE,
            "record",
            "k-1",
            0,
        )
        # `dueflow job` reads the same record (no status view runs: Kafka directly)
        code, text = cli(capsys, "job", job.job_id, "--url", "http://127.0.0.1:9")
        assert code == 0
        assert "scheduled (pending: not started)" in text
        assert "(in " in text
        code, doc = cli(capsys, "job", job.job_id, "--kafka", "--json")
        assert (code, doc["found"], doc["job"]["state"], doc["job"]["due_ms"]) == (
            0,
            True,
            "scheduled",
            job.due_ms,
        )

        wait_for("the job ran", lambda: RUNS.of(job.job_id), 30)
        assert RUNS.of(job.job_id)[0][2] >= job.due_ms  # never early
        done = wait_for(
            "its outcome",
            lambda: (st := s.status(job.job_id)) is not None and st.finished and st,
            30,
        )
        assert (done.state, done.attempts, done.pending) == ("succeeded", 1, False)
        assert s.status("no-such-job") is None


# ------------------------------------------------------------ cancel


def test_a_cancel_from_another_client_finds_the_queue_and_the_job_never_runs(
    settings: Settings, pipeline: None, cli_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    """The client that cancels did not schedule the job: its lookup finds the job's queue
    (``jobs``). Before, the cancellation went to ``default``, reported success, and the
    job ran."""
    with Scheduler(settings) as s:
        job = s.schedule("record", queue=QUEUE, delay="3s", idempotency_key="k-cancel")
        control = s.schedule("record", queue=QUEUE, delay="3s")
    with Scheduler(settings) as other:
        with pytest.raises(InvalidInput, match="was scheduled to \\('jobs'\\)"):
            other.cancel(job.job_id, queue="other")
        code, out = cli(capsys, "cancel", job.job_id)
        assert code == 0
        assert f"cancelled job {job.job_id} (queue {QUEUE}, key k-cancel)" in out
        with pytest.raises(InvalidInput, match="give queue="):
            other.cancel("nobody-scheduled-this")
    wait_for("the control job ran", lambda: RUNS.of(control.job_id), 30)
    with Scheduler(settings) as s:
        cancelled = wait_for(
            "the worker's cancelled outcome",
            lambda: (
                (st := s.status(job.job_id)) is not None
                and st.history[-1][0] == "cancelled"
                and len(st.history) >= 3
                and st
            ),
            30,
        )
        assert [h[0] for h in cancelled.history] == ["scheduled", "cancelled", "cancelled"]
        assert RUNS.of(job.job_id) == []
        again = s.cancel(control.job_id)  # it ran: nothing to cancel
        assert (again.cancelled, again.found, again.state) == (False, True, "succeeded")


# ------------------------------------------------------------ reschedule


def worker_outcomes(s: Scheduler, job_id: str, n: int) -> list[str]:
    """The job's outcome states once it has ``n`` of them (polled)."""
    got = wait_for(
        f"{n} outcomes of {job_id}",
        lambda: (st := s.status(job_id)) is not None and len(st.history) >= n and st,
        40,
    )
    return [h[0] for h in got.history]


def test_a_rescheduled_job_runs_at_its_new_time_never_at_the_old_one_never_twice(
    settings: Settings, pipeline: None, cli_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    with Scheduler(settings) as s:
        later = s.schedule("record", {"n": 1}, queue=QUEUE, delay="2s", idempotency_key="k-later")
        twice = s.schedule("record", {"n": 2}, queue=QUEUE, delay="2s")
        control = s.schedule("record", {"n": 3}, queue=QUEUE, delay="2s")
        moved = s.reschedule(later.job_id, delay="7s")
        assert (moved.rescheduled, moved.old_due_ms, moved.queue) == (True, later.due_ms, QUEUE)
        st = s.status(later.job_id)
        assert st is not None
        assert (st.state, st.due_ms, st.pending) == ("rescheduled", moved.due_ms, True)
        first = s.reschedule(twice.job_id, delay="4s")
    with Scheduler(settings) as other:  # a second reschedule, by a client that knows nothing
        code, doc = cli(capsys, "reschedule", twice.job_id, "--delay", "8s", "--json")
        assert (code, doc["rescheduled"], doc["old_due_ms"]) == (0, True, first.due_ms)
        second_due = doc["due_ms"]

        wait_for("the control job ran", lambda: RUNS.of(control.job_id), 30)
        assert RUNS.of(later.job_id) == RUNS.of(twice.job_id) == []  # not at the old time
        ran = wait_for("the moved job ran", lambda: RUNS.of(later.job_id), 30)
        assert ran[0][2] >= moved.due_ms  # never early
        wait_for("the twice-moved job ran", lambda: RUNS.of(twice.job_id), 30)
        assert RUNS.of(twice.job_id)[0][2] >= second_due
        assert worker_outcomes(other, later.job_id, 4) == [
            "scheduled",
            "rescheduled",  # the client moved it
            "rescheduled",  # a worker skipped the old timer's delivery
            "succeeded",
        ]
        assert worker_outcomes(other, twice.job_id, 6) == [
            "scheduled",
            "rescheduled",
            "rescheduled",
            "rescheduled",
            "rescheduled",
            "succeeded",
        ]
        assert len(RUNS.of(later.job_id)) == len(RUNS.of(twice.job_id)) == 1  # once
        # a job that ran is not rescheduled, and says why
        again = other.reschedule(control.job_id, delay="1m")
        assert (again.rescheduled, again.reason) == (False, "it has succeeded already")
        code, text = cli(capsys, "reschedule", control.job_id, "--delay", "1m")
        assert code == 1
        assert "not rescheduled: it has succeeded already" in text


def test_a_job_moved_earlier_runs_then_and_its_old_timer_is_a_duplicate(
    settings: Settings, pipeline: None
) -> None:
    with Scheduler(settings) as s:
        job = s.schedule("record", queue=QUEUE, delay="9s")
        moved = s.reschedule(job.job_id, delay="1s")
        assert moved.rescheduled
        ran = wait_for("the job ran early", lambda: RUNS.of(job.job_id), 20)
        assert moved.due_ms <= ran[0][2] < job.due_ms
        assert worker_outcomes(s, job.job_id, 4)[2:] == ["succeeded", "duplicate"]
        assert len(RUNS.of(job.job_id)) == 1


# ------------------------------------------------------------ expires / max_lateness


def test_a_job_not_started_by_its_deadline_is_not_run_and_not_dead_lettered(
    settings: Settings,
) -> None:
    """The worker is down past the deadline of one job and within that of another:
    when it comes back, the first expires (outcome ``expired``, no dead letter), the
    second runs."""
    with threaded_emitter(settings) as em:
        em.wait_active()
        with Scheduler(settings) as s:
            late = s.schedule("record", queue=QUEUE, delay="1s", max_lateness="1s")
            fine = s.schedule("record", queue=QUEUE, delay="1s", max_lateness="10m")
            assert late.expires_ms == late.due_ms + 1_000
            wait_for("the first deadline", lambda: now_ms() > (late.expires_ms or 0) + 500, 20)
            with WorkerThread(settings, TaskRegistry([record])):
                wait_for("the job within its deadline ran", lambda: RUNS.of(fine.job_id), 30)
                expired = wait_for(
                    "the expired outcome",
                    lambda: (st := s.status(late.job_id)) is not None and st.finished and st,
                    30,
                )
            assert (expired.state, expired.last_outcome) == ("expired", "expired")
            assert RUNS.of(late.job_id) == []
            n = names(settings)
            assert read_topic(settings, n.dlq(QUEUE)) == []


# ------------------------------------------------------------ cron overlap

SPANS: dict[str, list[tuple[int, int]]] = {}
SPANS_LOCK = threading.Lock()


@task("slow-cron", queue=QUEUE)
def slow_cron(payload: Any, ctx: TaskContext) -> None:
    """Runs 2.5 s: longer than its schedule's period (1 s)."""
    started = now_ms()
    time.sleep(2.5)  # the job's own work, not a synchronization
    with SPANS_LOCK:
        SPANS.setdefault(ctx.job_id.split("@")[0], []).append((started, now_ms()))


def overlapping(spans: list[tuple[int, int]]) -> bool:
    ordered = sorted(spans)
    return any(b[0] < a[1] for a, b in itertools.pairwise(ordered))


@pytest.mark.timeout(180)
def test_cron_overlap_policies_on_one_worker(settings: Settings) -> None:
    """Occurrences every second of a job that runs 2.5 s: ``allow`` overlaps them (as
    before), ``skip`` never starts one while another runs (outcome ``skipped``),
    ``buffer_one`` starts the waiting one when the running one ends and skips the rest."""
    SPANS.clear()
    with (
        threaded_emitter(settings) as em,
        WorkerThread(settings, TaskRegistry([slow_cron])),
        Scheduler(settings) as s,
    ):
        em.wait_active()
        for policy in ("allow", "skip", "buffer_one"):
            s.add_schedule(
                f"every-second-{policy}",
                cron="* * * * * *",
                timezone="UTC",
                task="slow-cron",
                queue=QUEUE,
                overlap=policy,
            )

        def runs(policy: str) -> list[tuple[int, int]]:
            with SPANS_LOCK:
                return list(SPANS.get(f"every-second-{policy}", []))

        wait_for(
            "three runs of every schedule",
            lambda: all(len(runs(p)) >= 3 for p in ("allow", "skip", "buffer_one")),
            60,
        )
        for policy in ("allow", "skip", "buffer_one"):
            s.delete_schedule(f"every-second-{policy}")

        skipped = wait_for(
            "skipped occurrences",
            lambda: (
                (got := outcome_states_of(settings, "every-second-skip")).count("skipped") >= 2
                and got
            ),
            30,
        )
    assert overlapping(runs("allow"))  # the default lets them overlap
    assert not overlapping(runs("skip"))
    assert not overlapping(runs("buffer_one"))
    assert "succeeded" in skipped
    # buffer_one: the waiting occurrence starts as the running one ends (within a second),
    # and the occurrences that came while one waited were skipped
    spans = sorted(runs("buffer_one"))
    assert all(b[0] - a[1] < 1_000 for a, b in itertools.pairwise(spans))
    assert "skipped" in outcome_states_of(settings, "every-second-buffer_one")


def outcome_states_of(settings: Settings, schedule_id: str) -> list[str]:
    out = []
    for r in read_topic(settings, names(settings).outcomes):
        version = codec.parse_schema_header(r.headers.get(hdr.SCHEMA), expected="outcome")
        o = codec.decode("outcome", r.value or b"", writer_version=version)
        if o["schedule_id"] == schedule_id:
            out.append(o["state"])
    return out
