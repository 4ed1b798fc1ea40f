"""The wire at its boundaries, for the fuzzer of tests/integration/test_wire_fuzz.py (pure).

Hypothesis strategies draw *specs*: one record of one topic (timers, an exec
partition, a retry tier, control, schedules, queues) as a good record with
mutations of its headers, key and value fields, each value at or around a
limit of docs/wire-format.md#accepted-ranges (0, -1, the maximum and one past
it, 2**63, 2**64, huge, not a number, empty, invalid UTF-8, control
characters), headers missing or repeated, Avro cut short. A spec becomes a
record with :func:`materialize` at the time it is written (times relative to
"now" are resolved then), together with its **fate**, which this module
computes from the documented ranges, independently of the code under test:

- ``run``: the job runs once, not before ``not_before``;
- ``dlq``: dead-lettered with a reason of ``reasons`` (and, for
  ``out_of_range``, a message naming one of ``fields``);
- ``quarantine``: set aside with a reason label of ``reasons``;
- ``expired``: not run, outcome ``expired`` (a first attempt past ``df-expires``);
- ``parked``: a timer due far ahead (it neither runs nor is set aside now);
- ``either``: too close to a bound that depends on when the worker reads it
  (run or dead-lettered, never lost, never held past the skew);
- ``refused``: larger than its topic's ``max.message.bytes``: the broker refuses it.

Sizes: :data:`PAYLOAD_SIZES` is the one place payload and record sizes come
from (see the note there); what a record too large becomes at each hop is in
tests/support/wire_sizes.py, and :func:`settle` applies it once the record's
offset is known (``df-src`` and ``df-origin`` name it).
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import struct
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from hypothesis import strategies as st

from dueflow import reasons
from tests.support import wire_sizes as ws

# The limits of docs/wire-format.md#accepted-ranges, written out again (the oracle
# must not import what it checks).
MAX_DUE = 253_402_300_799_999
MIN_TIME = -62_135_596_800_000  # 0001-01-01: a time before 1970 is overdue, not bad
INT32 = 2**31 - 1
LONG = 2**63 - 1
ID_CHARS = 512
NAME_CHARS = 255
KEY_BYTES = 2048

# The fuzzer's cluster (tests/integration/test_wire_fuzz.py starts its processes so).
QUEUE = "chaos"  # the queue of tests/chaos/handlers.py
TASK = "chaos-ok"  # no backoff of its own; its timeout (60 s) wins over the job's
EXEC_PARTITIONS = 2
TIERS = (200, 500)
SKEW = 2_000  # worker.max_clock_skew_ms of the fuzzer's worker
NEAR_PARTITIONS = 2  # tests.support.emitters.SMALL_WHEEL

# Failing tasks of tests/chaos/handlers.py, for records near a size budget: what they
# raise, and how the doomed one retries (3 attempts, a fixed 500 ms: the 500 ms tier).
DOOMED = "chaos-doomed"
PERMANENT = "chaos-permanent"
DOOMED_ATTEMPTS = 3
DOOMED_TIER = 500
JOB_ERROR = "dueflow.errors.JobError"
PERMANENT_FAILURE = ("dueflow.errors.PermanentJobError", "permanent: this job can never succeed")


def doomed_message(attempt: int) -> str:
    return f"doomed: attempt {attempt} fails on purpose"


@dataclass(frozen=True)
class Size:
    """How large a job record is: a JSON payload of ``payload`` bytes of padding, or,
    with ``budget``, as large as makes the record that hop measures ``delta`` bytes
    from its limit (:data:`BUDGETS`). ``task`` runs it; ``pad`` adds a header of that
    many bytes (a timer's headers past what the emitter's hot path allows for)."""

    budget: str | None = None
    delta: int = 0
    payload: int = 0
    task: str = TASK
    pad: int = 0


# budget -> (the record measured, its limit)
BUDGETS: dict[str, tuple[str, int]] = {
    "timers": ("the timer record, against the timer topic", ws.TOPIC_MAX_BYTES),
    "fire": ("the exec record the emitter makes of the timer", ws.TOPIC_MAX_BYTES),
    "exec": ("the exec record, against the exec topic", ws.TOPIC_MAX_BYTES),
    "retry": ("the retry record, against its tier", ws.TOPIC_MAX_BYTES),
    "retry-fit": ("the retry a worker makes of a failed attempt", ws.TOPIC_MAX_BYTES),
    "dead-letter": ("the dead letter, its error texts empty", ws.SET_ASIDE_MAX_BYTES),
}
# A timer header larger than the emitter's hot path allows for (16 KiB): such a timer
# is measured only after the broker refused its exec record.
HEAVY_HEADER = 20_000
# A dead letter near its budget wraps an exec record this far below its own limit
# (its retry would not fit either).
DEAD_LETTER_SLACK = 50


def budget_sizes(role: str) -> list[Size]:
    """Sizes at and around every budget a record of ``role`` meets."""
    around = (-1, 0, 1)
    if role == "timer":
        return [
            *(Size("timers", d) for d in around),
            *(Size("fire", d) for d in around),
            *(Size("fire", d, pad=HEAVY_HEADER) for d in (0, 1)),
        ]
    own = "exec" if role == "exec" else "retry"
    return [
        *(Size(own, d) for d in around),
        *(Size("retry-fit", d, task=DOOMED) for d in around),
        *(Size("dead-letter", d, task=t) for d in around for t in (PERMANENT, DOOMED)),
    ]


SMALL_PAYLOADS = [0, 1, 1_000, 65_536]


def _sizes(role: str) -> st.SearchStrategy[Size]:
    small = st.sampled_from(SMALL_PAYLOADS).map(lambda n: Size(payload=n))
    near = st.sampled_from(budget_sizes(role))
    return st.integers(0, 4).flatmap(lambda i: near if i == 0 else small)


# ``SIZE BUDGET``: the sizes of the job records the fuzzer writes, by role. Mostly small
# payloads; one draw in five a record at or one byte around a budget of its role
# (:func:`budget_sizes`): the timer record against the timer topic, the exec record the
# emitter fires against the exec topic, an exec or retry record against its own topic,
# the retry a failing job makes against its tier, the dead letter against the DLQ.
# These records are about a megabyte (the topics' limits as `dueflow topics ensure`
# makes them), so they are drawn rarely (and once each in the fuzzer's explicit
# example). Their fates (refused by the broker, quarantined as ``record too large``,
# dead-lettered ``other`` "not retried", the dead letter trimmed or by reference) are
# computed by :func:`settle` from tests/support/wire_sizes.py.
PAYLOAD_SIZES: dict[str, st.SearchStrategy[Size]] = {
    role: _sizes(role) for role in ("exec", "retry", "timer")
}


DECIMAL = re.compile(rb"-?[0-9]{1,19}")


def token() -> str:
    return uuid.uuid4().hex[:12]


# ------------------------------------------------------------------ raw Avro


def zigzag(n: int) -> bytes:
    """Avro's zig-zag varint of any integer (also past 64 bits, as a foreign writer may)."""
    z = n << 1 if n >= 0 else ((-n) << 1) - 1
    out = bytearray()
    while z >= 0x80:
        out.append((z & 0x7F) | 0x80)
        z >>= 7
    out.append(z)
    return bytes(out)


