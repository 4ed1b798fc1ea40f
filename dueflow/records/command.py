"""Command records: a request about a job to the worker that owns its exec partition (pure).

A client never changes state that other processes read. To cancel, move or
update a job it appends a *command* to the job's exec partition
(``<prefix>.exec.<queue>``); the worker that owns that partition applies it
in offset order, before it judges any record behind it, and answers with an
outcome carrying the command's id (docs/wire-format.md, "Steering a job"):

- key: the job's idempotency key followed by :data:`MARK` (never a job's
  key: a worker of a release before commands dead-letters the record under
  a key no job has, and the job is untouched);
- value: Avro ``dueflow.Command`` (``schemas/dueflow/schemas/command.avsc``);
- headers: ``df-kind`` (``steer`` for cancel/move/patch/replace), ``df-due``
  ``0`` (never held), ``df-job``, ``df-queue``, ``df-schema``;
- partition: explicit, the job's exec partition (murmur2 of its idempotency
  key, as the emitter's exec records).

:func:`check_command` is the rule every door applies (the SDK before writing,
the worker before applying): it names the field, the value and what is
accepted.
"""

from __future__ import annotations

from dueflow import headers as hdr
from dueflow.errors import InvalidInput, UndecodableRecord
from dueflow.records import codec
from dueflow.records.job_request import MAX_DUE_MS, MAX_NAME_CHARS, check_name
from dueflow.rules.unique import ON_DUPLICATE, UNTIL
from dueflow.steering_model import Command

__all__ = ["Command"]

# Appended to the target key to make a command record's Kafka key.
MARK = b"\x00cmd"
OPS = (
    "cancel",
    "move",
    "patch",
    "replace",
    "admit",
    "group_open",
    "group_add",
    "group_seal",
    "member_ended",
)
STEER_OPS = frozenset({"cancel", "move", "patch", "replace"})
_KIND_OF = {
    "cancel": hdr.KIND_STEER,
    "move": hdr.KIND_STEER,
    "patch": hdr.KIND_STEER,
    "replace": hdr.KIND_STEER,
    "admit": hdr.KIND_ADMIT,
    "group_open": hdr.KIND_GROUP,
    "group_add": hdr.KIND_GROUP,
    "group_seal": hdr.KIND_GROUP,
    "member_ended": hdr.KIND_MEMBER_ENDED,
}
SCHEMA = codec.schema_header("command", 1)
# Room kept in a timer record for the rest of the job and its headers when a
# command's payload (or whole job) is written into one by the owner.
TIMER_HEADROOM = 16 * 1024
MAX_COMMAND_ID_CHARS = 64


def command_key(key: bytes) -> bytes:
    """The Kafka key of a command about idempotency key ``key``."""
    return key + MARK


def target_of(record_key: bytes | None) -> bytes | None:
    """The key a command record is about (its key without :data:`MARK`); None when the
    key is not a command's."""
    if record_key is None or not record_key.endswith(MARK):
        return None
    return record_key[: -len(MARK)]


def kind_of(op: str) -> str:
    """The ``df-kind`` of a command with ``op``."""
    return _KIND_OF[op]


def command_headers(cmd: Command) -> list[tuple[str, bytes]]:
    """The headers of a command record."""
    return [
        (hdr.KIND, kind_of(cmd.op).encode()),
        (hdr.DUE, b"0"),
        (hdr.JOB_ID, cmd.job_id.encode()),
        (hdr.QUEUE, cmd.queue.encode()),
        (hdr.SCHEMA, SCHEMA),
    ]


def encode_command(cmd: Command) -> bytes:
    """Avro binary of ``cmd`` (version 1)."""
    return codec.encode("command", cmd.to_record(), version=1)


def decode_command(data: bytes | None, schema: bytes | None) -> Command:
    """The command in a record's value (``schema``: its ``df-schema`` header).

    Raises :class:`UndecodableRecord` when the value is not a ``dueflow.Command``.
    """
    if data is None:
        raise UndecodableRecord("command record without a value")
    version = codec.parse_schema_header(schema, expected="command")
    return Command.from_record(codec.decode("command", data, writer_version=version))


def _text(name: str, value: object, *, limit: int = MAX_NAME_CHARS) -> None:
    if type(value) is not str or not 0 < len(value) <= limit:
        raise InvalidInput(name, value, f"a non-empty string of at most {limit} chars")


def _due(name: str, value: object) -> None:
    if type(value) is not int or not 0 <= value <= MAX_DUE_MS:
        raise InvalidInput(
            name, value, f"UTC epoch milliseconds from 0 to {MAX_DUE_MS} (year 9999)"
        )


def check_command(cmd: Command) -> None:
    """Raise :class:`InvalidInput` naming the first field of ``cmd`` that is not
    accepted for its ``op``."""
    if cmd.op not in OPS:
        raise InvalidInput("op", cmd.op, f"one of {list(OPS)}")
    _text("command_id", cmd.command_id, limit=MAX_COMMAND_ID_CHARS)
    check_name("job_id", cmd.job_id)  # no control characters, as at every door
    check_name("idempotency_key", cmd.idempotency_key)
    check_name("command_id", cmd.command_id)
    _text("queue", cmd.queue)
    if cmd.known_due_ms is not None:
        _due("known_due_ms", cmd.known_due_ms)
    if cmd.expect_version is not None and type(cmd.expect_version) is not str:
        raise InvalidInput("expect_version", cmd.expect_version, "a version token (text)")
    if cmd.op == "move":
        _due("due_ms", cmd.due_ms)
    elif cmd.op == "patch":
        if not isinstance(cmd.payload, bytes):
            raise InvalidInput("payload", cmd.payload, "the new payload (bytes)")
        if cmd.content_type is not None:
            _text("content_type", cmd.content_type)
        if cmd.due_ms is not None:
            _due("due_ms", cmd.due_ms)
    elif cmd.op == "replace":
        if not isinstance(cmd.job, bytes) or not cmd.job:
            raise InvalidInput("job", cmd.job, "a dueflow.Job value (Avro binary)")
        _due("due_ms", cmd.due_ms)
    elif cmd.op == "admit":
        if not isinstance(cmd.job, bytes) or not cmd.job:
            raise InvalidInput("job", cmd.job, "a dueflow.Job value (Avro binary)")
        check_unique(cmd.unique)


# The longest unique window: a window is held in memory by the key's owner until it ends.
MAX_UNIQUE_WINDOW_MS = 366 * 86_400_000


def check_unique(unique: object) -> None:
    """Raise :class:`InvalidInput` naming the first field of an ``admit`` command's
    ``unique`` options that is not accepted."""
    if not isinstance(unique, dict):
        raise InvalidInput("unique", unique, "the unique key and its options (a record)")
    check_name("unique.key", unique.get("key"))
    window = unique.get("window_ms")
    if window is not None and (type(window) is not int or not 0 < window <= MAX_UNIQUE_WINDOW_MS):
        raise InvalidInput(
            "unique.window_ms",
            window,
            f"null (until the job ends or starts) or milliseconds from 1 to "
            f"{MAX_UNIQUE_WINDOW_MS} (366 days)",
        )
    if unique.get("until", "end") not in UNTIL:
        raise InvalidInput("unique.until", unique.get("until"), f"one of {list(UNTIL)}")
    if unique.get("on_duplicate", "return") not in ON_DUPLICATE:
        raise InvalidInput(
            "unique.on_duplicate", unique.get("on_duplicate"), f"one of {list(ON_DUPLICATE)}"
        )
