"""Domain values of steering: a command about a job, and the state the owner of
the job's exec partition keeps about it (plain data; the wire codecs are
:mod:`dueflow.records.command` and :mod:`dueflow.records.steering_state`, the rule
:mod:`dueflow.rules.steering`)."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any

ORIGINAL = ""  # the version token of the timer the job was scheduled with
ENDS = ("done", "dead", "cancelled", "expired")


@dataclass(frozen=True, slots=True)
class Command:
    """One ``dueflow.Command`` (see the schema for each field)."""

    command_id: str
    op: str
    job_id: str
    idempotency_key: str
    queue: str
    at_ms: int
    by: str | None = None
    expect_version: str | None = None
    known_due_ms: int | None = None
    due_ms: int | None = None
    payload: bytes | None = None
    content_type: str | None = None
    job: bytes | None = None
    job_schema: str | None = None
    unique: dict[str, Any] | None = None
    group: dict[str, Any] | None = None
    member: dict[str, Any] | None = None

    def to_record(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_record(cls, rec: dict[str, Any]) -> Command:
        values: dict[str, Any] = {f.name: rec.get(f.name) for f in fields(cls)}
        return cls(**values)


@dataclass(frozen=True, slots=True)
class Outstanding:
    """A timer of the job still in the wheel: its version token and due time."""

    token: str
    due_ms: int | None


@dataclass(frozen=True, slots=True)
class Patch:
    """A move or payload update to apply when the current timer fires."""

    token: str  # the token of the timer it makes: the id of the latest command in it
    due_ms: int | None  # None: the current due time
    payload: bytes | None  # None: unchanged
    content_type: str | None  # None: unchanged
    command_id: str


@dataclass(frozen=True, slots=True)
class JobSteering:
    """The steering state of one job (its idempotency key)."""

    job_id: str
    idempotency_key: str
    current: str = ORIGINAL
    current_due_ms: int | None = None
    cancelled: bool = False
    ended: str | None = None  # one of ENDS
    outstanding: tuple[Outstanding, ...] = ()
    patch: Patch | None = None
    exec_partition: int = -1
    last_command_id: str | None = None
    updated_ms: int = 0

    @property
    def version(self) -> str:
        """The version a client sees: the pending patch's token, else the current one."""
        return self.patch.token if self.patch is not None else self.current

    @property
    def tokens(self) -> frozenset[str]:
        return frozenset(o.token for o in self.outstanding)


@dataclass(frozen=True, slots=True)
class UniqueEntry:
    """What the owner of a unique key's exec partition keeps about the key: the job
    admitted under it and how long it holds the key (``dueflow.rules.unique``)."""

    unique_key: str
    job_id: str  # the admitted job: a duplicate gets its id
    idempotency_key: str
    window_until_ms: int | None  # a window: held until then (owner's clock); None: see until
    until: str = "end"  # without a window: held until the job ends ("end") or starts ("start")
    state: str = "pending"  # pending | started | ended
    version: str = ORIGINAL  # the version token of the admitted job's current timer