def _text(value: str | bytes) -> bytes:
    raw = value if isinstance(value, bytes) else value.encode("utf-8", "surrogatepass")
    return zigzag(len(raw)) + raw


def _map(items: dict[Any, Any]) -> bytes:
    if not items:
        return b"\x00"
    return zigzag(len(items)) + b"".join(_text(k) + _text(v) for k, v in items.items()) + b"\x00"


def _opt(value: Any, write: Any) -> bytes:
    return b"\x00" if value is None else b"\x02" + write(value)


def job_value(f: dict[str, Any]) -> bytes:
    """A ``dueflow.Job`` version 1 value, field by field, whatever the values (ints of any
    size, strings as bytes that need not be UTF-8): what a foreign writer can send."""
    backoff = f["backoff"]
    return b"".join(
        (
            _text(f["job_id"]),
            _text(f["queue"]),
            _text(f["task"]),
            _text(f["payload"]),
            _text(f["content_type"]),
            zigzag(f["due_ms"]),
            _text(f["idempotency_key"]),
            zigzag(f["max_attempts"]),
            _opt(
                backoff,
                lambda b: (
                    zigzag(b["kind"])
                    + zigzag(b["base_ms"])
                    + zigzag(b["max_ms"])
                    + struct.pack("<d", b["multiplier"])
                    + bytes([b["jitter"]])
                ),
            ),
            _opt(f["timeout_ms"], zigzag),
            zigzag(f["jitter_ms"]),
            zigzag(f["created_ms"]),
            _map(f["trace"]),
            _opt(f["schedule_id"], _text),
            _opt(f["schedule_version"], zigzag),
            _opt(f["content_hash"], _text),
            _map(f["labels"]),
        )
    )


def base_job(tok: str, *, due_ms: int, created_ms: int) -> dict[str, Any]:
    return {
        "job_id": f"{tok}-job",
        "queue": QUEUE,
        "task": TASK,
        "payload": b'{"n": 1}',
        "content_type": "application/json",
        "due_ms": due_ms,
        "idempotency_key": f"{tok}-key",
        "max_attempts": 4,
        "backoff": None,
        "timeout_ms": None,
        "jitter_ms": 0,
        "created_ms": created_ms,
        "trace": {},
        "schedule_id": None,
        "schedule_version": None,
        "content_hash": None,
        "labels": {},
    }


# ---------------------------------------------------------------- values


@dataclass(frozen=True)
class Rel:
    """A time relative to a base the record has when it is written: ``base`` is
    ``now``, ``fired``, ``due``, ``last_failure`` or ``bound`` (the bound of the
    record's kind: see :func:`materialize`)."""

    base: str
    delta: int


HeaderValue = bytes | int | Rel | None  # None: the header is removed

NOT_NUMBERS = [
    b"",
    b"-",
    b" 5",
    b"5 ",
    b"+5",
    b"1_000",
    b"0x10",
    b"1e3",
    b"soon",
    "\u0665".encode(),  # ARABIC-INDIC DIGIT FIVE: a digit, not an ASCII one
    b"\xff\xfe",
    b"\x1b[31m5",
    b"5\x00",
    b"9" * 5000,  # past Python's int digit limit
]


def edge_ints(low: int, high: int) -> st.SearchStrategy[int]:
    """Integers at and around ``[low, high]`` and where 64 bits end."""
    return st.sampled_from(
        sorted(
            {low, low - 1, low + 1, high, high - 1, high + 1, 0, -1, 1}
            | {INT32, INT32 + 1, LONG, LONG + 1, 2**64, -(2**63), -(2**63) - 1, 2**69 - 1, 10**30}
        )
    )


def number_header(low: int, high: int) -> st.SearchStrategy[HeaderValue]:
    return st.one_of(edge_ints(low, high), st.sampled_from(NOT_NUMBERS))


def header_bytes(value: HeaderValue, times: dict[str, int]) -> bytes | None:
    if value is None:
        return None
    if isinstance(value, Rel):
        return str(times[value.base] + value.delta).encode()
    if isinstance(value, int):
        return str(value).encode()
    return value


def read_decimal(raw: bytes | None, low: int, high: int) -> int | None:
    """The documented reading of a number header: an optional '-' and 1-19 ASCII
    digits, in ``[low, high]``; None when it is not."""
    if raw is None or not DECIMAL.fullmatch(raw):
        return None
    value = int(raw)
    return value if low <= value <= high else None


# --------------------------------------------------------------------- specs


@dataclass
class Spec:
    """One record to write: its topic role and what is changed from a good record."""

    role: str  # exec | retry | timer | control | schedule | queue
    partition: int = 0
    tier: int = TIERS[0]
    headers: list[tuple[str, HeaderValue]] = field(default_factory=list)  # set, in order
    duplicate: tuple[str, HeaderValue] | None = None  # an earlier copy of a header
    fields: dict[str, Any] = field(default_factory=dict)  # Job fields changed
    key: str = "default"  # "default" or one of KEY_KINDS
    value: str = "good"  # good | truncated | tombstone
    size: Size | None = None
    doc: dict[str, Any] | None = None  # control, schedule, queue records


@dataclass
class Record:
    """A spec made concrete: where it goes and what should become of it."""

    role: str
    topic_role: str  # the topic role to write to (tier topics: "retry")
    partition: int
    tier: int
    key: bytes | None
    value: bytes | None
    headers: list[tuple[str, bytes]]
    fate: str
    token: str
    not_before: int = 0
    reasons: frozenset[str] = frozenset()
    fields: frozenset[str] = frozenset()
    written_ms: int = 0
    doc: dict[str, Any] | None = None  # schedule and queue records: the Avro record
    runs: int = 0  # dead-lettered after this many attempts ran (fate dlq)
    message: str = ""  # the dead letter's error message begins with this
    cut: str | None = None  # what the dead letter keeps (ws.DeadLetterSize.verdict)
    size: Size | None = None
    sizing: Sizing | None = None  # what settle() computes the size fates from


