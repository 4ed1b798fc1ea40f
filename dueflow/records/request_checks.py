"""The checks of the fields of a job as a caller gives them (pure).

Each turns one field into the value a job carries, or raises
:class:`~dueflow.errors.InvalidInput` naming the field, the value and what is
accepted: backoff (:func:`parse_backoff`), names (job ids, idempotency keys,
schedule ids, label keys: :func:`check_name`), labels (:func:`check_labels`),
due times (:func:`due_of`, :func:`due_after`) and timeouts
(:func:`parse_timeout`); and the errors for a task, queue or attempt count
that is refused (:func:`bad_task`, :func:`unknown_task`, :func:`unknown_queue`,
:func:`bad_attempts`).

Limits, so that every accepted job can be encoded and read back: a due time
(``run_at``, ``now + delay``, plus the jitter window) at or before
9999-12-31T23:59:59.999Z, the last instant a :class:`~datetime.datetime`
holds (:data:`~dueflow.rules.wire_bounds.MAX_DUE_MS`); timeouts and backoff
times up to an Avro long; ``max_attempts`` up to an Avro int; names of at most
:data:`~dueflow.rules.wire_bounds.MAX_NAME_CHARS` characters; task names by the
workers' rule (:mod:`dueflow.task_name`).
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from typing import Any

from dueflow.control_chars import CONTROL_CHARS_TEXT, has_control
from dueflow.errors import InvalidInput, UnknownQueue
from dueflow.model import Backoff, BackoffKind
from dueflow.rules.wire_bounds import MAX_DUE_MS, MAX_INT32, MAX_LONG, MAX_NAME_CHARS
from dueflow.task_name import TASK_NAME_ACCEPTED
from dueflow.timeutil import format_utc, parse_duration, to_utc_ms

Instant = datetime | str
Duration = timedelta | float | int | str
BackoffSpec = Backoff | str | Mapping[str, Any]


_BACKOFF_ACCEPTED = (
    "exponential, fixed or none, optionally with :BASE[:MAX] (milliseconds or durations, "
    "e.g. exponential:500:60000 or fixed:10s), a dict with kind/base_ms/max_ms/multiplier/"
    "jitter, or a dueflow.model.Backoff"
)


def parse_backoff(value: Backoff | str | Mapping[str, Any] | None) -> Backoff | None:
    """A valid :class:`Backoff` (or ``None``: the queue's retry tiers)."""
    if value is None:
        return None
    if isinstance(value, Backoff):
        backoff = value
    elif isinstance(value, str):
        backoff = _backoff_from_text(value)
    elif isinstance(value, Mapping):
        unknown = set(value) - {"kind", "base_ms", "max_ms", "multiplier", "jitter"}
        if unknown or "kind" not in value:
            raise InvalidInput("backoff", dict(value), _BACKOFF_ACCEPTED)
        try:
            kind = BackoffKind(value["kind"])
        except ValueError:
            raise InvalidInput("backoff", dict(value), _BACKOFF_ACCEPTED) from None
        defaults = Backoff(kind)
        backoff = Backoff(
            kind,
            base_ms=value.get("base_ms", defaults.base_ms),
            max_ms=value.get("max_ms", defaults.max_ms),
            multiplier=value.get("multiplier", defaults.multiplier),
            jitter=value.get("jitter", defaults.jitter),
        )
    else:
        raise InvalidInput("backoff", value, _BACKOFF_ACCEPTED)
    return _checked_backoff(backoff, value)


def _backoff_from_text(text: str) -> Backoff:
    parts = text.strip().lower().split(":")
    try:
        kind = BackoffKind(parts[0])
    except ValueError:
        raise InvalidInput("backoff", text, _BACKOFF_ACCEPTED) from None
    if len(parts) > 3:
        raise InvalidInput("backoff", text, _BACKOFF_ACCEPTED)
    times = [_backoff_ms(p, text) for p in parts[1:]]
    base = times[0] if times else Backoff().base_ms
    top = times[1] if len(times) > 1 else max(Backoff().max_ms, base)
    return Backoff(kind, base_ms=base, max_ms=top)


def _backoff_ms(part: str, text: str) -> int:
    if part.isdigit():
        return int(part)
    try:
        return parse_duration(part, field="backoff")
    except InvalidInput:
        raise InvalidInput("backoff", text, _BACKOFF_ACCEPTED) from None


def _checked_backoff(b: Backoff, shown: object) -> Backoff:
    if not isinstance(b.kind, BackoffKind):
        raise InvalidInput("backoff", shown, _BACKOFF_ACCEPTED)
    for name in ("base_ms", "max_ms"):
        v = getattr(b, name)
        if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= MAX_LONG:
            raise InvalidInput(
                f"backoff.{name}", v, f"an integer number of milliseconds from 0 to {MAX_LONG}"
            )
    if b.max_ms < b.base_ms:
        raise InvalidInput("backoff.max_ms", b.max_ms, f">= base_ms ({b.base_ms})")
    if not isinstance(b.multiplier, int | float) or not 1.0 <= b.multiplier <= 1000.0:
        raise InvalidInput("backoff.multiplier", b.multiplier, "a number from 1 to 1000")
    if not isinstance(b.jitter, bool):
        raise InvalidInput("backoff.jitter", b.jitter, "true or false")
    return b


NAME_ACCEPTED = (
    f"a non-empty string of at most {MAX_NAME_CHARS} chars (valid UTF-8), " + CONTROL_CHARS_TEXT
)


def is_name(value: object) -> bool:
    """Whether ``value`` is a usable job id, idempotency key, schedule id or label key:
    1 to 255 characters that UTF-8 can encode (no lone surrogates), none of them a
    control character (:data:`~dueflow.control_chars.CONTROL_CHARS`)."""
    if type(value) is not str or not 0 < len(value) <= MAX_NAME_CHARS:
        return False
    if value.isascii():
        return value.isprintable()  # ASCII: printable is "no C0, no DEL"
    return _utf8(value) and not has_control(value)


def _utf8(value: str) -> bool:
    try:
        value.encode()
    except UnicodeEncodeError:
        return False
    return True


def bad_name(field: str, value: object) -> InvalidInput:
    """The error for a job id, key or schedule id that is not a usable name (the
    message shows the value with its control characters escaped)."""
    return InvalidInput(field, value, NAME_ACCEPTED)


def check_name(field: str, value: object) -> str:
    """``value`` when it is a usable name (:func:`is_name`), else :func:`bad_name`."""
    if not is_name(value):
        raise bad_name(field, value)
    return value  # type: ignore[return-value]


def bad_task(value: object) -> InvalidInput:
    """The error for a task name a worker would not accept (:mod:`dueflow.task_name`)."""
    return InvalidInput("task", value, TASK_NAME_ACCEPTED)


def unknown_task(task: str, known: Iterable[str]) -> InvalidInput:
    """The error for a task the producer's app does not declare (:meth:`JobRules.check_task`)."""
    names = sorted(known)
    shown = ", ".join(repr(n) for n in names[:10]) + (", ..." if len(names) > 10 else "")
    close = difflib.get_close_matches(task, names, n=1, cutoff=0.6)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    return InvalidInput(
        "task",
        task,
        f"a task of the app ({shown}) or one the route table names "
        f"([routes], DUEFLOW_ROUTES){hint}",
    )


def due_too_late(field: str, value: object, *, now_ms: int) -> InvalidInput:
    """The error for a ``run_at`` or ``delay`` whose due time is after :data:`MAX_DUE_MS`."""
    if field == "delay":
        accepted = (
            f"a duration putting the due time at or before {format_utc(MAX_DUE_MS)} "
            f"(at most {MAX_DUE_MS - now_ms} ms from now)"
        )
    else:
        accepted = f"a time at or before {format_utc(MAX_DUE_MS)}"
    return InvalidInput(field, value, accepted)


def unknown_queue(queue: object, queues: frozenset[str]) -> UnknownQueue:
    """The error for a queue nobody knows: names it and says how to create it."""
    return UnknownQueue(queue, queues)


def bad_attempts(value: object) -> InvalidInput:
    return InvalidInput("max_attempts", value, f"an integer from 1 to {MAX_INT32}")


def due_of(
    run_at: Instant | None, delay: Duration | None, *, now_ms: int, required: bool = False
) -> int:
    """The due time ``run_at``, ``now + delay``, or ``now`` (``required``: one of them must
    be given); :class:`InvalidInput` names the field."""
    if run_at is not None:
        if delay is not None:
            raise InvalidInput("delay", delay, "either run_at or delay, not both")
        due_ms = to_utc_ms(run_at, field="run_at")
        if due_ms > MAX_DUE_MS:
            raise due_too_late("run_at", run_at, now_ms=now_ms)
        return due_ms
    if delay is None:
        if required:
            raise InvalidInput("run_at", None, "the new due time: run_at= or delay=")
        return now_ms
    return due_after(delay, now_ms=now_ms)


def due_after(delay: Duration, *, now_ms: int) -> int:
    """The due time ``now + delay`` (whole seconds as an int, the fast case);
    :class:`InvalidInput` names ``delay`` when it is no duration or lands after
    :data:`MAX_DUE_MS`."""
    if type(delay) is int and delay >= 0:
        due_ms = now_ms + delay * 1000
    else:
        due_ms = now_ms + parse_duration(delay, field="delay")
    if due_ms > MAX_DUE_MS:
        raise due_too_late("delay", delay, now_ms=now_ms)
    return due_ms


TIMEOUT_ACCEPTED = f"a duration of at least 1 ms and at most {MAX_LONG} ms, or None"


def parse_timeout(value: Duration | None) -> int | None:
    """A job's ``timeout`` in ms (``None``: the worker's default); 1 ms to an Avro long."""
    if value is None:
        return None
    ms = parse_duration(value, field="timeout")
    if not 1 <= ms <= MAX_LONG:
        raise InvalidInput("timeout", value, TIMEOUT_ACCEPTED)
    return ms


def check_labels(value: Mapping[str, str]) -> Mapping[str, str]:
    """A job's ``labels``: a dict of names (:func:`is_name`) to strings (valid UTF-8),
    sorted by key; :class:`InvalidInput` names ``labels`` or the bad key."""
    if not isinstance(value, Mapping) or not all(
        isinstance(k, str) and isinstance(v, str) and _utf8(k) and _utf8(v)
        for k, v in value.items()
    ):
        raise InvalidInput("labels", value, "a dict of strings to strings (valid UTF-8)")
    for key in value:
        check_name(f"labels[{key!r}]", key)
    # Sorted by key (code points: UTF-8 byte order), so that equal labels are
    # equal bytes whatever order the caller's map has; every client does the same.
    return dict(sorted(value.items()))
