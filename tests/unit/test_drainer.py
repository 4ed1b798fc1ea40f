"""The drainer against an in-memory timer topic: order, pacing, cascades, takeovers."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from dueflow import headers as hdr
from dueflow.config import Settings, load_settings
from dueflow.kafka.topics import names
from dueflow.observability.metrics import Metrics
from dueflow.observability.tracing import JobTracer
from dueflow.records.record_size import record_size
from dueflow.rules.wheel import NEAR_LEVEL
from dueflow.streams.emitter.cron_keeper import CronKeeper
from dueflow.streams.emitter.drainer import WheelDrainer
from dueflow.streams.emitter.limits import CAREFUL_MS, FIRE_HEADROOM, EmitterLimits
from tests.support.sim_wheel import SimWheel, Stored


def wheel_settings(**emitter: object) -> Settings:
    """The wheel these tests drain (levels of 3 s, 20 s and 96 s), with ``emitter``
    options."""
    wheel = {
        "levels": "12x250,10x2000,6x16000",
        "near_partitions": 2,
        "near_window_ms": 500,
        "lookahead_ms": 100,
    }
    return load_settings(env={}, overrides={"wheel": wheel, "emitter": emitter})


SETTINGS = wheel_settings(catchup_max_rate_per_s=1_000_000)
GEO = SETTINGS.wheel


def _run(
    sim: SimWheel, start: int, until: int, step: int = 10, crash_at: int | None = None
) -> None:
    d = sim.drainer(start)
    t = start
    while t <= until:
        sim.step(d, t)
        if d.touched:
            sim.commit(d, t)
        if crash_at is not None and t >= crash_at:
            d = sim.drainer(t)  # uncommitted work is gone; a new emitter takes over
            crash_at = None
        t += step


def random_timers(
    rng: random.Random, count: int, *, written: tuple[int, int], offsets: list[int]
) -> list[tuple[int, str, int]]:
    """``count`` timers ``(written_ms, key, due_ms)`` in write order: written in the
    ``written`` range, due one of ``offsets`` after (plus up to 99 ms)."""
    timers = []
    for i in range(count):
        at = rng.randint(*written)
        due = at + rng.choice(offsets)
        timers.append((at, f"j{i}", due + rng.randint(0, 99)))
    timers.sort()
    return timers


def run_with_takeovers(
    sim: SimWheel,
    rng: random.Random,
    timers: list[tuple[int, str, int]],
    crashes: list[int],
    *,
    until: int,
) -> tuple[WheelDrainer, int]:
    """From 10 s to ``until`` in random steps: each timer scheduled when written, a
    random number of records per step, a commit now and then, and at each crash
    time a new drainer (a takeover; it also lands in the middle of re-reading
    after a crash). The last drainer and the time it stopped at."""
    crash_points = sorted(crashes)
    d = sim.drainer(10_000)
    t = 10_000
    pending = list(timers)
    while t <= until:
        while pending and pending[0][0] <= t:
            _, key, due = pending.pop(0)
            sim.schedule(key, due, t)
        sim.step(d, t, max_messages=rng.randint(1, 30))
        if d.touched and rng.random() < 0.5:
            sim.commit(d, t)
        if crash_points and t >= crash_points[0]:
            crash_points.pop(0)
            d = sim.drainer(t)
        t += rng.randint(1, 40)
    return d, t


def run_acked_with_takeovers(
    sim: SimWheel,
    rng: random.Random,
    timers: list[tuple[int, str, int]],
    crashes: list[int],
    *,
    until: int,
) -> tuple[WheelDrainer, int]:
    """As :func:`run_with_takeovers`, firing without transactions: records are
    delivered a few at a time, offsets sealed now and then and committed once
    everything before them is delivered, and a crash delivers or loses each
    record not delivered yet."""
    sim.acked = True
    crash_points = sorted(crashes)
    d = sim.drainer(10_000)
    t = 10_000
    pending = list(timers)
    while t <= until:
        sim.now_ms = t
        while pending and pending[0][0] <= t:
            _, key, due = pending.pop(0)
            sim.schedule(key, due, t)
        sim.step(d, t, max_messages=rng.randint(1, 30))
        sim.deliver(rng.choice([0, 0, 1, 3, 20]))
        if d.touched and rng.random() < 0.3:
            sim.seal(d)
        sim.commit_acked(d)
        if crash_points and t >= crash_points[0]:
            crash_points.pop(0)
            sim.crash()
            d = sim.drainer(t)
        t += rng.randint(1, 40)
    sim.deliver()
    return d, t


def assert_each_fired_once_not_early(sim: SimWheel, timers: list[tuple[int, str, int]]) -> None:
    counts = Counter(f.key.decode() for f in sim.fired)
    assert set(counts) == {key for _, key, _ in timers}, "a timer was lost"
    assert set(counts.values()) == {1}, f"duplicates: {[k for k, c in counts.items() if c > 1]}"
    assert all(f.fired_ms >= f.due_ms for f in sim.fired), "fired early"


def test_near_timers_fire_in_due_order_and_never_early() -> None:
    sim = SimWheel(SETTINGS)
    for i, due in enumerate([10_300, 10_100, 10_200, 10_100]):
        sim.schedule(f"j{i}", due, 10_000)
    _run(sim, 10_000, 10_500)
    assert [f.key for f in sim.fired] == [b"j1", b"j3", b"j2", b"j0"]
    assert all(f.fired_ms >= f.due_ms for f in sim.fired)
    assert max(f.fired_ms - f.due_ms for f in sim.fired) <= 10


@pytest.mark.parametrize("watch_ms", [200, 10**9], ids=["end-watch", "no-end-watch"])
def test_timers_cascade_through_every_level_and_fire_on_time(watch_ms: int) -> None:
    sim = SimWheel(SETTINGS, watch_ms=watch_ms)
    dues = {f"j{i}": 10_000 + 700 * i for i in range(60)}  # up to 41 s: level 2 and parked
    levels: Counter[int] = Counter()
    for key, due in dues.items():
        p = sim.schedule(key, due, 10_000)
        levels[GEO.locate(p)[0]] += 1
    assert set(levels) == {NEAR_LEVEL, 0, 1, 2}
    _run(sim, 10_000, 52_000)
    fired = {f.key.decode(): f for f in sim.fired}
    assert set(fired) == set(dues)
    assert len(sim.fired) == len(dues)
    assert all(0 <= f.fired_ms - f.due_ms <= 10 for f in sim.fired)


def test_a_level0_slot_is_read_only_shortly_before_it_opens() -> None:
    sim = SimWheel(SETTINGS)
    sim.schedule("far", 12_000, 10_000)  # level 0, slot 48 opens at 11_900
    d = sim.drainer(10_000)
    for t in range(10_000, 11_000, 10):
        sim.step(d, t)
    p = next(p for p, log in sim.logs.items() if log)
    assert GEO.locate(p)[0] == 0
    assert p in sim.paused  # read once, then held until the drain clock gets there
    assert d.heap_size == 1


def test_a_level1_record_waits_for_its_slot_then_moves_down() -> None:
    sim = SimWheel(SETTINGS)
    p1 = sim.schedule("x", 15_000, 10_000)  # level 1 (2 s slots): slot 7 opens at 13_900
    assert GEO.locate(p1)[0] == 1
    d = sim.drainer(10_000)
    for t in range(10_000, 13_890, 10):
        sim.step(d, t)
        if d.touched:
            sim.commit(d, t)
    assert p1 in sim.paused
    assert sim.positions[p1] == 0  # not consumed: it is read again when the slot opens
    for t in range(13_890, 14_000, 10):
        sim.step(d, t)
        if d.touched:
            sim.commit(d, t)
    assert sim.committed[p1][0] == 1
    moved = [p for p, log in sim.logs.items() if p != p1 and log]
    assert [GEO.locate(p)[0] for p in moved] == [0]


def test_slot_partitions_read_to_their_end_leave_the_fetch_until_their_visit_nears() -> None:
    sim = SimWheel(SETTINGS, watch_ms=10**9)  # no end watch: the rules alone suffice
    sim.schedule("soon", 10_400, 10_000)  # near
    sim.schedule("l1", 15_000, 10_000)  # level 1, its slot opens at 13_900
    d = sim.drainer(10_000)
    for t in range(10_000, 12_000, 10):
        sim.step(d, t)
        if d.touched:
            sim.commit(d, t)
    reading = [p for p in sim.logs if p not in sim.paused]
    near = list(range(GEO.near_partitions))
    # Near partitions always; level 0 only the slots within a few slots of the drain
    # clock (12 slots of 250 ms); level 1 and 2 none but the one open now.
    assert set(near) <= set(reading)
    levels = Counter(GEO.locate(p)[0] for p in reading if p not in near)
    assert levels[0] <= 6, levels
    assert levels[1] <= 1, levels
    assert levels[2] <= 1, levels
    assert len(d.parked) >= GEO.total_partitions - 12
    for t in range(12_000, 16_000, 10):
        sim.step(d, t)
        if d.touched:
            sim.commit(d, t)
    fired = {f.key: f for f in sim.fired}
    assert set(fired) == {b"soon", b"l1"}
    assert all(0 <= f.fired_ms - f.due_ms <= 10 for f in sim.fired)


def test_a_record_landing_out_of_turn_in_a_parked_partition_fires_soon() -> None:
    sim = SimWheel(SETTINGS)
    d = sim.drainer(10_000)
    for t in range(10_000, 11_000, 10):
        sim.step(d, t)
    # A producer whose clock is 4 s behind writes a timer due "in 1 s" into the
    # level-0 slot of 7_000-7_250: its next visit is 3 s away, so it is parked.
    skewed = GEO.partition_of(0, 7_000 // 250)
    assert skewed in d.parked
    sim.append(
        skewed, Stored(b"skewed", b"v", [("df-due", b"7100"), ("df-queue", b"default")], 11_000)
    )
    t = 11_000
    while not sim.fired and t < 13_000:
        sim.step(d, t)
        if d.touched:
            sim.commit(d, t)
        t += 10
    assert [f.key for f in sim.fired] == [b"skewed"]
    assert sim.fired[0].fired_ms - 11_000 <= sim.watch_ms + 20
    assert sim.woken == 1


def test_malformed_records_are_quarantined_and_the_next_one_fires() -> None:
    sim = SimWheel(SETTINGS)
    sim.append(0, Stored(b"bad", b"v", [("df-queue", b"default")], 10_000))
    sim.append(0, Stored(b"bad2", b"v", [("df-due", b"10100"), ("df-queue", b"nope")], 10_000))
    sim.append(0, Stored(b"ok", b"v", [("df-due", b"10100"), ("df-queue", b"default")], 10_000))
    _run(sim, 10_000, 10_300)
    assert sim.quarantined == [b"bad", b"bad2"]
    assert [f.key for f in sim.fired] == [b"ok"]
    assert sim.committed[0][0] == 3


def test_fired_records_forward_value_key_and_headers_and_add_fired_and_source() -> None:
    """Byte for byte, whether a timer fires from the heap or as it is read (read
    after a later timer fired)."""
    sim = SimWheel(SETTINGS)
    sent: list[tuple[str, bytes | None, bytes | None, list[tuple[str, bytes]]]] = []
    forward = sim.send

    def send(topic: str, value: Any, key: Any, headers: Any, partition: int = -1) -> None:
        sent.append((topic, value, key, list(headers)))
        forward(topic, value, key, headers, partition)

    sim.send = send  # type: ignore[method-assign]
    original = [
        ("df-due", b"10100"),
        ("df-queue", b"default"),
        ("traceparent", b"00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"),
        ("x-any", b"\x00\xff"),
        ("x-any", b"again"),
    ]
    sim.append(0, Stored(b"heap", b"\x01value", list(original), 10_000))
    d = sim.drainer(10_000)
    for t in range(10_000, 10_200, 10):
        sim.step(d, t)
    late = [("df-due", b"10050"), ("df-queue", b"default"), ("df-job", b"late")]
    sim.append(1, Stored(b"late", b"", list(late), 10_200))  # due before the fired one
    assert len(sent) == 1
    d.on_messages(sim.consume(50), 10_210)  # fired as read: no fire_due
    assert d.heap_size == 0
    exec_topic = names(SETTINGS).exec("default")
    timers = names(SETTINGS).timers
    assert sent == [
        (
            exec_topic,
            b"\x01value",
            b"heap",
            [*original, ("df-fired", b"10100"), ("df-src", f"{timers}:0:0".encode())],
        ),
        (
            exec_topic,
            b"",
            b"late",
            [*late, ("df-fired", b"10210"), ("df-src", f"{timers}:1:0".encode())],
        ),
    ]


def test_overdue_backlog_fires_once_within_the_rate_limit() -> None:
    slow = wheel_settings(catchup_max_rate_per_s=1_000)
    sim = SimWheel(slow, per_partition=100)
    for i in range(3_000):  # written over 30 s, all due during a 40 s outage
        sim.schedule(f"j{i}", 10_000 + i * 10 + 400, 10_000 + i * 10)
    _run(sim, 60_000, 64_000)
    counts = Counter(f.key for f in sim.fired)
    assert len(counts) == 3_000
    assert set(counts.values()) == {1}
    per_second = Counter(f.fired_ms // 1_000 for f in sim.fired)
    assert max(per_second.values()) <= 1_000 + 50  # rate plus the burst
    # The backlog drains in due order, to within the read-ahead of a near
    # partition and a level-0 slot (records of different partitions race).
    latest = 0
    for f in sim.fired:
        assert latest - f.due_ms <= 750 + 250 + 250
        latest = max(latest, f.due_ms)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    count=st.integers(1, 120),
    crashes=st.lists(st.integers(10_000, 45_000), max_size=8),
)
def test_every_timer_fires_exactly_once_across_takeovers(
    seed: int, count: int, crashes: list[int]
) -> None:
    rng = random.Random(seed)
    sim = SimWheel(SETTINGS, rng=random.Random(seed + 1))
    offsets = [-2_000, 0, 300, 900, 3_000, 15_000, 40_000]
    timers = random_timers(rng, count, written=(10_000, 30_000), offsets=offsets)
    run_with_takeovers(sim, rng, timers, crashes, until=80_000)
    assert_each_fired_once_not_early(sim, timers)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    count=st.integers(1, 120),
    crashes=st.lists(st.integers(10_000, 45_000), max_size=8),
)
def test_without_transactions_every_timer_fires_across_takeovers_and_twice_only_after_one(
    seed: int, count: int, crashes: list[int]
) -> None:
    """Offsets committed only once what they cover is delivered: a takeover loses
    nothing, never fires early, and fires again at most what the dead emitter
    fired after its last commit (never a timer twice without a takeover)."""
    rng = random.Random(seed)
    sim = SimWheel(SETTINGS, rng=random.Random(seed + 1))
    timers = random_timers(rng, count, written=(10_000, 30_000), offsets=[50, 400, 1_500, 8_000])
    run_acked_with_takeovers(sim, rng, timers, crashes, until=80_000)
    counts = Counter(f.key.decode() for f in sim.fired)
    assert set(counts) == {key for _, key, _ in timers}, "a timer was lost"
    assert all(f.fired_ms >= f.due_ms for f in sim.fired), "fired early"
    if not crashes:
        assert set(counts.values()) == {1}
    assert max(counts.values()) <= 1 + len(crashes)


def test_fires_are_traced_as_children_of_the_schedule_span() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = JobTracer(provider)
    sim = SimWheel(SETTINGS)
    with tracer.span_for_schedule(job_id="j", queue="default", task="t") as sched:
        headers = hdr.replace([(hdr.DUE, b"10100"), (hdr.QUEUE, b"default")], sched.headers)
    sim.append(0, Stored(b"j", b"v", headers, 10_000))
    sim.start_session()
    d = WheelDrainer(
        settings=SETTINGS,
        source=sim,
        sender=sim,
        metrics=Metrics(),
        committed={},
        now_ms=10_000,
        tracer=tracer,
    )
    for t in range(10_000, 10_200, 10):
        sim.step(d, t)
        if d.touched:
            sim.commit(d, t)
    assert [f.key for f in sim.fired] == [b"j"]
    spans = {s.name: s for s in exporter.get_finished_spans()}
    fire, schedule = spans["dueflow.fire"], spans["dueflow.schedule"]
    assert fire.parent is not None
    assert schedule.context is not None
    assert fire.parent.span_id == schedule.context.span_id


# A heap of a few timers and a rate limit that runs dry: every pause, kept record,
# resume and token shortage happens all the time.
TIGHT = wheel_settings(catchup_max_rate_per_s=100, heap_budget=3)


@settings(max_examples=60, deadline=None)
@given(
    seed=st.integers(0, 2**32),
    count=st.integers(1, 80),
    span=st.sampled_from([1_000, 4_000, 20_000]),
    crashes=st.lists(st.integers(10_000, 35_000), max_size=6),
)
def test_exactly_once_with_a_tiny_heap_and_a_dry_rate_limit(
    seed: int, count: int, span: int, crashes: list[int]
) -> None:
    rng = random.Random(seed)
    sim = SimWheel(TIGHT, rng=random.Random(seed + 1), per_partition=rng.randint(1, 8))
    offsets = [-3_000, -500, 0, 100, 300, 450, 900, 3_000]
    timers = random_timers(rng, count, written=(10_000, 10_000 + span), offsets=offsets)
    d, t = run_with_takeovers(sim, rng, timers, crashes, until=40_000)
    sim.step(d, t)
    sim.commit(d, t)
    assert_each_fired_once_not_early(sim, timers)


def test_a_kept_record_due_before_the_timer_that_resumed_its_feeder_survives_a_takeover() -> None:
    # A near partition is held at X (the heap is full); Y, written after X but due
    # before it, is kept. Firing X resumes the feeder, and the rate limit runs dry
    # right after X. The checkpoint then says "fired up to X": Y must have fired
    # already, or a new emitter would take it for fired and lose it.
    tight = wheel_settings(catchup_max_rate_per_s=40, heap_budget=2)  # burst: 2 tokens
    sim = SimWheel(tight, per_partition=100)
    near = next(p for p in range(GEO.total_partitions) if GEO.locate(p)[0] == NEAR_LEVEL)
    for key, due in (("A", 10_291), ("X", 10_300), ("Y", 10_295)):
        headers = hdr.encode([(hdr.DUE, due), (hdr.QUEUE, "default")])
        sim.append(near, Stored(key.encode(), b"v", headers, 10_000))
    d = sim.drainer(10_000)
    for t in range(10_000, 10_310, 10):
        sim.step(d, t, max_messages=1_000)
        if d.touched:
            sim.commit(d, t)
    d = sim.drainer(10_310)  # a takeover
    for t in range(10_310, 11_000, 10):
        sim.step(d, t, max_messages=1_000)
        if d.touched:
            sim.commit(d, t)
    assert sorted(f.key for f in sim.fired) == [b"A", b"X", b"Y"]


def test_a_timer_with_df_partition_fires_into_that_exec_partition_from_every_level() -> None:
    # Workers send retries longer than the top tier back through the wheel with
    # df-partition, so the job keeps its partition; cascading keeps the header.
    sim = SimWheel(SETTINGS)
    dues = {"near": 10_300, "l0": 12_000, "l1": 15_000, "l2": 40_000}
    levels = set()
    for i, (key, due) in enumerate(dues.items()):
        levels.add(GEO.locate(sim.schedule(key, due, 10_000, extra=[(hdr.PARTITION, i)]))[0])
    sim.schedule("by-key", 10_200, 10_000)
    sim.schedule("bad", 10_200, 10_000, extra=[(hdr.PARTITION, 99)])  # default has 6
    assert levels == {NEAR_LEVEL, 0, 1, 2}
    _run(sim, 10_000, 41_000)
    fired = {f.key.decode(): f for f in sim.fired}
    assert {k: fired[k].partition for k in dues} == {"near": 0, "l0": 1, "l1": 2, "l2": 3}
    assert fired["by-key"].partition == -1  # the producer's partitioner, by key
    assert all(0 <= f.fired_ms - f.due_ms <= 10 for f in sim.fired)
    assert "bad" not in fired
    assert sim.quarantined == [b"bad"]


# ------------------------------------------------------------------ record sizes


def _exec_limited(max_bytes: int) -> EmitterLimits:
    """Limits where the exec topic takes records of at most ``max_bytes``."""
    exec_topic = names(SETTINGS).exec("default")
    return EmitterLimits(SETTINGS, read=lambda topics: {exec_topic: max_bytes})


@pytest.mark.parametrize(
    ("delay_ms", "written_ms"),
    [(-5_000, 10_000), (300, 10_000), (1_500, 10_000), (9_000, 10_000), (40_000, 10_000)],
    ids=["overdue", "near", "level-0", "level-1", "level-2"],
)
def test_a_timer_whose_exec_record_would_not_fit_is_quarantined(
    delay_ms: int, written_ms: int
) -> None:
    """Wherever it waits in the wheel, and the timers behind it fire."""
    sim = SimWheel(SETTINGS, limits=_exec_limited(100_000))
    due = written_ms + delay_ms
    sim.schedule("big", due, written_ms, value=b"x" * 99_950)  # + headers: over the limit
    sim.schedule("fits", due, written_ms, value=b"x" * 90_000)  # measured: it fits
    sim.schedule("small", due + 1, written_ms)
    _run(sim, written_ms, max(due, written_ms) + 3_000)
    assert sorted(f.key for f in sim.fired) == [b"fits", b"small"]
    assert sim.quarantined == [b"big"]
    (reason,) = sim.quarantine_reasons
    assert reason.startswith("record too large: the exec record would be ")
    assert reason.endswith("bytes, over max.message.bytes 100000 of dueflow.exec.default")
    size = int(reason.split("would be ")[1].split(" ")[0])
    assert 100_000 < size < 100_200


class _NoSchedules:
    """A schedule table without schedules: a cron occurrence fires as the job it is."""

    topic = "dueflow.schedules"
    bad: list[Any] = []

    def get(self, schedule_id: str) -> None:
        return None

    def ids(self) -> list[str]:
        return []


@pytest.mark.parametrize("kind", ["job", "cron"])
def test_a_timer_whose_exec_record_is_the_limit_to_the_byte_fires(kind: str) -> None:
    """The exec record is measured as it is written (the timer's headers, df-fired and
    one df-src), whether the timer fires as a job or as a cron occurrence: one byte
    more and it is quarantined."""
    limits = _exec_limited(100_000)
    sim = SimWheel(SETTINGS, limits=limits)
    if kind == "cron":
        sim.cron = CronKeeper(SETTINGS, Metrics(), _NoSchedules(), sim, limits=limits)  # type: ignore[arg-type]
    extra = [(hdr.KIND, hdr.KIND_CRON)] if kind == "cron" else []
    for key, size in (("fits", 100_000), ("over", 100_001)):
        p = sim.schedule(key, 10_100, 10_000, extra=extra, value=b"")
        off = len(sim.logs[p]) - 1
        timer = sim.logs[p][off]
        fired = [
            *timer.headers,
            (hdr.FIRED, b"10100"),  # the fire time, as long as the sim's times
            (hdr.SOURCE, hdr.source_of(sim.topic, p, off)),
        ]
        n = size - record_size(timer.key, b"", fired)
        while record_size(timer.key, b"x" * n, fired) > size:
            n -= 1
        timer.value = b"x" * n
        assert record_size(timer.key, timer.value, fired) == size
    _run(sim, 10_000, 10_500)
    assert [f.key for f in sim.fired] == [b"fits"]
    assert sim.quarantined == [b"over"]


def test_a_fired_record_is_measured_only_above_the_bound() -> None:
    """The hot path measures nothing below the exec topic's limit less the headroom."""
    limits = _exec_limited(100_000)
    sim = SimWheel(SETTINGS, limits=limits)
    sim.schedule("small", 10_100, 10_000)
    _run(sim, 10_000, 10_500)
    assert [f.key for f in sim.fired] == [b"small"]
    assert limits.fast == {"dueflow.exec.default": 100_000 - FIRE_HEADROOM}


def test_after_a_refusal_every_record_is_measured_for_a_while() -> None:
    """Headers larger than the hot path allows for pass it; once a write was refused
    as too large (the process says so), every record is measured, so the record that
    was refused is quarantined when it is read again."""
    limits = _exec_limited(30_000)
    sim = SimWheel(SETTINGS, limits=limits)
    heavy = [("x-big", b"h" * 31_000)]
    sim.schedule("heavy", 10_100, 10_000, extra=heavy)
    sim.schedule("after", 10_200, 10_000)
    _run(sim, 10_000, 10_500)
    assert [f.key for f in sim.fired] == [b"heavy", b"after"]  # not measured: it went
    sim.fired.clear()
    sim.committed.clear()  # (the broker refused it: nothing of it committed)
    limits.refused(10_600)
    _run(sim, 10_600, 11_000)
    assert [f.key for f in sim.fired] == [b"after"]
    assert sim.quarantined == [b"heavy"]
    assert limits.fast_limit("dueflow.exec.default", 10_600 + CAREFUL_MS) > 0  # then relaxed
