"""The ``df-schema`` headers of the records a worker handles, and their state symbols.

A Job, Outcome or IdempotencyRecord value is sent with the header naming its
schema and version; the hand-written codec (:mod:`dueflow.records.worker_codec`)
reads and writes the versions named here. An Avro enum is written as the index
of its symbol: :data:`JOB_STATES` (an Outcome's ``state``) and
:data:`KEY_STATES` (an IdempotencyRecord's ``state``) are those symbols in
schema order.
"""

from __future__ import annotations

from dueflow.rules.job_state import OUTCOME_STATES, OUTCOME_STATES_V1, OUTCOME_STATES_V2

JOB_V1 = b"dueflow.Job/1"
OUTCOME_V1 = b"dueflow.Outcome/1"
OUTCOME_V2 = b"dueflow.Outcome/2"  # adds the states rescheduled, expired, skipped
# adds the states updated, refused, deduplicated and the fields after schedule_id
OUTCOME_V3 = b"dueflow.Outcome/3"
IDEMPOTENCY_V1 = b"dueflow.IdempotencyRecord/1"
# Version 2 added the state `retrying` (the same bytes as version 1 otherwise).
IDEMPOTENCY_V2 = b"dueflow.IdempotencyRecord/2"

JOB_STATES = OUTCOME_STATES  # the outcome schema's `state` symbols, by index
V2_STATES = frozenset(OUTCOME_STATES_V2[len(OUTCOME_STATES_V1) :])
V3_STATES = frozenset(OUTCOME_STATES[len(OUTCOME_STATES_V2) :])
KEY_STATES = ("done", "dead", "cancelled", "retrying")
KEY_STATES_V1 = KEY_STATES[:3]