@dataclass(frozen=True)
class Place:
    """Where a job record is written: the prefix of the fuzzer's topics and its offset
    there (a guess until it is written; :func:`settle` takes the real one)."""

    prefix: str = "p"
    offset: int = 5

    @property
    def timers(self) -> str:
        return f"{self.prefix}.timers"

    @property
    def exec(self) -> str:
        return f"{self.prefix}.exec.{QUEUE}"

    def retry(self, tier: int) -> str:
        return f"{self.prefix}.retry.{QUEUE}.{tier}ms"  # the fuzzer's tiers: under a second

    def topic(self, role: str, tier: int) -> str:
        return {"timer": self.timers, "exec": self.exec, "retry": self.retry(tier)}[role]


@dataclass(frozen=True)
class Sizing:
    """What the size fates of a job record are computed from: its fate as if it fit
    (fate, reasons, fields, not before), the task, attempt, ids and times."""

    fate: tuple[str, frozenset[str], frozenset[str], int]
    task: str
    attempt: int
    ids: tuple[str, str, str, str]  # job id, queue, task, idempotency key
    now: int
    place: Place


KEY_KINDS = ["none", "empty", "not-utf8", "longest", "too-long"]


def key_of(kind: str, tok: str) -> bytes | None:
    """A record key of ``kind``, unique to ``tok`` (a duplicate key would be skipped)."""
    t = tok.encode()
    return {
        "default": t + b"-key",
        "none": None,
        "empty": b"",
        "not-utf8": t + b"\xff\xfe",
        "longest": t + b"k" * (KEY_BYTES - len(t)),
        "too-long": t + b"k" * (KEY_BYTES + 1 - len(t)),
    }[kind]


# Job fields, and the values around their limits (the oracle is in _value_problems).
FIELD_VALUES: dict[str, st.SearchStrategy[Any]] = {
    "job_id": st.sampled_from(["", "x" * ID_CHARS, "x" * (ID_CHARS + 1), "a\x1b[31mb", "\x00", "é"])
    | st.just(b"\xff\xfe"),
    "idempotency_key": st.sampled_from(["", "k" * ID_CHARS, "k" * (ID_CHARS + 1), "k\x07\x00"])
    | st.just(b"\xc3\x28"),
    "queue": st.sampled_from(["", "q" * NAME_CHARS, "q" * (NAME_CHARS + 1)]),
    "content_type": st.sampled_from(
        [
            "",
            "text/plain",
            "application/octet-stream",
            "a" * (NAME_CHARS + 1),
            "text/\x1bplain",
            "application/jsön",
        ]
    ),
    "due_ms": edge_ints(MIN_TIME, MAX_DUE),
    "created_ms": edge_ints(MIN_TIME, MAX_DUE),
    "max_attempts": edge_ints(1, INT32),
    "timeout_ms": st.none() | edge_ints(1, LONG) | st.sampled_from([-5_000]),
    "jitter_ms": edge_ints(0, MAX_DUE),
    "schedule_version": st.none() | edge_ints(0, LONG),
    "content_hash": st.none() | st.sampled_from(["0" * 32, "h" * (NAME_CHARS + 1)]),
    "labels": st.sampled_from([{}, {"": ""}, {"a\x1b": "\x00"}, {b"\xff": "x"}]),
    "backoff": st.none()
    | st.fixed_dictionaries(
        {
            "kind": st.sampled_from([0, 1, 2, 3, -1]),
            "base_ms": st.sampled_from([0, 100, -1, LONG, LONG + 1]),
            "max_ms": st.sampled_from([0, 500, 60_000, LONG, LONG + 1, -1]),
            "multiplier": st.sampled_from(
                [1.0, 2.0, 1000.0, 0.5, 1000.5, float("nan"), float("inf")]
            ),
            "jitter": st.sampled_from([0, 1, 2]),
        }
    ),
}

EXEC_HEADERS: dict[str, st.SearchStrategy[HeaderValue]] = {
    "df-attempt": number_header(1, INT32) | st.sampled_from([b"2", b"0002"]),
    "df-due": number_header(MIN_TIME, MAX_DUE)
    | st.sampled_from(
        [
            Rel("now", -100),
            Rel("bound", 0),  # the last accepted
            Rel("bound", 1),  # the first refused
            Rel("bound", 86_400_000),
            Rel("now", 86_400_000 * 365 * 974),  # the year 3000
        ]
    ),
    "df-fired": number_header(MIN_TIME, MAX_DUE)
    | st.sampled_from([Rel("now", -3_600_000), Rel("now", 3_600_000)]),
    "df-expires": number_header(MIN_TIME, MAX_DUE)
    | st.sampled_from([Rel("now", 86_400_000), Rel("now", -1_000), Rel("now", -1)]),
    "df-first-failure": number_header(MIN_TIME, MAX_DUE) | st.just(Rel("now", 3_600_000)),
    "df-last-failure": number_header(MIN_TIME, MAX_DUE)
    | st.sampled_from([Rel("now", -60_000), Rel("now", 3_600_000)]),
    "df-redriven-at": st.sampled_from([Rel("now", 0), Rel("now", 3_600_000), b"x"]),
    "df-overlap": st.sampled_from([b"allow", b"skip", b"buffer_one", b"", b"SKIP"]),
    "df-schema": st.sampled_from([b"dueflow.Job/1", b"dueflow.Job/99", b"nonsense", b""]),
    # informational: any bytes
    "df-job": st.sampled_from([b"", b"\xff\xfe", b"a\x1b[2Jb", b"j" * 3000]),
    "df-task": st.sampled_from([b"", b"\xff", b"t\x00"]),
    "df-origin": st.sampled_from([b"", b"t:1:2", b"t:99999999999:1", b"t:-1:-1", b"\xff"]),
    "df-src": st.sampled_from([b"", b"\xff"]),
    "df-error": st.sampled_from([b"\xff", b"e" * 3000]),
    "traceparent": st.sampled_from([b"", b"00-xyz", b"\xff-\xfe-\xfd-\xfc"]),
    "df-queue": st.sampled_from([b"", b"nope", b"\xff"]),  # not read by a worker
    "df-kind": st.sampled_from([b"cron", b"x"]),
}
REMOVABLE = ["df-due", "df-fired", "df-schema", "df-attempt", "df-job", "df-task"]
# The headers that decide when and whether a job runs, drawn more often.
EXEC_HEADER_CHOICES = [
    *["df-attempt", "df-due", "df-fired", "df-expires", "df-last-failure"] * 3,
    *sorted(EXEC_HEADERS),
]

TIMER_HEADERS: dict[str, st.SearchStrategy[HeaderValue]] = {
    "df-due": number_header(MIN_TIME, MAX_DUE)
    | st.sampled_from([Rel("now", 200), Rel("now", -5_000), b"0001", MAX_DUE]),
    "df-queue": st.sampled_from([b"", b"nope", b"\xff\xfe", b"chaos\x00"]),
    "df-kind": st.sampled_from([b"job", b"cron", b"", b"JOB", b"x"]),
    "df-partition": number_header(0, EXEC_PARTITIONS - 1),
    "df-sv": number_header(0, LONG),
    "df-occurrence": number_header(0, MAX_DUE),
    "df-attempt": number_header(1, INT32),
    "df-expires": st.sampled_from([Rel("now", 86_400_000), b"x", str(MAX_DUE + 1).encode()]),
    "df-job": st.sampled_from([b"", b"\xff\xfe", b"a\x1b[2Jb"]),
}
TIMER_REMOVABLE = ["df-due", "df-queue", "df-kind", "df-schema"]


