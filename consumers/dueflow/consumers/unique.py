"""The owner's side of unique and debounced jobs: ``admit`` commands in, records out.

A job scheduled with a unique key reaches the worker that owns the exec
partition its unique key hashes to as an ``admit`` command (the whole job and
the key's options: :mod:`dueflow.records.command`). At the head of the
partition, :class:`UniqueKeys` asks the pure rule (:func:`dueflow.rules.unique.admit`)
with the key's entry and what the worker knows of the job holding it, and
adds to the batch being built:

- admitted: the job's timer (headers ``df-partition``: this partition, so
  its owner sees the job's end; ``df-unique``: the key), the key's entry, and
  the job's ``scheduled`` outcome answering the command;
- a duplicate: the requested job's ``deduplicated`` outcome naming the job
  that holds the key (``first_job_id``); nothing else;
- a replace (debounce): the held job is replaced by the request, as a
  steering ``replace`` (:mod:`dueflow.rules.steering`: a new timer with a new
  version token, the old one superseded), its ``rescheduled`` outcome, and
  the request's ``deduplicated``.

Everything commits with the command's offset in one transaction. The job's
end (a delivery with ``df-unique`` that ends done, dead, cancelled or
expired) releases the key in the batch of that end (:meth:`UniqueKeys.ended`);
an entry whose window has passed is removed by the sweep.
"""

from __future__ import annotations

from collections.abc import Container
from dataclasses import replace
from typing import TYPE_CHECKING

from dueflow import headers as hdr
from dueflow.consumers.feeds import Delivery, PartitionFeed, identity
from dueflow.errors import InvalidInput, UndecodableRecord
from dueflow.model import Job
from dueflow.records.command import target_of
from dueflow.records.steering_state import UNIQUE_PREFIX, unique_key
from dueflow.records.timer_record import timer_record
from dueflow.records.worker_codec import decode_job
from dueflow.rules import steering as rule
from dueflow.rules import unique as unique_rule
from dueflow.steering_model import Command, UniqueEntry

if TYPE_CHECKING:
    from dueflow.consumers.commands import CommandApplier


