"""Rescheduling a pending job: the rule, and the record that carries it (pure).

Kafka cannot take a timer back out of the wheel, so a reschedule adds
instead of moving: ``Scheduler.reschedule(job_id, run_at=D)`` writes

1. a new timer for the same job (same job id, same idempotency key, the
   same value but ``due_ms = D``), then
2. a *reschedule record* in the job's ``<prefix>.idempotency.<queue>``
   partition: "of the deliveries of this key, only the one due at D runs"
   (``run_only_due_ms = D``, schema version 3), and
3. an outcome ``rescheduled`` (due D) for the status view.

The rule workers apply to every delivery of a key, in this order:

- the key is final (done, dead, cancelled): skipped, as before (``duplicate``
  / ``cancelled``). A final state always wins over a reschedule, whatever the
  order the two were written in;
- the key has a reschedule to D and the delivery's job is not due at D (the
  old timer, or the timer of an earlier reschedule): skipped, outcome
  ``rescheduled`` (nothing is marked final: the job is still to run);
- otherwise it runs (the delivery due at D, its retries, or any delivery of
  a key without a reschedule).

So the job never runs at its old time once the record has reached the
worker, and never twice: whichever delivery runs first marks the key done,
and every other one is then a duplicate. A second reschedule (to E)
supersedes the first (the latest reschedule record wins): the timers due
at the old time and at D are skipped, the one at E runs. The races, all at
most once:

- the job ran (or started) before the reschedule reached its worker: it ran
  at its old time, once; the new timer is skipped as a duplicate (its key is
  done). ``reschedule`` refuses a job whose outcomes say it has started or
  finished, and reports such a race it can see;
- the client dies between (1) and (2): two timers, no reschedule record; the
  first delivery runs, the second is a duplicate (``reschedule`` raised: it
  may be called again).

A reschedule record is keyed by the job's key plus :data:`MARK`, on the
key's partition (explicitly): a key of its own, so compaction keeps it
beside the key's final state instead of replacing it. Workers keep it for
the queue's idempotency retention after it was written, like every record
of that topic; ``reschedule`` therefore refuses a job whose current due time
is further away than that (less an hour). Workers of a release before
reschedules quarantine the record (schema version 3), so there the job runs
at its old time and the new timer is a duplicate: still at most once.
"""

from __future__ import annotations

# Appended to the idempotency key to make the Kafka key of its reschedule record.
MARK = b"\x00reschedule"


def reschedule_key(key: bytes) -> bytes:
    """The Kafka key of the reschedule record of idempotency key ``key``."""
    return key + MARK


def key_of(record_key: bytes) -> bytes | None:
    """The idempotency key a reschedule record is about; None for any other record."""
    if record_key.endswith(MARK):
        return record_key[: -len(MARK)]
    return None


def superseded(run_only_due_ms: int | None, job_due_ms: int) -> bool:
    """True when a reschedule (to ``run_only_due_ms``) says a delivery of a job due at
    ``job_due_ms`` must not run."""
    return run_only_due_ms is not None and job_due_ms != run_only_due_ms