@st.composite
def job_specs(draw: st.DrawFn, role: str) -> Spec:
    """An exec or retry record with up to three mutations."""
    spec = Spec(role, partition=draw(st.integers(0, EXEC_PARTITIONS - 1)))
    if role == "retry":
        spec.tier = draw(st.sampled_from(TIERS))
    names = draw(st.lists(st.sampled_from(EXEC_HEADER_CHOICES), max_size=3, unique=True))
    spec.headers = [(n, draw(EXEC_HEADERS[n])) for n in names]
    if draw(st.integers(0, 5)) == 0:
        spec.headers.append((draw(st.sampled_from(REMOVABLE)), None))
    if spec.headers and draw(st.integers(0, 4)) == 0:
        name = spec.headers[0][0]
        spec.duplicate = (name, draw(EXEC_HEADERS.get(name, st.just(b"1"))))
    fields = draw(st.lists(st.sampled_from(sorted(FIELD_VALUES)), max_size=2, unique=True))
    spec.fields = {n: draw(FIELD_VALUES[n]) for n in fields}
    spec.key = draw(st.sampled_from([*["default"] * 6, *KEY_KINDS]))
    if spec.key == "none":  # the value's key is the key then: it must carry the token
        spec.fields.pop("idempotency_key", None)
    spec.value = draw(st.sampled_from(["good"] * 8 + ["truncated", "tombstone"]))
    if draw(st.integers(0, 3)) == 0:
        with_size(spec, draw(PAYLOAD_SIZES[role]))
    return spec


def with_size(spec: Spec, size: Size) -> None:
    """``spec`` of ``size``: a record at a budget has its whole value; one that fails
    (a failing task) is a good record otherwise, so its fate is the task's."""
    spec.size = size
    if size.budget is not None:
        spec.value = "good"
    if size.task != TASK:
        spec.headers, spec.duplicate, spec.fields, spec.key = [], None, {}, "default"


@st.composite
def timer_specs(draw: st.DrawFn) -> Spec:
    spec = Spec("timer", partition=draw(st.integers(0, NEAR_PARTITIONS - 1)))
    names = draw(st.lists(st.sampled_from(sorted(TIMER_HEADERS)), max_size=2, unique=True))
    spec.headers = [(n, draw(TIMER_HEADERS[n])) for n in names]
    if draw(st.integers(0, 3)) == 0:  # a cron occurrence's bookkeeping
        spec.headers = [
            ("df-kind", b"cron"),
            ("df-sv", draw(TIMER_HEADERS["df-sv"])),
            ("df-occurrence", draw(TIMER_HEADERS["df-occurrence"])),
        ]
    if draw(st.integers(0, 5)) == 0:
        spec.headers.append((draw(st.sampled_from(TIMER_REMOVABLE)), None))
    if spec.headers and draw(st.integers(0, 4)) == 0:
        name = spec.headers[0][0]
        spec.duplicate = (name, draw(TIMER_HEADERS.get(name, st.just(b"x"))))
    if draw(st.integers(0, 2)) == 0:
        name = draw(st.sampled_from(["max_attempts", "timeout_ms", "job_id", "due_ms"]))
        spec.fields = {name: draw(FIELD_VALUES[name])}
    spec.key = draw(st.sampled_from(["default"] * 6 + ["none"]))
    spec.value = draw(st.sampled_from(["good"] * 8 + ["truncated"]))
    if draw(st.integers(0, 3)) == 0:
        with_size(spec, draw(PAYLOAD_SIZES["timer"]))
    return spec


CONTROL_DOCS = st.fixed_dictionaries(
    {},
    optional={
        "action": st.sampled_from(["pause", "resume", "stop", 1, None]),
        "at_ms": edge_ints(MIN_TIME, MAX_DUE) | st.sampled_from(["now", 1.5, True, None]),
        "by": st.sampled_from(["ada", "", "b" * NAME_CHARS, "b" * (NAME_CHARS + 1), 5, "\x1b[31m"]),
        "reason": st.sampled_from(["x", "r" * 1000, "r" * 1001, ["x"], "\x00"]),
        "v": st.sampled_from([1, 2, "1"]),
    },
)


@st.composite
def control_specs(draw: st.DrawFn) -> Spec:
    doc = draw(CONTROL_DOCS)
    spec = Spec("control", doc=doc)
    spec.key = draw(st.sampled_from(["default"] * 6 + ["no-queue", "not-utf8"]))
    spec.value = draw(st.sampled_from(["json"] * 8 + ["not-json", "tombstone", "not-utf8"]))
    return spec


SCHEDULE_CHANGES = st.fixed_dictionaries(
    {},
    optional={
        "version": edge_ints(0, 221_845_392_000_000),
        "max_attempts": st.sampled_from([0, 1, INT32, INT32 + 1]),
        "jitter_ms": st.sampled_from([-1, 0]),
        "timeout_ms": st.sampled_from([None, 0, -5_000, 1]),
        "cron": st.sampled_from(["* * * * *", "61 * * * *", "", "*/0 * * * *"]),
        "timezone": st.sampled_from(["UTC", "Mars/Olympus", ""]),
        "schedule_id": st.sampled_from(["", "s" * (NAME_CHARS + 1)]),
        "backoff": st.sampled_from(
            [
                None,
                {"kind": "fixed", "base_ms": -1, "max_ms": 5, "multiplier": 2.0, "jitter": True},
                {"kind": "fixed", "base_ms": 5, "max_ms": 1, "multiplier": 2.0, "jitter": True},
                {
                    "kind": "exponential",
                    "base_ms": 1,
                    "max_ms": 5,
                    "multiplier": 0.5,
                    "jitter": True,
                },
            ]
        ),
    },
)

QUEUE_CHANGES = st.fixed_dictionaries(
    {},
    optional={
        "retry_tiers_ms": st.sampled_from([[], [0], [500, 200], [200, 200], [-1]]),
        "idempotency_retention_ms": st.sampled_from([0, -1]),
        "rate_limit_per_s": st.sampled_from([0.0, -1.0, float("nan"), float("inf")]),
        "partitions": st.sampled_from([0, -1, INT32 + 1]),
    },
).filter(bool)  # a valid registry record would register a queue: only invalid ones


