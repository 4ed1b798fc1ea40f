"""A job's payload as bytes: JSON or raw, and the content hash of what a job does (pure).

:func:`encode_payload` turns the caller's ``payload`` into the bytes and content
type a job carries: ``bytes`` as is (``application/octet-stream``), anything
else as JSON with sorted keys. JSON has no NaN or Infinity (orjson would write
them as ``null``), so a payload holding one is refused with the path to it
(:func:`check_finite`). :func:`content_hash` is the stable hash of what a job
does: its task, payload bytes and content type.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from enum import Enum
from typing import Any

import orjson

from dueflow.errors import InvalidInput

JSON = "application/json"
OCTET_STREAM = "application/octet-stream"


def encode_payload(payload: Any) -> tuple[bytes, str]:
    """Payload bytes and content type: bytes as is, anything else as JSON (sorted keys).

    A NaN or infinite float anywhere in it is refused (:func:`check_finite`)."""
    if isinstance(payload, bytes):
        return payload, OCTET_STREAM
    if isinstance(payload, bytearray | memoryview):
        return bytes(payload), OCTET_STREAM
    try:
        raw = orjson.dumps(payload, option=orjson.OPT_SORT_KEYS)
    except (TypeError, orjson.JSONEncodeError) as exc:
        raise bad_payload(payload, exc) from None
    if b"null" in raw:  # orjson writes NaN and Infinity as null: look only then
        check_finite(payload)
    return raw, JSON


NON_FINITE_ACCEPTED = (
    "a finite number: JSON has no NaN or Infinity (they would be written as null); "
    "send null or a string instead"
)


def check_finite(payload: Any) -> None:
    """Raise :class:`InvalidInput` naming the path (``payload['a'][2]``) of the first
    NaN or infinite float in ``payload``, looking where orjson does: dicts, lists,
    tuples, dataclasses and enum values."""
    found = _non_finite(payload)
    if found is not None:
        steps, value = found
        path = "payload" + "".join(
            f".{s}" if isinstance(s, _Attribute) else f"[{s!r}]" for s in reversed(steps)
        )
        raise InvalidInput(path, value, NON_FINITE_ACCEPTED)


class _Attribute(str):
    """A step into a dataclass field (shown ``.name``; a dict key is ``['name']``)."""

    __slots__ = ()


def _non_finite(value: Any) -> tuple[list[object], float] | None:
    """(steps from the hit up to the top, the value) of the first non-finite float."""
    if isinstance(value, float):
        return None if math.isfinite(value) else ([], value)
    items: Any
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list | tuple):
        items = enumerate(value)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        items = ((_Attribute(f.name), getattr(value, f.name)) for f in dataclasses.fields(value))
    elif isinstance(value, Enum):
        return _non_finite(value.value)
    else:
        return None
    for step, item in items:
        found = _non_finite(item)
        if found is not None:
            found[0].append(step)
            return found
    return None


def bad_payload(payload: Any, exc: Exception) -> InvalidInput:
    """The error for a payload that JSON cannot encode (``exc`` says why)."""
    return InvalidInput(
        "payload",
        f"<{type(payload).__name__}: {exc}>",
        "a JSON-serializable value (dict, list, str, number, bool, None) or bytes",
    )


def content_hash(task: str, payload: bytes, content_type: str) -> str:
    """Stable hash of what a job does: task, payload bytes and content type (32 hex)."""
    head = b"%s\0%s\0" % (task.encode(), content_type.encode())
    return hashlib.blake2b(head + payload, digest_size=16).hexdigest()


def content_hash_prefix(task: str, content_type: str) -> hashlib.blake2b:
    """A hasher holding what :func:`content_hash` hashes before the payload: a copy
    of it, updated with the payload, gives the same hex digest."""
    return hashlib.blake2b(b"%s\0%s\0" % (task.encode(), content_type.encode()), digest_size=16)
