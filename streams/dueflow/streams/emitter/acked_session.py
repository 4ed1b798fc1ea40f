"""An active period that fires without transactions (the default).

Fires go out through an idempotent producer
(:class:`~dueflow.streams.emitter.acked_outbox.AckedOutbox`) and are visible
to workers when the broker has appended them. The timer offsets with their
checkpoints, and the offsets of the schedules and queue registry records
quarantined, are committed every ``emitter.batch_max_ms`` (or
``batch_max_records`` records), each commit only after every record written
before it is acknowledged, and through the lease group
(:meth:`~dueflow.streams.emitter.lease.Lease.commit`): the coordinator refuses
the commit of a member it dropped, so an emitter that was stopped past its
session cannot move the new holder's offsets back. Records below a committed
offset are deleted only once that commit was accepted (housekeeping reads
:attr:`WheelDrainer.committed_offsets`, which only accepted commits move).
The accepted commits are copied into the offsets group as well
(:meth:`~dueflow.streams.emitter.wheel_source.WheelSource.mirror`; at most every
:data:`MIRROR_EVERY_S`, and the last one at a clean stop), where an emitter
firing in transactions of an earlier release reads its offsets.

A takeover reads from the last accepted commit: what the old emitter fired
after it is fired again, and the workers skip the copies by their
idempotency keys. Cascaded timers and cron placements written again are
copies with the same key; a quarantine record written again names the same
source record (topic, partition, offset).

A stopped (SIGSTOP) or starved emitter that resumes may hold a lease the group
has given away without knowing it yet. Records it read after the gap could
have been written by the new holder, whose schedules table is newer than its
own (a cron occurrence of a schedule version it does not know yet would be
dropped as stale), so a turn that finds the loop did not run for longer than
the lease session less a heartbeat drops what it read and starts the period
over (:class:`EmitterStalled`): the new period reads the schedules to their
end first, and the lease tells it meanwhile whether it is still the holder.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from confluent_kafka import KafkaError, Message, TopicPartition

from dueflow.errors import KafkaOperationError
from dueflow.observability.logs import event
from dueflow.streams.emitter.acked_outbox import AckedOutbox, Fired
from dueflow.streams.emitter.lease import Lease
from dueflow.streams.emitter.session import ActiveSession

log = logging.getLogger("dueflow.emitter")

_Key = tuple[str, int]
# While turns wait for their acknowledgements, the loop looks again this soon.
_ACK_LOOK_MS = 5
# A clean stop waits this long for the last acknowledgements.
_FLUSH_S = 10.0
_REBALANCING = (KafkaError.REBALANCE_IN_PROGRESS, KafkaError.ILLEGAL_GENERATION)
# Accepted commits are copied into the offsets group at most this often: they
# matter only to a rollback (which fires again what was fired since the last
# copy), and a copy per commit doubled the offset commits the broker writes.
MIRROR_EVERY_S = 1.0


class EmitterStalled(KafkaOperationError):
    """The loop did not run for longer than the lease may last: start the period over."""


@dataclass(slots=True)
class _Seal:
    """A commit of offsets: what it commits, the outbox's seal it waits for, when."""

    offsets: dict[_Key, TopicPartition]
    seal: int
    at: float  # monotonic
    sent: bool = False