def role_specs() -> st.SearchStrategy[Spec]:
    return st.one_of(
        job_specs("exec"),
        job_specs("retry"),
        timer_specs(),
        control_specs(),
        st.builds(lambda d: Spec("schedule", doc=d), SCHEDULE_CHANGES),
        st.builds(lambda d: Spec("queue", doc=d), QUEUE_CHANGES),
    )


# ----------------------------------------------------------------- the oracle


def _int_ok(value: Any) -> bool:
    """Whether an Avro int/long a foreign writer wrote decodes (10 varint bytes)."""
    return isinstance(value, int) and -(2**69) <= value < 2**69


def _string_ok(value: Any) -> bool:
    if isinstance(value, bytes):
        try:
            value.decode()
        except UnicodeDecodeError:
            return False
    return True


def _undecodable_value(f: dict[str, Any]) -> bool:
    for name in ("due_ms", "max_attempts", "jitter_ms", "created_ms"):
        if not _int_ok(f[name]):
            return True
    for name in ("timeout_ms", "schedule_version"):
        if f[name] is not None and not _int_ok(f[name]):
            return True
    for name in ("job_id", "queue", "task", "content_type", "idempotency_key"):
        if not _string_ok(f[name]):
            return True
    for mapping in (f["labels"], f["trace"]):
        if not all(_string_ok(k) and _string_ok(v) for k, v in mapping.items()):
            return True
    b = f["backoff"]
    if b is not None:
        if b["kind"] not in (0, 1, 2) or b["jitter"] not in (0, 1):
            return True
        if not (_int_ok(b["base_ms"]) and _int_ok(b["max_ms"])):
            return True
    return False


def _out_of_range_fields(f: dict[str, Any]) -> set[str]:
    """The Job fields of ``f`` outside their documented ranges."""
    bad = set()

    def name(field_name: str, most: int) -> None:
        if not 0 < len(f[field_name]) <= most:
            bad.add(field_name)

    name("job_id", ID_CHARS)
    name("idempotency_key", ID_CHARS)
    name("queue", NAME_CHARS)
    ctype = f["content_type"]
    if not (0 < len(ctype) <= NAME_CHARS and ctype.isascii() and ctype.isprintable()):
        bad.add("content_type")
    for n in ("due_ms", "created_ms"):
        if not MIN_TIME <= f[n] <= MAX_DUE:
            bad.add(n)
    if not 0 <= f["jitter_ms"] <= MAX_DUE:
        bad.add("jitter_ms")
    if not 1 <= f["max_attempts"] <= INT32:
        bad.add("max_attempts")
    if f["timeout_ms"] is not None and not 1 <= f["timeout_ms"] <= LONG:
        bad.add("timeout_ms")
    if f["schedule_version"] is not None and not 0 <= f["schedule_version"] <= LONG:
        bad.add("schedule_version")
    if f["content_hash"] is not None and len(f["content_hash"]) > NAME_CHARS:
        bad.add("content_hash")
    b = f["backoff"]
    if b is not None:
        if not 0 <= b["base_ms"] <= LONG:
            bad.add("backoff.base_ms")
        if not 0 <= b["max_ms"] <= LONG or b["max_ms"] < b["base_ms"]:
            bad.add("backoff.max_ms")
        m = b["multiplier"]
        if not (m == m and 1.0 <= m <= 1000.0):  # NaN is not equal to itself
            bad.add("backoff.multiplier")
    return bad


def longest_delay(f: dict[str, Any]) -> int:
    """The longest retry delay the queue and the job allow (the task has no backoff)."""
    b = f["backoff"]
    longest = max(TIERS)
    if b is not None and b["kind"] != 2:  # none
        longest = max(longest, b["max_ms"])
    return min(longest, MAX_DUE)


def _pairs(
    base: list[tuple[str, bytes]], spec: Spec, times: dict[str, int]
) -> list[tuple[str, bytes]]:
    """``base`` with the spec's header changes: a set header replaces every copy (and
    goes last), a removed one goes; the duplicate is an earlier copy."""
    changed = {name for name, _ in spec.headers}
    out = [(k, v) for k, v in base if k not in changed]
    if spec.duplicate is not None:
        raw = header_bytes(spec.duplicate[1], times)
        if raw is not None:
            out.append((spec.duplicate[0], raw))
    for name, value in spec.headers:
        raw = header_bytes(value, times)
        if raw is not None:
            out.append((name, raw))
    return out


def _last(pairs: Sequence[tuple[str, bytes]], name: str) -> bytes | None:
    found = None
    for k, v in pairs:
        if k == name:
            found = v
    return found


def materialize(spec: Spec, *, now: int, tok: str, place: Place | None = None) -> Record:
    """The record of ``spec`` written at ``now`` (to ``place``: only job records near a
    size budget depend on it), and its fate."""
    if spec.role in ("exec", "retry", "timer"):
        return _job_record(spec, now, tok, place or Place())
    return _other_record(spec, tok)


