"""What a cron occurrence does while the previous one still runs (pure).

A schedule's ``overlap`` policy:

- ``allow`` (default): occurrences run independently, as before;
- ``skip``: an occurrence that comes while an occurrence of the same schedule
  is running is not run: outcome ``skipped`` (its key is marked final, so a
  redelivery is not run later either);
- ``buffer_one``: it waits until the running one has finished, then runs; at
  most one waits: a further one that comes meanwhile is skipped.

(Temporal's ``ALLOW_ALL``, ``SKIP`` and ``BUFFER_ONE``.) "Running" means an
attempt is executing: an occurrence waiting in a retry tier for its next
attempt is not running.

Where it is decided: on the worker, where running attempts are known. Every
occurrence of a schedule with a policy other than ``allow`` is fired by the
emitter to one exec partition, the one its schedule id hashes to
(:func:`exec_partition`), instead of the one its own key (``<schedule
id>@<occurrence>``) hashes to; one worker owns that partition, so it sees
every occurrence of the schedule, and the co-partitioned records of the
occurrence (idempotency state, retries, dead letter) follow on that partition
as for any job. The occurrence carries the policy in its ``df-overlap`` header.
Cancelling an occurrence writes to both partitions (``dueflow.producers.cancel``).
"""

from __future__ import annotations

from enum import Enum, StrEnum

from dueflow.rules.partitioning import partition_for_key


class OverlapPolicy(StrEnum):
    """What a schedule's occurrence does while the previous one is running."""

    ALLOW = "allow"
    SKIP = "skip"
    BUFFER_ONE = "buffer_one"


class Admission(Enum):
    """A worker's decision for an occurrence of a schedule with an overlap policy."""

    RUN = "run"
    SKIP = "skip"  # outcome skipped
    BUFFER = "buffer"  # wait for the running one


def admit_occurrence(policy: str, *, running: int, buffered: bool) -> Admission:
    """The decision for an occurrence when ``running`` attempts of its schedule are
    executing and (``buffered``) one occurrence already waits."""
    if running <= 0 or policy == OverlapPolicy.ALLOW:
        return Admission.RUN
    if policy == OverlapPolicy.BUFFER_ONE and not buffered:
        return Admission.BUFFER
    return Admission.SKIP


def exec_partition(schedule_id: str, policy: OverlapPolicy, partitions: int) -> int:
    """The exec partition the emitter fires an occurrence to: its schedule's when the
    policy is not ``allow``; -1 (the key's, Kafka's partitioner) otherwise."""
    if policy == OverlapPolicy.ALLOW:
        return -1
    return partition_for_key(schedule_id.encode(), partitions)