class AckedSession(ActiveSession[AckedOutbox]):
    """An active period whose fires are acknowledged writes and whose offsets are
    committed through the lease group."""

    def __init__(self, *args: Any, lease: Lease, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._lease = lease
        self.outbox.on_acked = self._on_acked
        self._sealed: _Seal | None = None
        # Offsets sealed and not confirmed yet (a commit in flight, refused or
        # failed): every commit sends them too, unless it has newer ones.
        self._unconfirmed: dict[_Key, TopicPartition] = {}
        # Accepted offsets not copied into the offsets group yet, and when it last was.
        self._to_mirror: dict[_Key, TopicPartition] = {}
        self._to_mirror_at = 0.0  # monotonic: when the newest of them was sealed
        self._mirrored_at = 0.0
        lease_ms = self._settings.emitter.session_timeout_ms
        beat_ms = self._settings.emitter.heartbeat_interval_ms
        self._stall_s = max(0.5, (lease_ms - beat_ms) / 1000.0)
        self._alive_at = 0.0  # monotonic: when a turn last ended
        self._wait_s = 0.0  # how long the read after before_read may wait

    def finish_start(self) -> None:
        super().finish_start()
        # What this period fires that is due by now, the previous holder may have
        # fired after its last commit.
        self.drainer.refire_before_ms = self._clock()
        self._alive_at = time.monotonic()

    def _on_acked(self, fired: Fired, done_ms: int) -> None:
        if self._drainer is not None:
            self._drainer.on_visible(fired, done_ms)

    # ------------------------------------------------------------------ the turn
    def before_read(self, may_wait: bool = True) -> tuple[int, int]:
        now = self._clock()
        wake = self.drainer.wake_ms(now)
        outbox = self.outbox
        if outbox.pending or (self._sealed is not None and not self._sealed.sent):
            wake = min(wake, now + _ACK_LOOK_MS)
        elif outbox.records and self._sealed is None:
            wake = min(wake, outbox.first_ms + self._batch_ms)
        self._wait_s = max(0, wake - now) / 1000.0
        return wake, now

    def after_read(self, messages: list[Message], now: int) -> None:
        started = time.monotonic()
        stalled = started - self._alive_at - self._wait_s
        if stalled > self._stall_s:
            raise EmitterStalled(
                f"the loop did not run for {stalled:.1f} s: the lease may have moved meanwhile"
            )
        super().after_read(messages, now)
        ended = time.monotonic()
        if ended - started > self._stall_s:
            # Stopped (or starved) inside the turn: what it read came before the gap,
            # the next read may not.
            raise EmitterStalled(
                f"a turn took {ended - started:.1f} s: the lease may have moved meanwhile"
            )
        self._alive_at = ended

    def _after_fire(self, now: int) -> None:
        outbox = self.outbox
        outbox.cut(self.drainer.take_fired())
        outbox.poll()
        sealed = self._sealed
        if sealed is None:
            if outbox.records and (
                outbox.records >= self._batch_records or now - outbox.first_ms >= self._batch_ms
            ):
                self._sealed = self._seal()
        elif not sealed.sent and outbox.acked(sealed.seal):
            sealed.sent = True
            self._lease.commit(list(sealed.offsets.values()), self._on_commit)
        if self._to_mirror:
            self._mirror()

    def _seal(self) -> _Seal:
        """The offsets to commit once everything written so far is acknowledged."""
        unconfirmed = self._unconfirmed
        for tp in (
            self.drainer.seal().offsets
            + self.cron.commit_offsets()
            + self.registry_quarantine.commit_offsets()
        ):
            unconfirmed[(tp.topic, tp.partition)] = tp
        return _Seal(dict(unconfirmed), self.outbox.seal(), time.monotonic())

    def _on_commit(self, err: KafkaError | None) -> None:
        """The lease group's answer (served by the process's lease poll)."""
        sealed, self._sealed = self._sealed, None
        if sealed is None:
            return
        metrics = self._metrics
        if err is not None:
            # Sent again with the next commit (refused: the lease is going, and the
            # lease callback ends this period).
            metrics.emitter_offset_commits.labels("failed").inc()
            # Refused while the lease group rebalances (a member joins or leaves):
            # expected, and sent again with the next commit.
            level = logging.INFO if err.code() in _REBALANCING else logging.WARNING
            event(log, "offset commit refused", level, error=str(err), shard=self.shard)
            return
        for key, tp in sealed.offsets.items():
            if self._unconfirmed.get(key) is tp:
                del self._unconfirmed[key]
        self.drainer.confirm(list(sealed.offsets.values()))
        self._to_mirror.update(sealed.offsets)
        self._to_mirror_at = sealed.at
        self._mirror()
        metrics.emitter_offset_commits.labels("committed").inc()
        metrics.emitter_commit.observe(time.monotonic() - sealed.at)
        self._first_committed()

    def _mirror(self, *, wait: bool = False) -> None:
        """Copy the accepted offsets into the offsets group (where a rollback to an
        emitter firing in transactions reads them), when :data:`MIRROR_EVERY_S`
        has passed since the last copy or ``wait`` (a clean stop: now, and wait).

        The copy is a plain commit, which no group fences, so it is sent only while
        the lease group's acceptance is fresh: the newest offsets were sealed less
        than a lease (the session less a heartbeat) ago, so the coordinator accepted
        them from a member it could not have dropped yet, and no successor can have
        copied newer ones. Offsets older than that (the process was stopped or
        starved since) are dropped: the next accepted commit is copied instead."""
        now = time.monotonic()
        if not wait and now - self._to_mirror_at > self._stall_s:
            self._to_mirror.clear()
            return
        if self._to_mirror and (wait or now - self._mirrored_at >= MIRROR_EVERY_S):
            self.source.mirror(list(self._to_mirror.values()), wait=wait)
            self._to_mirror.clear()
            self._mirrored_at = now

    # ------------------------------------------------------------------ the end
    def close(self, *, commit: bool) -> None:
        """``commit``: wait for every acknowledgement and commit the offsets (a clean
        stop or handover), else drop what is not sent yet."""
        try:
            if commit and self._drainer is not None:
                self._commit_all()
        finally:
            self._lease.forget(self._on_commit)
            self._sealed = None
            self.outbox.close()
            self._close_clients()

    def _commit_all(self) -> None:
        """Commit everything acknowledged, then copy into the offsets group what the
        lease group accepted: the last commit's offsets, or when it was refused (a
        lease group rebalancing as the emitter stops), those of the commits accepted
        before it and not copied yet."""
        try:
            self._commit_last()
        finally:
            self._mirror(wait=True)

    def _commit_last(self) -> None:
        outbox = self.outbox
        outbox.cut(self.drainer.take_fired())
        sealed = self._seal()
        if not outbox.flush(_FLUSH_S) or not outbox.acked(sealed.seal):
            event(log, "stopping before every fire was acknowledged", logging.WARNING)
            return
        offsets = list(sealed.offsets.values())
        if self._lease.commit_now(offsets):
            self._unconfirmed.clear()
            self.drainer.confirm(offsets)
            self._to_mirror.update(sealed.offsets)
            self._metrics.emitter_offset_commits.labels("committed").inc()
            self._metrics.emitter_commit.observe(time.monotonic() - sealed.at)
        else:
            self._metrics.emitter_offset_commits.labels("failed").inc()
