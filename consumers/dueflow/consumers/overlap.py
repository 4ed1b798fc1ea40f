"""Cron overlap on a worker: the running occurrences of schedules with a policy.

The worker that owns a schedule's exec partition sees every occurrence of
it (the emitter fires them all there: :mod:`dueflow.rules.cron_overlap`). This
counts, per schedule id, the attempts of its occurrences executing now,
and keeps the one occurrence a ``buffer_one`` schedule lets wait; the
decision is :func:`dueflow.rules.cron_overlap.admit_occurrence`. Only deliveries
with a ``df-overlap`` header are counted: every other job costs one dict
lookup.
"""

from __future__ import annotations

from dueflow import headers as hdr
from dueflow.consumers.feeds import Delivery
from dueflow.records.worker_codec import F_SCHEDULE_ID
from dueflow.rules.cron_overlap import Admission, admit_occurrence


def _schedule_of(d: Delivery) -> tuple[str, str] | None:
    """``(schedule id, policy)`` of an occurrence with an overlap policy, else None."""
    raw = d.hmap.get(hdr.OVERLAP)
    if raw is None or d.fields is None:
        return None
    schedule_id = d.fields[F_SCHEDULE_ID]
    return (schedule_id, raw.decode("ascii", "replace")) if schedule_id else None


class OverlapGuard:
    """Running and waiting occurrences, per schedule id, of one queue's partitions."""

    def __init__(self) -> None:
        self.running: dict[str, int] = {}
        self.buffered: dict[str, Delivery] = {}

    def admission(self, d: Delivery) -> Admission:
        """Whether ``d`` may start now; changes nothing (see :meth:`buffer`)."""
        found = _schedule_of(d)
        if found is None:
            return Admission.RUN
        schedule_id, policy = found
        return admit_occurrence(
            policy,
            running=self.running.get(schedule_id, 0),
            buffered=schedule_id in self.buffered,
        )

    def buffer(self, d: Delivery) -> None:
        """Keep occurrence ``d`` (admitted :attr:`Admission.BUFFER`) until its turn."""
        found = _schedule_of(d)
        if found is not None:
            self.buffered[found[0]] = d

    def admit(self, d: Delivery) -> Admission:
        """Whether ``d`` may start now; a buffered one is kept here until its turn."""
        decision = self.admission(d)
        if decision is Admission.BUFFER:
            self.buffer(d)
        return decision

    def started(self, d: Delivery) -> None:
        found = _schedule_of(d)
        if found is not None:
            self.running[found[0]] = self.running.get(found[0], 0) + 1

    def finished(self, d: Delivery) -> Delivery | None:
        """An attempt of ``d`` ended: the occurrence that waited for it, if its turn came."""
        found = _schedule_of(d)
        if found is None:
            return None
        schedule_id = found[0]
        left = self.running.get(schedule_id, 0) - 1
        if left > 0:
            self.running[schedule_id] = left
            return None
        self.running.pop(schedule_id, None)
        return self.buffered.pop(schedule_id, None)

    def forget_gone(self) -> None:
        """Drop waiting occurrences of partitions this worker lost (they are read again by
        the partition's new owner, from the committed offset)."""
        self.buffered = {k: d for k, d in self.buffered.items() if not d.feed.gone}

    def clear(self) -> None:
        self.running.clear()
        self.buffered.clear()
