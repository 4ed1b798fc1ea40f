"""Unique and debounced jobs: the admit rule of a unique key's partition owner (pure).

A job scheduled with a unique key is not written by the client: the client
appends an ``admit`` command (the whole job and the key's options) to the
exec partition the unique key hashes to, and the worker that owns that
partition decides, in offset order, with :func:`admit`. It keeps one
:class:`~dueflow.steering_model.UniqueEntry` per key (in the steering topic,
written in the transaction that applies the command), so every contender for
a key is judged by one writer, one after the other, exactly once through any
failover.

How long a key is *held* by the job admitted under it (:func:`holds`):

- a window (``window_ms``): from the admission (the owner's clock) until the
  window has passed, whatever the job does (throttling);
- no window, ``until="end"``: until the job ends (succeeded, dead,
  cancelled, expired);
- no window, ``until="start"``: until the job starts (its first attempt).

A request while the key is held gets ``on_duplicate``:

- ``return`` / ``refuse``: nothing is written; the answer names the held job
  (the client returns its id, or raises);
- ``replace``: the held job, if it has not started, is replaced by the new
  request (its payload and due time; the job keeps its id): a debounce; with
  ``extend`` its window starts again. If it has started, the request is
  admitted as a new job.

The job's end releases the key (:func:`released`); a window's entry is
removed when the window has passed (:func:`sweep`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from dueflow.steering_model import ORIGINAL, UniqueEntry

UNTIL = ("end", "start")
ON_DUPLICATE = ("return", "refuse", "replace")
# What the owner knows of the held job: not started, started (running, retrying),
# or ended (final, or cancelled by a command).
PENDING = None
STARTED = "started"
ENDED = "ended"

ADMIT = "admit"
DUPLICATE = "duplicate"
REPLACE = "replace"


@dataclass(frozen=True, slots=True)
class UniqueSpec:
    """A unique key and its options (the ``unique`` field of an ``admit`` command)."""

    key: str
    window_ms: int | None = None
    until: str = "end"
    on_duplicate: str = "return"
    extend: bool = False

    @classmethod
    def from_record(cls, rec: Mapping[str, Any]) -> UniqueSpec:
        return cls(
            key=rec["key"],
            window_ms=rec.get("window_ms"),
            until=rec.get("until") or "end",
            on_duplicate=rec.get("on_duplicate") or "return",
            extend=bool(rec.get("extend")),
        )

    def to_record(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "window_ms": self.window_ms,
            "until": self.until,
            "on_duplicate": self.on_duplicate,
            "extend": self.extend,
        }


@dataclass(frozen=True, slots=True)
class Admission:
    """What an ``admit`` command does.

    ``verdict``: :data:`ADMIT` (write the requested job), :data:`DUPLICATE`
    (write nothing; ``first_job_id`` holds the key) or :data:`REPLACE` (replace
    the held job ``first_job_id`` with the request). ``entry``: the key's entry
    after; ``changed``: it is written.
    """

    verdict: str
    entry: UniqueEntry | None
    changed: bool
    first_job_id: str | None = None


def holds(entry: UniqueEntry | None, *, first: str | None, now_ms: int) -> bool:
    """Whether ``entry``'s job holds its key at ``now_ms``; ``first``: what the owner
    knows of that job (:data:`PENDING`, :data:`STARTED`, :data:`ENDED`)."""
    if entry is None:
        return False
    if entry.window_until_ms is not None:
        return now_ms < entry.window_until_ms
    if first == ENDED or entry.state == "ended":
        return False
    return not (entry.until == "start" and (first == STARTED or entry.state == "started"))


def admit(
    entry: UniqueEntry | None,
    *,
    spec: UniqueSpec,
    job_id: str,
    idempotency_key: str,
    first: str | None,
    now_ms: int,
    token: str,
) -> Admission:
    """The verdict on a request for job ``job_id`` (key ``idempotency_key``) under
    ``spec.key``, whose entry is ``entry`` (None: none kept); ``first``: what the
    owner knows of the entry's job; ``token``: the command's id (the version of
    a timer a replace writes)."""
    if entry is not None and entry.job_id == job_id:
        # The same job asked again (a client that retried): it is the held one.
        return Admission(DUPLICATE, entry, False, first_job_id=job_id)
    if holds(entry, first=first, now_ms=now_ms):
        assert entry is not None
        if spec.on_duplicate != REPLACE:
            return Admission(DUPLICATE, entry, False, first_job_id=entry.job_id)
        if first is PENDING:
            window = entry.window_until_ms
            if spec.extend and spec.window_ms is not None:
                window = now_ms + spec.window_ms
            after = replace(entry, version=token, window_until_ms=window)
            return Admission(REPLACE, after, True, first_job_id=entry.job_id)
        # replace, but the held job has started: the request is a new job
    new = UniqueEntry(
        unique_key=spec.key,
        job_id=job_id,
        idempotency_key=idempotency_key,
        window_until_ms=None if spec.window_ms is None else now_ms + spec.window_ms,
        until=spec.until,
        state="pending",
        version=ORIGINAL,
    )
    return Admission(ADMIT, new, True)


def released(entry: UniqueEntry, *, job_id: str) -> tuple[UniqueEntry | None, bool]:
    """The entry after job ``job_id`` ended (and whether it changed): removed, or for a
    window kept (``ended``) until the window has passed. The end of another job (one
    whose key was taken over since) changes nothing."""
    if entry.job_id != job_id:
        return entry, False
    if entry.window_until_ms is None:
        return None, True
    if entry.state == "ended":
        return entry, False
    return replace(entry, state="ended"), True


def sweep(entry: UniqueEntry, *, now_ms: int) -> tuple[UniqueEntry | None, bool]:
    """The entry after its window has passed: removed (its job, if still pending, runs
    as any job; a later request is admitted)."""
    if entry.window_until_ms is not None and now_ms >= entry.window_until_ms:
        return None, True
    return entry, False


def sweep_due(entry: UniqueEntry) -> int | None:
    """When :func:`sweep` removes ``entry`` (None: only its job's end does)."""
    return entry.window_until_ms