class UniqueKeys:
    """Admits jobs under unique keys and releases the keys, into the applier's batch."""

    def __init__(self, applier: CommandApplier) -> None:
        self._steer = applier

    # ------------------------------------------------------------------ admit
    def admit(self, d: Delivery, cmd: Command, now_ms: int, *, running: Container[bytes]) -> None:
        """Apply ``admit`` command ``cmd`` (record ``d``, at the head of its partition)."""
        steer = self._steer
        feed = d.feed
        try:
            spec, job = self._checked(d, cmd)
        except InvalidInput as exc:
            steer._answer(feed, cmd, rule.refused(None, rule.INVALID, exc.message), now_ms)
            return
        book = steer.book
        if feed.partition in book.unavailable:
            why = "the queue's steering topic does not exist (dueflow topics ensure)"
            steer._answer(feed, cmd, rule.refused(None, rule.INVALID, why), now_ms)
            return
        ekey = unique_key(spec.key)
        found = book.entry(feed.partition, ekey)
        entry = found if isinstance(found, UniqueEntry) else None
        first = self._first(feed, entry, running)
        admission = unique_rule.admit(
            entry,
            spec=spec,
            job_id=cmd.job_id,
            idempotency_key=cmd.idempotency_key,
            first=first,
            now_ms=now_ms,
            token=cmd.command_id,
        )
        verdict = admission.verdict
        if verdict == unique_rule.REPLACE:
            assert entry is not None
            if not self._replace(feed, cmd, entry, job, now_ms):
                # the held job cannot be replaced after all: the request is a new job
                admission = unique_rule.admit(
                    None,
                    spec=spec,
                    job_id=cmd.job_id,
                    idempotency_key=cmd.idempotency_key,
                    first=None,
                    now_ms=now_ms,
                    token=cmd.command_id,
                )
                verdict = admission.verdict
        if admission.changed:
            steer._rec.steered(feed, ekey, admission.entry)
        if verdict == unique_rule.ADMIT:
            self._write(feed, job, spec.key, now_ms)
            steer._outcome(
                feed,
                job_id=cmd.job_id,
                key_text=cmd.idempotency_key,
                task=job.task,
                state="scheduled",
                attempt=0,
                now_ms=now_ms,
                due_ms=job.due_ms,
                command_id=cmd.command_id,
            )
        else:
            steer._outcome(
                feed,
                job_id=cmd.job_id,
                key_text=cmd.idempotency_key,
                task=job.task,
                state="deduplicated",
                attempt=0,
                now_ms=now_ms,
                due_ms=None,
                command_id=cmd.command_id,
                first_job_id=admission.first_job_id,
            )
        label = "scheduled" if verdict == unique_rule.ADMIT else verdict
        steer._metrics.steering_commands.labels(steer._queue, "admit", label).inc()

    def _checked(self, d: Delivery, cmd: Command) -> tuple[unique_rule.UniqueSpec, Job]:
        """The key's options and the job of ``cmd``; :class:`InvalidInput` naming a field
        that is not accepted."""
        assert cmd.unique is not None  # check_command: an admit has its unique spec
        spec = unique_rule.UniqueSpec.from_record(cmd.unique)
        if target_of(d.msg.key()) != spec.key.encode():
            raise InvalidInput("key", d.msg.key(), "the unique key followed by \\x00cmd")
        carried = len(cmd.job or b"")
        limit = self._steer._max_payload
        if carried > limit:
            raise InvalidInput(
                "job",
                f"{carried} bytes",
                f"at most {limit} bytes (the timer topic's record limit, less room for the "
                "job's other fields)",
            )
        schema = cmd.job_schema.encode() if cmd.job_schema else None
        try:
            job = decode_job(cmd.job or b"", schema)
        except UndecodableRecord as exc:
            raise InvalidInput("job", exc.message, "a dueflow.Job value") from None
        if (job.job_id, job.idempotency_key, job.queue) != (
            cmd.job_id,
            cmd.idempotency_key,
            cmd.queue,
        ):
            raise InvalidInput(
                "job",
                f"job {job.job_id!r} key {job.idempotency_key!r} on queue {job.queue!r}",
                f"the job of the command: job {cmd.job_id!r} key {cmd.idempotency_key!r} "
                f"on {cmd.queue!r}",
            )
        if job.schedule_id is not None:
            raise InvalidInput("job", job.schedule_id, "a one-shot job, not a cron occurrence")
        return spec, job

    def _first(
        self, feed: PartitionFeed, entry: UniqueEntry | None, running: Container[bytes]
    ) -> str | None:
        """What the worker knows of the job holding ``entry``'s key: not started
        (:data:`~dueflow.rules.unique.PENDING`), started or ended."""
        if entry is None:
            return unique_rule.PENDING
        key = entry.idempotency_key.encode()
        seen = self._steer.key_view(feed, key, running)
        if seen in rule.FINAL_KEYS:
            return unique_rule.ENDED
        if seen in (rule.RUNNING, rule.RETRYING):
            return unique_rule.STARTED
        state = self._steer.book.get(feed.partition, key)
        if state is not None and (state.cancelled or state.ended is not None):
            return unique_rule.ENDED
        return unique_rule.PENDING

    def _replace(
        self, feed: PartitionFeed, cmd: Command, entry: UniqueEntry, job: Job, now_ms: int
    ) -> bool:
        """Replace the job holding ``entry`` by ``job`` (it keeps its id and key); False
        when the steering rule refuses (the caller admits ``job`` instead)."""
        steer = self._steer
        key = entry.idempotency_key.encode()
        state = steer.book.get(feed.partition, key)
        replacing = Command(
            command_id=cmd.command_id,
            op="replace",
            job_id=entry.job_id,
            idempotency_key=entry.idempotency_key,
            queue=cmd.queue,
            at_ms=cmd.at_ms,
            by=cmd.by,
            due_ms=job.due_ms,
        )
        applied = rule.apply(
            state,
            replacing,
            key=None,
            now_ms=now_ms,
            grace_ms=steer.book.grace_ms,
            exec_partition=feed.partition,
        )
        if applied.outcome == "refused" or applied.timer is None:
            return False
        if applied.changed:
            steer._rec.steered(feed, key, applied.state)
        held = replace(job, job_id=entry.job_id, idempotency_key=entry.idempotency_key)
        unique = [(hdr.UNIQUE, entry.unique_key.encode())]
        steer._write_timer(feed, held, unique, applied.timer, now_ms, deadline=None)
        steer._answer(feed, replacing, applied, now_ms)
        return True

    def _write(self, feed: PartitionFeed, job: Job, key: str, now_ms: int) -> None:
        """The admitted job's timer: fired into this partition, carrying its unique key."""
        steer = self._steer
        rec = timer_record(job, now_ms=now_ms, placer=steer._placer)
        headers = hdr.replace(rec.headers, [(hdr.PARTITION, feed.partition), (hdr.UNIQUE, key)])
        steer._rec.add(feed, steer._timers_topic, rec.partition, rec.key, rec.value, headers)

    # ------------------------------------------------------------------ release
    def ended(self, d: Delivery) -> None:
        """Delivery ``d`` of a job admitted under a unique key (``df-unique``) ended for
        good: its key is released (or, with a window, kept to the window's end)."""
        raw = d.hmap.get(hdr.UNIQUE)
        if raw is None:
            return
        ekey = UNIQUE_PREFIX + raw
        found = self._steer.book.entry(d.feed.partition, ekey)
        if not isinstance(found, UniqueEntry):
            return
        after, changed = unique_rule.released(found, job_id=identity(d)[0])
        if changed:
            self._steer._rec.steered(d.feed, ekey, after)

    def sweep(self, entry: UniqueEntry, now_ms: int) -> tuple[UniqueEntry | None, bool]:
        return unique_rule.sweep(entry, now_ms=now_ms)
