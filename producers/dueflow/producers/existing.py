"""A job id that already exists in the cluster: the same job again, or a conflict (pure).

The scheduling client remembers the jobs it scheduled itself
(:mod:`dueflow.producers.recent`); a job id scheduled by another process, or by
this one before its memory let go of it, is known only to the cluster. With
``Scheduler(check_existing_ids=True)`` (what ``dueflow schedule --job-id`` uses)
a job with an explicit id is looked up by its outcomes first
(:mod:`dueflow.producers.lookup`) and :func:`existing_job` decides:

- no outcome of the id: a new job, written;
- its ``scheduled`` outcome carries a content hash (the ``df-content-hash``
  header, written by this client and ``schedule_many``): the same hash is the
  same job again (the earlier job is returned, ``duplicate=True``, nothing is
  written); another hash is a :class:`~dueflow.errors.ConflictError`;
- no hash is known (a job scheduled by a client that does not write it, with
  ``scheduled_outcomes=False``, a follow-up or a cron occurrence, or one whose
  ``scheduled`` outcome is older than the lookup's window): another task is a
  conflict; the same task cannot be compared further and counts as the same
  job again (nothing is written: a worker would skip it as a duplicate of the
  earlier one anyway when the key is the same).
"""

from __future__ import annotations

from dueflow.errors import ConflictError
from dueflow.producers.results import Scheduled
from dueflow.rules.job_status import JobStatus

ACCEPTED = "accepted: a new job id, or the same task and payload to repeat the job idempotently"


def existing_job(found: JobStatus | None, *, content_hash: str, task: str) -> Scheduled | None:
    """What to do with a new job whose id ``found`` already has outcomes: ``None``
    (no outcome: write it), the earlier job (``duplicate=True``: write nothing), or
    :class:`ConflictError` naming both contents."""
    if found is None:
        return None
    known = found.content_hash
    same = known == content_hash if known is not None else found.task == task
    if not same:
        earlier = f"task {found.task!r}" + (f", content hash {known}" if known is not None else "")
        raise ConflictError(
            f"job_id {found.job_id!r} already exists with other content ({earlier}; "
            f"{found.state} in queue {found.queue!r}); now task {task!r}, content hash "
            f"{content_hash}: it was not scheduled again; {ACCEPTED}"
        )
    return Scheduled(
        found.job_id,
        found.due_ms if found.due_ms is not None else 0,
        found.queue,
        found.task,
        found.idempotency_key or found.job_id,
        known or "",
        -1,  # the partition of its timer is not in its outcomes
        duplicate=True,
    )
