"""An active period that fires in Kafka transactions (``emitter.transactional``).

Fired jobs, timers placed again, cron bookkeeping, quarantine records and the
timer offsets with their checkpoints commit together or not at all, through
the :class:`~dueflow.streams.emitter.outbox.Outbox`'s ring of transactional
producers; :meth:`~dueflow.streams.emitter.session.ActiveSession.start` fences
every earlier emitter of the shard (``init_transactions`` with the fixed
transactional ids aborts its open transaction). A fired job is visible to
``read_committed`` workers when its transaction commits, so a transaction
commits as soon as every due timer has fired (:func:`~dueflow.rules.drain.commit_due`).
"""

from __future__ import annotations

from typing import Any

from dueflow.rules.drain import commit_age_ms, commit_due
from dueflow.streams.emitter.drainer import SealedCommit
from dueflow.streams.emitter.outbox import Outbox
from dueflow.streams.emitter.session import ActiveSession


class TransactionalSession(ActiveSession[Outbox]):
    """An active period whose writes and offsets commit in transactions."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        em = self._settings.emitter
        self._batch_min_ms = em.batch_min_ms
        # A transaction opened ahead that nothing was written to is committed after
        # this long, well before the coordinator would abort it.
        self._idle_commit_ms = max(1, min(10_000, em.transaction_timeout_ms // 3))
        self._sealed: SealedCommit | None = None  # the commit in flight

    def before_read(self, may_wait: bool = True) -> tuple[int, int]:
        """The first half of :meth:`step`: collect the commit in flight; return
        ``(wake, now)``: until when the read may wait for records. ``may_wait``
        False (other shards share the loop): never wait here for a commit."""
        drainer = self.drainer
        outbox = self.outbox
        self._collect()
        now = self._clock()
        wake = drainer.wake_ms(now)
        if outbox.records:
            overdue = drainer.overdue_ms(now)
            age = (
                commit_age_ms(max_ms=self._batch_ms, behind_ms=overdue)
                if overdue >= 0
                else self._batch_min_ms
            )
            due_at = outbox.first_ms + age
            if due_at <= now and not outbox.can_submit() and wake > now:
                if not may_wait:  # look again soon: the commit in flight may be done
                    return min(wake, now + 1), now
                # The previous commit is in flight: wait for it (or the next timer).
                outbox.wait_submittable((wake - now) / 1000.0)
                self._collect()
                now = self._clock()
                wake = max(now, min(wake, due_at))
            wake = min(wake, due_at)
        return wake, now

    def _after_fire(self, now: int) -> None:
        """Commit the open transaction when it is due (see :func:`commit_due`)."""
        drainer = self.drainer
        outbox = self.outbox
        overdue = drainer.overdue_ms(now) if outbox.records else -1
        if outbox.records and commit_due(
            records=outbox.records,
            age_ms=now - outbox.first_ms,
            busy=overdue >= 0,
            max_records=self._batch_records,
            max_ms=self._batch_ms,
            behind_ms=overdue,
            min_ms=self._batch_min_ms,
        ):
            self._submit_if_ready()
        elif outbox.in_transaction and now - outbox.opened_ms >= self._idle_commit_ms:
            self._submit_if_ready()  # an open transaction nothing was written to: keep it young
        else:
            outbox.poll()

    def _submit_if_ready(self) -> None:
        """Hand the open transaction over to commit, unless the previous commit (or
        the next producer's open-ahead) is still in flight: then a later turn does."""
        if self.outbox.can_submit():
            self.commit(wait=False)
        else:
            self.outbox.poll()

    def commit(self, *, wait: bool = True, reopen: bool = True) -> None:
        """Commit the open transaction with the changed offsets and checkpoints
        (``reopen``: then open that producer's next one ahead, see
        :mod:`~dueflow.streams.emitter.outbox`). ``wait`` False: the commit runs
        on while the loop goes on, and a later turn collects its outcome."""
        self._collect(block=True)
        if not self.outbox.in_transaction:
            return
        sealed = self.drainer.seal()
        offsets = (
            sealed.offsets + self.cron.commit_offsets() + self.registry_quarantine.commit_offsets()
        )
        self._sealed = SealedCommit(offsets, sealed.fired)
        self.outbox.submit(offsets, self._group_metadata, reopen=reopen)
        self._collect(block=wait)

    def _collect(self, *, block: bool = False) -> None:
        """Count and measure the commit in flight once it finished (raises what it raised)."""
        if self._sealed is None:
            return
        done_ms = self.outbox.wait() if block else self.outbox.collect()
        if done_ms is None:
            return
        sealed, self._sealed = self._sealed, None
        self.drainer.on_committed(sealed, done_ms)
        self._metrics.emitter_transactions.labels("committed").inc()
        self._metrics.emitter_commit.observe(max(0, done_ms - self.outbox.submitted_ms) / 1000.0)
        self._first_committed()

    def close(self, *, commit: bool) -> None:
        """Commit (clean shutdown) or abort (lease lost, fenced) and close the clients."""
        try:
            if commit and self._drainer is not None:
                self.commit(reopen=False)
        finally:
            if self.outbox.in_transaction:
                self._metrics.emitter_transactions.labels("aborted").inc()
            self.outbox.close(abort=True)
            self._close_clients()