def _job_record(spec: Spec, now: int, tok: str, place: Place) -> Record:
    timer = spec.role == "timer"
    retry = spec.role == "retry"
    due = now + 200 if timer else now + 300 if retry else now - 100
    f = base_job(tok, due_ms=due if timer else now - 1_000, created_ms=now - 2_000)
    size = spec.size
    task = TASK if size is None else size.task
    f["task"] = task
    if size is not None and size.budget is None:
        f["payload"] = padding(tok, size.payload)
    for name, changed in spec.fields.items():
        if name in ("job_id", "idempotency_key") and isinstance(changed, str) and changed:
            changed = tok + changed  # still unique, still the length class it stands for
            if len(changed) > len(tok) + ID_CHARS:
                changed = changed[: ID_CHARS + 1]
            elif len(changed) > ID_CHARS:
                changed = changed[:ID_CHARS]
        f[name] = changed
    if spec.fields.get("content_type") == "application/octet-stream":
        f["payload"] = b"\x00\xffraw"
    times = {"now": now, "fired": now - 50, "due": due, "last_failure": now - 10}
    if timer:
        base = [
            ("df-due", str(due).encode()),
            ("df-queue", QUEUE.encode()),
            ("df-kind", b"job"),
            ("df-job", f"{tok}-job".encode()),
            ("df-task", task.encode()),
            ("df-schema", b"dueflow.Job/1"),
        ]
    else:
        base = [
            ("df-due", str(due).encode()),
            ("df-queue", QUEUE.encode()),
            ("df-job", f"{tok}-job".encode()),
            ("df-task", task.encode()),
            ("df-schema", b"dueflow.Job/1"),
            ("df-fired", str(now - 50 if not retry else now - 5_000).encode()),
            ("df-src", b"fuzz:0:0"),
        ]
        if retry:
            base += [
                ("df-attempt", b"2"),
                ("df-first-failure", str(now - 5_000).encode()),
                ("df-last-failure", str(now - 10).encode()),
            ]
    bound = _bound(spec, base, f, times) if not timer else 0
    times["bound"] = bound
    headers = _pairs(base, spec, times)
    key = key_of(spec.key, tok)
    attempt = 2 if retry else 1
    ids = (_string(f["job_id"]), QUEUE, task, _string(f["idempotency_key"]))
    sizing = Sizing(("run", frozenset(), frozenset(), 0), task, attempt, ids, now, place)
    if size is not None and size.budget is not None:
        n, fill, pad = _fit(spec, size, f, headers, key, sizing)
        f["payload"] = padding(tok, n)
        if pad:
            headers.append(("x-pad", noise(tok, pad)))
        headers.append(("x-fill", b"f" * fill))
    whole = job_value(f)
    value: bytes | None = whole
    if spec.value == "truncated":
        value = whole[: len(whole) // 2]
    elif spec.value == "tombstone":
        value = None
    rec = Record(
        spec.role,
        "retry" if retry else spec.role,
        spec.partition,
        spec.tier,
        key,
        value,
        headers,
        "run",
        tok,
        written_ms=now,
    )
    _fate(rec, spec, headers, f, key, now)
    if size is not None:
        rec.size = size
        fate = (rec.fate, rec.reasons, rec.fields, rec.not_before)
        rec.sizing = Sizing(fate, task, attempt, ids, now, place)
        settle(rec, place.offset)
    return rec


def _fate(
    rec: Record,
    spec: Spec,
    headers: list[tuple[str, bytes]],
    f: dict[str, Any],
    key: bytes | None,
    now: int,
) -> Record:
    """The fate of a job record as if it fit every topic on its way."""
    timer, retry = rec.role == "timer", rec.role == "retry"
    if timer:
        emitter = _emitter_fate(headers, key)
        if emitter is not None:
            rec.fate, rec.reasons = "quarantine", frozenset({emitter})
            return rec
        due_raw = _last(headers, "df-due")
        timer_due = int(due_raw or b"0")
        if timer_due > now + 86_400_000:
            rec.fate = "parked"
            return rec
        # fired by the emitter at its due time: df-fired is then, df-due no later
        fired = max(timer_due, now)
        worker_headers = [*headers, ("df-fired", str(fired).encode())]
        return _worker_fate(
            rec, worker_headers, f, key, now=fired, retry=False, whole=spec.value == "good"
        )
    return _worker_fate(rec, headers, f, key, now=now, retry=retry, whole=spec.value == "good")


def _bound(
    spec: Spec, base: list[tuple[str, bytes]], f: dict[str, Any], times: dict[str, int]
) -> int:
    """The latest df-due the worker accepts for this record as written (before the
    df-due change): ``Rel("bound", 0)`` is that time, ``Rel("bound", 1)`` one past it."""
    without_due = [(n, v) for n, v in spec.headers if n != "df-due"]
    trial = _pairs(base, Spec(spec.role, headers=without_due), {**times, "bound": 0})
    if spec.role == "retry":
        failed = read_decimal(_last(trial, "df-last-failure"), MIN_TIME, MAX_DUE)
        return (failed if failed is not None else times["now"]) + longest_delay(f) + SKEW
    written = read_decimal(_last(trial, "df-redriven-at"), MIN_TIME, MAX_DUE)
    if written is None:
        written = read_decimal(_last(trial, "df-fired"), MIN_TIME, MAX_DUE)
    return (written if written is not None else times["now"]) + SKEW


def _emitter_fate(headers: list[tuple[str, bytes]], key: bytes | None) -> str | None:
    """The quarantine reason the emitter gives a timer, or None when it fires it."""
    due = _last(headers, "df-due")
    if due is None:
        return reasons.MISSING_DUE
    if not DECIMAL.fullmatch(due):
        digits = due[1:] if due[:1] == b"-" else due
        return reasons.DUE_OUT_OF_RANGE if digits.isdigit() else reasons.BAD_DUE
    if read_decimal(due, MIN_TIME, MAX_DUE) is None:
        return reasons.DUE_OUT_OF_RANGE
    queue = _last(headers, "df-queue")
    if queue is None:
        return reasons.MISSING_QUEUE
    if queue != QUEUE.encode():
        return reasons.UNKNOWN_QUEUE
    if not key:
        return reasons.MISSING_TIMER_KEY
    kind = _last(headers, "df-kind")
    if kind is None or kind == b"job":
        part = _last(headers, "df-partition")
        if part is not None and (
            not part.isdigit() or len(part) > 19 or int(part) >= EXEC_PARTITIONS
        ):
            return reasons.BAD_PARTITION
        return None
    if kind == b"cron":
        sv = _last(headers, "df-sv")
        occurrence = _last(headers, "df-occurrence")
        if sv is not None and read_decimal(sv, 0, LONG) is None:
            return reasons.BAD_CRON_HEADER
        if occurrence is not None and read_decimal(occurrence, 0, MAX_DUE) is None:
            return reasons.BAD_CRON_HEADER
        return None  # no df-schedule: runs as the plain job it is
    return reasons.UNKNOWN_KIND


def _worker_fate(
    rec: Record,
    headers: list[tuple[str, bytes]],
    f: dict[str, Any],
    key: bytes | None,
    *,
    now: int,
    retry: bool,
    whole: bool,
) -> Record:
    """What a worker does with a record of these headers, fields and key (``whole``:
    the value is the Job's whole encoding), read at ``now`` or up to :data:`READ_WITHIN`
    later: the order of the worker's checks (docs/workers.md)."""
    h = dict(headers)  # the last copy of a header counts
    schema = h.get("df-schema")
    if not whole or _undecodable_value(f) or (schema is not None and schema != b"dueflow.Job/1"):
        rec.fate, rec.reasons = "dlq", frozenset({reasons.UNDECODABLE})
        return rec
    bad = _out_of_range_fields(f)
    if bad:
        rec.fate, rec.reasons, rec.fields = "dlq", frozenset({reasons.OUT_OF_RANGE}), frozenset(bad)
        return rec
    if key is None:
        key = f["idempotency_key"].encode()
    bad_headers: set[str] = set()
    if not 0 < len(key) <= KEY_BYTES:
        bad_headers.add("key")
    attempt_raw = h.get("df-attempt")
    attempt = 1 if attempt_raw is None else read_decimal(attempt_raw, 1, INT32)
    if attempt is None:
        bad_headers.add("df-attempt")
    ambiguous = False

    def past(name: str) -> int | None:
        """A time in the past, or None (absent, bad: noted, or ambiguous: noted)."""
        nonlocal ambiguous
        raw = h.get(name)
        if raw is None:
            return None
        value = read_decimal(raw, MIN_TIME, MAX_DUE)
        if value is None or value > now + SKEW + READ_WITHIN:
            bad_headers.add(name)
            return None
        if value > now + SKEW:
            ambiguous = True  # refused only if read before it is no longer ahead
            return None
        return value

    fired = past("df-fired")
    redriven = None if retry else past("df-redriven-at")
    past("df-first-failure")
    last = past("df-last-failure")
    due_raw = h.get("df-due")
    due = f["due_ms"] if due_raw is None else read_decimal(due_raw, MIN_TIME, MAX_DUE)
    if due is None:
        bad_headers.add("df-due")
    elif not bad_headers and not ambiguous:
        if retry:
            since = last
            bound_base = last if last is not None else now
            bound = bound_base + longest_delay(f) + SKEW
        else:
            since = redriven if redriven is not None else fired
            bound = (since if since is not None else now) + SKEW
        slack = READ_WITHIN if since is None else 0  # "now" is when the worker reads it
        if due > bound + slack:
            bad_headers.add("df-due" if due_raw is not None else "due_ms")
        elif due > bound:
            ambiguous = True
    expires_raw = h.get("df-expires")
    expires = None if expires_raw is None else read_decimal(expires_raw, MIN_TIME, MAX_DUE)
    if expires_raw is not None and expires is None:
        bad_headers.add("df-expires")
    overlap = h.get("df-overlap")
    if overlap is not None and overlap not in (b"allow", b"skip", b"buffer_one"):
        bad_headers.add("df-overlap")
    if bad_headers:
        rec.fate, rec.reasons = "dlq", frozenset({reasons.OUT_OF_RANGE})
        rec.fields = frozenset(bad_headers)
        return rec
    assert due is not None
    assert attempt is not None
    rec.not_before = due
    if ambiguous:
        rec.fate, rec.reasons = "either", frozenset({reasons.OUT_OF_RANGE})
        return rec
    if attempt == 1 and expires is not None and expires < now:
        rec.fate = "expired"
    return rec


READ_WITHIN = 15_000  # a worker reads a record this long after it was written, at most


# ------------------------------------------------------------------ sizes

PAD_JSON = len(b'{"pad": ""}')  # the JSON around a payload's padding


def noise(tok: str, n: int) -> bytes:
    """``n`` bytes of base64 that lz4 cannot shrink (so the broker sees the size the
    oracle counts whatever the writer's compression), the same for the same token."""
    raw = hashlib.shake_256(tok.encode()).digest(n * 3 // 4 + 3)
    return base64.urlsafe_b64encode(raw)[:n]


def padding(tok: str, n: int) -> bytes:
    """A JSON payload of ``n`` bytes of padding (``PAD_JSON`` more in all)."""
    return b'{"pad": "' + noise(tok, n) + b'"}'


def _string(value: Any) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def _fit(
    spec: Spec,
    size: Size,
    f: dict[str, Any],
    headers: list[tuple[str, bytes]],
    key: bytes | None,
    sizing: Sizing,
) -> tuple[int, int, int]:
    """``(padding, fill, pad)``: the payload's padding, the ``x-fill`` header's and the
    ``x-pad`` header's bytes that make the record ``size`` measures ``size.delta``
    bytes from its limit (as near as the varints allow)."""
    limit = BUDGETS[size.budget or ""][1]
    target = limit + size.delta
    bare = dict(f, payload=b"")
    value0 = len(job_value(bare)) - 1  # without the payload's bytes and its length
    k = -1 if key is None else len(key)
    own = ws.lens(headers)
    where = (sizing.place.topic(spec.role, spec.tier), spec.partition, sizing.place.offset)

    def shape(n: int, fill: int, pad: int) -> tuple[int, list[tuple[str, int]]]:
        h = [*own, *([("x-pad", pad)] if pad else []), ("x-fill", fill)]
        return value0 + ws.sized(n + PAD_JSON), h

    def measure(pad: int) -> Any:
        def of(n: int, fill: int) -> int:
            v, h = shape(n, fill, pad)
            if size.budget == "fire":
                src = ws.source(sizing.place.timers, spec.partition, sizing.place.offset)
                return ws.record_len(k, v, ws.fired_headers(h, src=src))
            if size.budget == "retry-fit":
                return _retry_len(k, v, h, sizing, ws.source(*where))
            if size.budget == "dead-letter":
                dead = _dead_letter(k, v, h, sizing, where, retried=False)
                assert dead is not None
                return dead.bare
            return ws.record_len(k, v, h)

        return of

    if size.budget != "dead-letter":
        n, fill = ws.fit(target, measure(size.pad), most=limit)
        return n, fill, size.pad
    # The dead letter holds the job's headers twice and its value once: a header of
    # about the DLQ's headroom takes it over its limit while the job record fits its own.
    aim = ws.TOPIC_MAX_BYTES - DEAD_LETTER_SLACK
    pad = ws.SET_ASIDE_MAX_BYTES - aim
    n = fill = 0
    for _ in range(4):
        n, fill = ws.fit(target, measure(pad), most=limit)
        v, h = shape(n, fill, pad)
        step = ws.record_len(k, v, h) - aim
        if abs(step) <= 2:
            break
        pad += step
    return n, fill, pad


def _retry_len(
    key: int, value: int, headers: list[tuple[str, int]], sizing: Sizing, origin: str
) -> int:
    """The retry record of a doomed job's failed attempt (its next attempt's)."""
    error = ws.summary(JOB_ERROR, doomed_message(sizing.attempt))
    retried = ws.retry_headers(headers, attempt=sizing.attempt + 1, error=error, origin=origin)
    return ws.record_len(key, value, retried)


def _dead_letter(
    key: int,
    value: int,
    headers: list[tuple[str, int]],
    sizing: Sizing,
    origin: tuple[str, int, int],
    *,
    retried: bool = True,
) -> ws.DeadLetterSize | None:
    """The dead letter a failing task's job ends as when its attempt at
    ``sizing.attempt`` fails (None: it is retried; ``retried=False``: the dead letter
    it would be if its retry did not fit)."""
    if sizing.task == PERMANENT:
        error_type, message = PERMANENT_FAILURE
    else:
        error_type, message = JOB_ERROR, doomed_message(sizing.attempt)
        retry = _retry_len(key, value, headers, sizing, ws.source(*origin))
        if retried and retry <= ws.TOPIC_MAX_BYTES:
            return None
        tier = sizing.place.retry(DOOMED_TIER)
        message = ws.not_retried(retry, ws.TOPIC_MAX_BYTES, tier, message)
    now = sizing.now
    return ws.dead_letter_size(
        key=key,
        ids=sizing.ids,
        attempts=sizing.attempt,
        times=(now, now, now),
        origin=origin,
        value=value,
        headers=headers,
        error_type=error_type,
        message=message,
    )


def _lengths(rec: Record) -> tuple[int, int, list[tuple[str, int]]]:
    k = -1 if rec.key is None else len(rec.key)
    return k, -1 if rec.value is None else len(rec.value), ws.lens(rec.headers)


def retry_len(rec: Record, offset: int) -> int:
    """The size of the retry record a worker makes of ``rec`` (at ``offset``) when its
    doomed job's attempt fails."""
    assert rec.sizing is not None
    origin = ws.source(rec.sizing.place.topic(rec.role, rec.tier), rec.partition, offset)
    return _retry_len(*_lengths(rec), rec.sizing, origin)


def dead_letter_of(rec: Record, offset: int, *, retried: bool = True) -> ws.DeadLetterSize | None:
    """The dead letter a worker makes of ``rec`` (at ``offset``) when its failing job's
    attempt fails (None: it is retried instead)."""
    sizing = rec.sizing
    assert sizing is not None
    origin = (sizing.place.topic(rec.role, rec.tier), rec.partition, offset)
    return _dead_letter(*_lengths(rec), sizing, origin, retried=retried)


CUT = "[... "  # the start of the mark in a cut text (docs/wire-format.md#size-budget)
VALUE_REF = "df-value-ref"  # the header of a dead letter that keeps the value by reference


def dead_letter_kept(dead: dict[str, Any]) -> str:
    """What a dead letter (decoded) kept of the job: ``reference`` (its value stays in
    the record that failed), ``texts`` (its error texts were cut) or ``whole``."""
    if VALUE_REF in dead["job_headers"]:
        assert dead["job_value"] == b"", "a dead letter by reference has no value"
        return "reference"
    texts = (dead["traceback"], dead["error_message"], dead["error_type"])
    return "texts" if any(CUT in t for t in texts) or not all(texts) else "whole"


def settle(rec: Record, offset: int) -> Record:
    """The fate of a job record near a size budget, now that it is known to be at
    ``offset`` (``df-src`` and ``df-origin`` name it): docs/wire-format.md#size-budget."""
    sizing = rec.sizing
    if sizing is None:
        return rec
    rec.fate, rec.reasons, rec.fields, rec.not_before = sizing.fate
    rec.runs, rec.message, rec.cut = 0, "", None
    k, v, h = _lengths(rec)
    if ws.record_len(k, v, h) > ws.TOPIC_MAX_BYTES:  # the timer topic, exec topic, tiers
        rec.fate, rec.reasons, rec.fields = "refused", frozenset(), frozenset()
        return rec
    if rec.role == "timer":
        if rec.fate in ("quarantine", "parked"):
            return rec  # set aside for its headers first, or not fired yet
        src = ws.source(sizing.place.timers, rec.partition, offset)
        if ws.record_len(k, v, ws.fired_headers(h, src=src)) > ws.TOPIC_MAX_BYTES:
            rec.fate, rec.reasons = "quarantine", frozenset({reasons.RECORD_TOO_LARGE})
            rec.fields = frozenset()
        return rec
    if rec.fate != "run" or sizing.task == TASK:
        return rec
    dead = dead_letter_of(rec, offset)
    rec.fate = "dlq"
    if dead is None:  # retried until its attempts are spent
        rec.reasons = frozenset({reasons.EXHAUSTED})
        rec.runs = DOOMED_ATTEMPTS - sizing.attempt + 1
        return rec
    rec.runs = 1
    if sizing.task == PERMANENT:
        rec.reasons = frozenset({reasons.PERMANENT_ERROR})
    else:
        rec.reasons, rec.message = frozenset({reasons.OTHER}), "not retried: "
    rec.cut = dead.verdict(ws.SET_ASIDE_MAX_BYTES)
    return rec


def _other_record(spec: Spec, tok: str) -> Record:
    """Control, schedule and queue registry records."""
    doc = dict(spec.doc or {})
    if spec.role == "control":
        name = f"fuzz-{tok}"  # never the fuzzer's queue: a valid pause must change nothing
        key = {
            "default": f"queue:{name}".encode(),
            "no-queue": b"queue:",
            "not-utf8": b"queue:\xff" + tok.encode(),
        }[spec.key]
        raw: bytes | None
        if spec.value == "tombstone":
            raw = None
        elif spec.value == "not-json":
            raw = b"{pause"
        elif spec.value == "not-utf8":
            raw = b'{"action": "pause", "by": "\xff"}'
        else:
            raw = json.dumps(doc).encode()
        rec = Record("control", "control", 0, 0, key, raw, [], "accepted", tok)
        parsed = None if spec.value in ("not-json", "not-utf8") else doc
        if not _control_ok(key, raw, parsed, name):
            rec.fate = "quarantine"
            rec.reasons = frozenset({reasons.BAD_CONTROL, reasons.FIELD_OUT_OF_RANGE})
        return rec
    if spec.role == "schedule":
        # For a queue nobody serves: valid ones are quarantined as unknown queue too.
        schedule: dict[str, Any] = {
            "schedule_id": f"fuzz-{tok}",
            "cron": "* * * * *",
            "timezone": "UTC",
            "queue": f"fuzz-{tok}",
            "task": TASK,
            "payload": b"{}",
            "version": 1,
            "created_ms": 1,
            "updated_ms": 1,
            **doc,
        }
        return Record(
            "schedule",
            "schedule",
            0,
            0,
            f"fuzz-{tok}".encode(),
            None,
            [],
            "quarantine",
            tok,
            reasons=frozenset(
                {reasons.UNKNOWN_QUEUE, reasons.UNDECODABLE_SCHEDULE, reasons.SCHEDULE_KEY_MISMATCH}
            ),
            doc=schedule,
        )
    registry: dict[str, Any] = {
        "name": f"fuzz-{tok}",
        "partitions": 1,
        "retry_tiers_ms": [200],
        "idempotency_retention_ms": 1_000,
        "rate_limit_per_s": None,
        "created_ms": 1,
        "created_by": "fuzz",
        **doc,
    }
    return Record(
        "queue",
        "queue",
        0,
        0,
        f"fuzz-{tok}".encode(),
        None,
        [],
        "quarantine",
        tok,
        reasons=frozenset({reasons.BAD_QUEUE_RECORD}),
        doc=registry,
    )


def _control_ok(key: Any, raw: bytes | None, doc: dict[str, Any] | None, name: str) -> bool:
    if key != f"queue:{name}".encode():
        return False
    if raw is None:
        return True
    if doc is None:
        return False
    if doc.get("action") not in ("pause", "resume"):
        return False
    at = doc.get("at_ms", 0)
    if type(at) is not int or not MIN_TIME <= at <= MAX_DUE:
        return False
    by, why = doc.get("by", ""), doc.get("reason", "")
    return (
        isinstance(by, str) and len(by) <= NAME_CHARS and isinstance(why, str) and len(why) <= 1000
    )
