"""Why a record was set aside: the stable reasons of dead letters and of quarantined records.

Both sets are part of the wire contract: ``docs/wire-format.md`` lists them and
``tests/unit/test_reasons.py`` checks that list against these tuples.

- A dead letter's ``reason`` (``DeadLetter.reason``, written by the worker) is
  exactly one of :data:`DEAD_LETTER_REASONS`.
- A quarantined record's ``reason`` (``Quarantined.reason``) is one of
  :data:`QUARANTINE_REASONS`, alone or followed by ``": "`` and a detail for
  people (the bad value, the decoder's message). Match on the part before the
  first ``": "`` (:func:`reason_label`): it is also the ``reason`` label of
  ``dueflow_quarantined_total``.
"""

from __future__ import annotations

# --------------------------------------------------------------- dead letters
EXHAUSTED = "exhausted"  # every attempt failed (retriable failures)
PERMANENT_ERROR = "permanent_error"  # the handler raised a permanent error
UNKNOWN_TASK = "unknown_task"  # no handler for the task in the worker
UNDECODABLE = "undecodable"  # the record's value (or its payload) does not decode
TIMEOUT = "timeout"  # the last attempt ran past its timeout
CONFLICT = "conflict"  # reserved in the schema; not written (the SDK refuses a reused id)
OTHER = "other"  # anything else (a reason this version does not know)
# a header or field of the record is out of its accepted range (DeadLetter version 2)
OUT_OF_RANGE = "out_of_range"

DEAD_LETTER_REASONS = (
    EXHAUSTED,
    PERMANENT_ERROR,
    UNKNOWN_TASK,
    UNDECODABLE,
    TIMEOUT,
    CONFLICT,
    OTHER,
    OUT_OF_RANGE,
)

# ----------------------------------------------------------------- quarantine
# emitter, timer topic (headers only: the emitter never decodes a timer's value)
MISSING_DUE = "missing df-due header"
BAD_DUE = "df-due is not an integer"
DUE_OUT_OF_RANGE = "df-due out of range"  # not a time from the year 1 to 9999
MISSING_QUEUE = "missing df-queue header"
UNKNOWN_QUEUE = "unknown queue"  # also a schedule whose queue is not configured
MISSING_TIMER_KEY = "missing key (the idempotency key)"
UNKNOWN_KIND = "unknown df-kind"
BAD_PARTITION = "bad df-partition"  # not a partition of the queue's exec topic
BAD_CRON_HEADER = "bad cron header"  # df-sv or df-occurrence out of range
# the record it would write (the exec record of a timer, a timer placed again)
# exceeds its topic's max.message.bytes or the producers' message.max.bytes
RECORD_TOO_LARGE = "record too large"
# emitter, schedules topic
SCHEDULE_KEY_NOT_UTF8 = "key is not UTF-8"
MISSING_SCHEDULE_KEY = "missing key (the schedule id)"
UNDECODABLE_SCHEDULE = "undecodable schedule"
SCHEDULE_KEY_MISMATCH = "key is not the schedule id"
# worker: idempotency and control topics
IDEMPOTENCY_WITHOUT_KEY = "idempotency record without a key"
UNDECODABLE_IDEMPOTENCY = "undecodable idempotency record"
BAD_CONTROL = "bad control record"
# worker (idempotency, control), status view (outcomes): a field decodes but is
# outside its accepted range (docs/wire-format.md#accepted-ranges)
FIELD_OUT_OF_RANGE = "field out of range"
# worker: commands in the exec topic, its own steering topic
UNDECODABLE_COMMAND = "undecodable command"
UNDECODABLE_STEERING = "undecodable steering state"
# emitter (the active one): queue registry topic
BAD_QUEUE_RECORD = "bad queue registry record"
# status view: outcomes topic
UNDECODABLE_OUTCOME = "undecodable outcome"

QUARANTINE_REASONS = (
    MISSING_DUE,
    BAD_DUE,
    DUE_OUT_OF_RANGE,
    MISSING_QUEUE,
    UNKNOWN_QUEUE,
    MISSING_TIMER_KEY,
    UNKNOWN_KIND,
    BAD_PARTITION,
    BAD_CRON_HEADER,
    RECORD_TOO_LARGE,
    SCHEDULE_KEY_NOT_UTF8,
    MISSING_SCHEDULE_KEY,
    UNDECODABLE_SCHEDULE,
    SCHEDULE_KEY_MISMATCH,
    IDEMPOTENCY_WITHOUT_KEY,
    UNDECODABLE_IDEMPOTENCY,
    BAD_CONTROL,
    FIELD_OUT_OF_RANGE,
    UNDECODABLE_COMMAND,
    UNDECODABLE_STEERING,
    BAD_QUEUE_RECORD,
    UNDECODABLE_OUTCOME,
)


def with_detail(reason: str, detail: object) -> str:
    """A quarantine reason text: ``reason`` (one of :data:`QUARANTINE_REASONS`) and a
    detail for people."""
    return f"{reason}: {detail}"


def reason_label(text: str) -> str:
    """The stable reason of a quarantine reason text (the part before the first ``": "``)."""
    return text.partition(": ")[0].strip()[:60] or "unknown"
