"""The partition owner's side of steering: commands in, records of the batch out.

A command (:mod:`dueflow.records.command`) reaches the head of its exec
partition like any record and is applied there, before anything behind it is
judged: :class:`CommandApplier` asks the pure rule
(:func:`dueflow.rules.steering.apply`) with the job's state and what the worker
knows of its key, and adds to the batch being built what the verdict says:
the job's state record in ``<prefix>.steering.<queue>`` (a tombstone once
nothing of the job is pending), the key ``cancelled`` for a cancel, a
timer written now for a ``replace``, and the outcome that answers the command
(with its ``command_id``). The command's offset finishes with them, so they
commit in one transaction with it, or not at all.

A delivery of a steered job (:func:`dueflow.rules.steering.judge`, step 2b of
:func:`~dueflow.consumers.decision.decide`) is skipped as superseded or
cancelled, or *redirected*: its timer is written again with the waiting move
or update (a new version token in ``df-version``) instead of running. Every
way a delivery ends (:meth:`CommandApplier.ended`) updates the state in the
same batch. States not committed yet are the :class:`SteeringBook`'s
``pending``; a sweep forgets tokens only an outage longer than the grace
could still deliver.

The real worker (:mod:`dueflow.consumers.runtime`) and the in-memory one
(:mod:`dueflow.testing.worker`) use this same code.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Container, Iterable
from dataclasses import replace
from typing import Any, Protocol

from dueflow import headers as hdr
from dueflow.consumers.fan_in_owner import GROUP_OPS, GroupApplier, check_group_command
from dueflow.consumers.feeds import Delivery, PartitionFeed, identity, trace_id
from dueflow.consumers.steering_store import SteeringStore, SteeringStoreFactory
from dueflow.consumers.store import CANCELLED, DEAD, DONE, RETRIED
from dueflow.consumers.unique import UniqueKeys
from dueflow.errors import InvalidInput, UndecodableRecord
from dueflow.model import Job
from dueflow.observability.logs import event
from dueflow.observability.metrics import Metrics
from dueflow.records.command import TIMER_HEADROOM, check_command, decode_command, target_of
from dueflow.records.job_request import content_hash
from dueflow.records.steering_state import SCHEMA as STATE_SCHEMA
from dueflow.records.steering_state import Entry, encode_entry, topic_key
from dueflow.records.timer_record import TimerPlacer, timer_record
from dueflow.records.worker_codec import (
    F_DUE_MS,
    F_SCHEDULE_ID,
    IDEMPOTENCY_V2,
    OUTCOME_V3,
    decode_job,
    encode_key_state,
    encode_outcome_v3,
)
from dueflow.rules import steering as rule
from dueflow.rules.deadline import moved_deadline
from dueflow.steering_model import ORIGINAL, Command, JobSteering, Patch, UniqueEntry

_LOG = logging.getLogger("dueflow.worker.steering")
_STATE_HEADERS = [(hdr.SCHEMA, STATE_SCHEMA)]
_KEY_HEADERS = [(hdr.SCHEMA, IDEMPOTENCY_V2)]
_OUTCOME_V3_HEADERS = [(hdr.SCHEMA, OUTCOME_V3)]
# Headers of a job's timer that travel to the timer the owner writes again.
_KEPT = (hdr.TRACEPARENT, hdr.TRACESTATE, hdr.TRACE_LINK, hdr.UNIQUE)
_KEY_NAMES = {DONE: "done", DEAD: "dead", CANCELLED: "cancelled"}
_MISSING: Any = object()


def token_of(d: Delivery) -> str:
    """The version token of a delivery (``""``: the job as scheduled)."""
    raw = d.hmap.get(hdr.VERSION)
    return ORIGINAL if raw is None else raw.decode("utf-8", "replace")


def key_name(state: int | None) -> str | None:
    """A key store state as the rule names it (None: nothing known)."""
    if state is None:
        return None
    return _KEY_NAMES.get(state) or (rule.RETRYING if state >= RETRIED else None)


class Recorder(Protocol):
    """What the applier asks of the batch being built (a
    :class:`~dueflow.consumers.recorder.BatchRecorder`)."""

    pending_final: dict[bytes, int]
    records: list[tuple[Any, ...]]  # the batch being built (groups.py rewrites in it)

    def add(
        self,
        feed: PartitionFeed,
        topic: str,
        partition: int,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes]],
    ) -> None: ...

    def final(self, feed: PartitionFeed, key: bytes, state: int, at_ms: int) -> None: ...

    def steered(self, feed: PartitionFeed, key: bytes, state: Entry | None) -> None: ...


class SteeringBook:
    """The steering states of the partitions one queue runtime owns: each partition's
    committed store, and the changes of the batches not committed yet (``pending``,
    by partition and key; ``None``: removed)."""

    def __init__(self, queue: str, grace_ms: int, stores: SteeringStoreFactory) -> None:
        self.queue = queue
        self.grace_ms = grace_ms
        self._factory = stores
        self._stores: dict[int, SteeringStore] = {}
        self._parked: dict[int, SteeringStore] = {}
        self.unavailable: set[int] = set()  # partitions whose steering topic is missing
        self.pending: dict[tuple[int, bytes], Entry | None] = {}

    # ------------------------------------------------------------------ ownership
    def attach(self, partition: int) -> SteeringStore:
        """The store of ``partition`` (parked or new); the caller loads it."""
        store = self._stores.get(partition)
        if store is None:
            store = self._parked.pop(partition, None)
            if store is None:
                store = self._factory(self.queue, partition, self.grace_ms)
            self._stores[partition] = store
        return store

    def park(self, partition: int) -> None:
        store = self._stores.pop(partition, None)
        if store is not None:
            self._parked[partition] = store

    def drop_parked(self) -> None:
        for store in self._parked.values():
            store.close()
        self._parked.clear()

    def store(self, partition: int) -> SteeringStore | None:
        return self._stores.get(partition)

    def close(self) -> None:
        for store in [*self._stores.values(), *self._parked.values()]:
            store.close()
        self._stores.clear()
        self._parked.clear()
        self.pending.clear()

    def __len__(self) -> int:
        return sum(len(s) for s in self._stores.values())

    # ------------------------------------------------------------------ reading
    def get(self, partition: int, key: bytes) -> JobSteering | None:
        """The job's state now: the newest change not committed yet, else the store's."""
        found = self.entry(partition, key)
        return found if isinstance(found, JobSteering) else None

    def entry(self, partition: int, key: bytes) -> Entry | None:
        """What the partition keeps under store key ``key`` now (a job's state or a
        unique key's entry): the newest change not committed yet, else the store's."""
        if self.pending:
            found = self.pending.get((partition, key), _MISSING)
            if found is not _MISSING:
                return found  # type: ignore[no-any-return]
        store = self._stores.get(partition)
        return store.get(key) if store else None

    def judge(self, d: Delivery) -> rule.Judgement | None:
        """The steering step of delivery ``d``; None when it has nothing to do with
        steering (no state of its key, no version token: the hot path)."""
        raw = d.hmap.get(hdr.VERSION)
        partition = d.feed.partition
        if raw is None and not self.pending and not self._stores.get(partition):
            return None
        state = self.get(partition, d.key)
        if state is None and raw is None:
            return None
        return rule.judge(
            state,
            token=ORIGINAL if raw is None else raw.decode("utf-8", "replace"),
            attempt=d.attempt,
            due_ms=d.fields[F_DUE_MS] if d.fields is not None else None,
            redriven=hdr.REDRIVEN_AT in d.hmap,
        )

    # ------------------------------------------------------------------ batches
    def committed(self, changes: Iterable[tuple[PartitionFeed, bytes, Entry | None]]) -> None:
        """A batch with these changes is committed: into the stores."""
        by_store: dict[int, tuple[SteeringStore, list[tuple[bytes, Entry | None]]]] = {}
        pending = self.pending
        for feed, key, state in changes:
            p = feed.partition
            store = self._stores.get(p)
            if store is None:  # (an empty store is falsy: no `or`)
                store = self._parked.get(p)
            if store is not None:
                by_store.setdefault(p, (store, []))[1].append((key, state))
            if pending.get((p, key), _MISSING) is state:
                del pending[(p, key)]
        for store, items in by_store.values():
            store.put(items)

    def forget(self, changes: Iterable[tuple[PartitionFeed, bytes, Entry | None]]) -> None:
        """These changes will never commit (their partitions are gone)."""
        for feed, key, state in changes:
            if self.pending.get((feed.partition, key), _MISSING) is state:
                del self.pending[(feed.partition, key)]


class CommandApplier:
    """Applies commands and records what deliveries of steered jobs do, into a batch."""

    def __init__(
        self,
        *,
        queue: str,
        book: SteeringBook,
        recorder: Recorder,
        topics: Any,  # dueflow.kafka.topics.TopicNames
        placer: TimerPlacer,
        worker_id: str,
        metrics: Metrics,
        key_state: Callable[[PartitionFeed, bytes], int | None],
        max_timer_bytes: int = 1_048_588,
    ) -> None:
        self.book = book
        # What a timer the owner writes may hold: a larger one would fail the
        # transaction every time the command is applied again.
        self._max_payload = max(1024, max_timer_bytes - TIMER_HEADROOM)
        self._queue = queue
        self._rec = recorder
        self._steering_topic = topics.steering(queue)
        self._idem_topic = topics.idempotency(queue)
        self._outcomes_topic = topics.outcomes
        self._timers_topic = topics.timers
        self._placer = placer
        self._worker_id = worker_id
        self._metrics = metrics
        self._key_state = key_state
        for step in ("superseded", "cancelled", "redirect", "duplicate"):  # series from 0
            metrics.steering_deliveries.labels(queue, step)
        self.unique = UniqueKeys(self)  # admit commands, and the release of their keys
        # Fan-in: groups this owner keeps, and members' ends it sends (groups.py).
        self.groups = GroupApplier(
            queue=queue, recorder=recorder, topics=topics, placer=placer, worker_id=worker_id
        )

    # ------------------------------------------------------------------ commands
    def command(self, d: Delivery, now_ms: int, *, running: Container[bytes]) -> str | None:
        """Apply the command ``d`` (at the head of its partition); the reason to
        quarantine it when it is no command, else None."""
        feed = d.feed
        try:
            cmd = decode_command(d.msg.value(), d.hmap.get(hdr.SCHEMA))
        except UndecodableRecord as exc:
            return str(exc)
        if hdr.REPLAYED_FROM in d.hmap:
            # `dueflow replay` of a command: it was applied when it was first read.
            event(_LOG, "replayed command ignored", queue=self._queue, command=cmd.command_id)
            return None
        if cmd.op == "admit":
            try:
                check_command(cmd)
            except InvalidInput as exc:
                self._answer(feed, cmd, rule.refused(None, rule.INVALID, exc.message), now_ms)
                return None
            self.unique.admit(d, cmd, now_ms, running=running)
            return None
        if cmd.op in GROUP_OPS:
            self._group_command(d, cmd, now_ms)
            return None
        key = cmd.idempotency_key.encode() if isinstance(cmd.idempotency_key, str) else b""
        try:
            check_command(cmd)
            if cmd.queue != self._queue:
                raise InvalidInput("queue", cmd.queue, f"{self._queue!r}, the queue it was sent to")
            if target_of(d.msg.key()) != key:
                raise InvalidInput(
                    "key", d.msg.key(), "the job's idempotency key followed by \\x00cmd"
                )
            job = self._replacement(cmd) if cmd.op == "replace" else None
            carried = len(cmd.payload or b"") + len(cmd.job or b"")
            if carried > self._max_payload:
                field = "payload" if cmd.op == "patch" else "job"
                raise InvalidInput(
                    field,
                    f"{carried} bytes",
                    f"at most {self._max_payload} bytes (the timer topic's record limit, "
                    "less room for the job's other fields)",
                )
        except InvalidInput as exc:
            self._answer(feed, cmd, rule.refused(None, rule.INVALID, exc.message), now_ms)
            return None
        if feed.partition in self.book.unavailable:
            why = "the queue's steering topic does not exist (dueflow topics ensure)"
            self._answer(feed, cmd, rule.refused(None, rule.INVALID, why), now_ms)
            return None
        state = self.book.get(feed.partition, key)
        if job is not None and state is not None and state.patch is not None:
            # A replace moves the job: an update still waiting is kept in it.
            job = _patched(job, state.patch)
        view = self.key_view(feed, key, running)
        applied = rule.apply(
            state,
            cmd,
            key=view,
            now_ms=now_ms,
            grace_ms=self.book.grace_ms,
            exec_partition=feed.partition,
        )
        if applied.changed:
            self._rec.steered(feed, key, applied.state)
        if applied.cancel_key:
            self._cancel_key(feed, key, cmd.job_id, cmd.idempotency_key, now_ms)
        if applied.timer is not None and job is not None:
            # a job admitted under a unique key keeps it (df-unique on the command)
            unique = d.hmap.get(hdr.UNIQUE)
            kept: list[tuple[str, bytes]] = [] if unique is None else [(hdr.UNIQUE, unique)]
            self._write_timer(feed, job, kept, applied.timer, now_ms, deadline=None)
        self._answer(feed, cmd, applied, now_ms)
        return None

    def key_view(self, feed: PartitionFeed, key: bytes, running: Container[bytes]) -> str | None:
        """What the worker knows of ``key`` as the rule names it (running, retrying,
        done, dead, cancelled; None: nothing)."""
        return rule.RUNNING if key in running else key_name(self._key_state(feed, key))

    def _group_command(self, d: Delivery, cmd: Command, now_ms: int) -> None:
        feed = d.feed
        try:
            check_command(cmd)
            if cmd.queue != self._queue:
                raise InvalidInput("queue", cmd.queue, f"{self._queue!r}, the queue it was sent to")
            check_group_command(cmd, d.msg.key())
        except InvalidInput as exc:
            self._answer(feed, cmd, rule.refused(None, rule.INVALID, exc.message), now_ms)
            return
        if feed.partition in self.book.unavailable:
            why = "the queue's steering topic does not exist (dueflow topics ensure)"
            self._answer(feed, cmd, rule.refused(None, rule.INVALID, why), now_ms)
            return
        self.groups.command(feed, cmd, now_ms)
        self._metrics.steering_commands.labels(self._queue, cmd.op, "applied").inc()

    def _replacement(self, cmd: Command) -> Job:
        """The job a ``replace`` carries; :class:`InvalidInput` when it is not this job."""
        schema = cmd.job_schema.encode() if cmd.job_schema else None
        try:
            job = decode_job(cmd.job or b"", schema)
        except UndecodableRecord as exc:
            raise InvalidInput("job", exc.message, "a dueflow.Job value") from None
        if job.idempotency_key != cmd.idempotency_key or job.queue != cmd.queue:
            raise InvalidInput(
                "job",
                f"key {job.idempotency_key!r} on queue {job.queue!r}",
                f"the job of the command: key {cmd.idempotency_key!r} on {cmd.queue!r}",
            )
        if job.schedule_id is not None:
            raise InvalidInput("job", job.schedule_id, "a one-shot job, not a cron occurrence")
        return replace(job, due_ms=cmd.due_ms if cmd.due_ms is not None else job.due_ms)

    def _answer(
        self, feed: PartitionFeed, cmd: Command, applied: rule.Applied, now_ms: int
    ) -> None:
        state = applied.state
        self._outcome(
            feed,
            job_id=cmd.job_id,
            key_text=cmd.idempotency_key,
            task="",
            state=applied.outcome,
            attempt=0,
            now_ms=now_ms,
            due_ms=applied.due_ms if applied.outcome != "refused" else None,
            error=applied.error or None,
            command_id=cmd.command_id,
            version=state.version if state is not None and applied.outcome != "refused" else None,
        )
        self._metrics.steering_commands.labels(self._queue, cmd.op, applied.outcome).inc()
        if applied.outcome == "refused":
            event(
                _LOG,
                "command refused",
                queue=self._queue,
                job_id=cmd.job_id,
                op=cmd.op,
                command=cmd.command_id,
                reason=applied.error,
            )

    # ------------------------------------------------------------------ deliveries
    def judged(self, d: Delivery, judgement: rule.Judgement, now_ms: int) -> None:
        """Record what the steering step did with delivery ``d`` (its outcome is the
        recorder's, but for a redirect)."""
        if judgement.changed:
            self._rec.steered(d.feed, d.key, judgement.state)
        if judgement.cancel_key:
            job_id, _task, key_text = identity(d)
            self._cancel_key(d.feed, d.key, job_id, key_text, now_ms)
        step = judgement.step
        if step is rule.Step.CANCELLED or step is rule.Step.DUPLICATE:
            self.unique.ended(d)
        self._metrics.steering_deliveries.labels(self._queue, step.value).inc()
        if step is rule.Step.REDIRECT:
            self._redirect(d, judgement, now_ms)

    def _redirect(self, d: Delivery, judgement: rule.Judgement, now_ms: int) -> None:
        fields, timer, patch = d.fields, judgement.timer, judgement.patch
        assert timer is not None
        assert patch is not None
        job_id, task, key_text = identity(d)
        if fields is None:  # not a job: nothing to write again
            return
        job = _patched(Job(*fields), patch)
        deadline = d.hmap.get(hdr.EXPIRES)
        self._write_timer(
            d.feed,
            job,
            d.msg.headers() or [],
            timer,
            now_ms,
            deadline=deadline,
            old_due=fields[F_DUE_MS],
        )
        state = judgement.state
        self._outcome(
            d.feed,
            job_id=job_id,
            key_text=key_text,
            task=task,
            state="rescheduled",
            attempt=d.attempt,
            now_ms=now_ms,
            due_ms=timer.due_ms,
            version=state.current if state is not None else timer.token,
            trace=trace_id(d),
            schedule_id=fields[F_SCHEDULE_ID],
        )

    def ended(self, d: Delivery, how: str | None, now_ms: int) -> None:
        """Delivery ``d`` ended ``how`` (done, dead, cancelled, expired; None: its
        attempt was handed on to a retry)."""
        if not self.book.pending and not self.book.store(d.feed.partition):
            return
        if how is not None:
            self.unique.ended(d)
        state = self.book.get(d.feed.partition, d.key)
        if state is None:
            return
        after, changed = rule.ended(state, token=token_of(d), how=how)
        if changed:
            self._rec.steered(d.feed, d.key, after)

    def cancelled(self, d: Delivery) -> bool:
        """Whether the job of ``d`` is cancelled (its failed attempt hands no retry on)."""
        if not self.book.pending and not self.book.store(d.feed.partition):
            return False
        state = self.book.get(d.feed.partition, d.key)
        return state is not None and state.cancelled

    def sweep(self, feeds: dict[int, PartitionFeed], now_ms: int) -> int:
        """Forget what only an outage longer than the grace could still deliver, in
        the partitions of ``feeds`` (their exec feeds, loaded); how many states changed."""
        changed_count = 0
        for partition, feed in feeds.items():
            store = self.book.store(partition)
            if store is None or not len(store):
                continue
            for key, state in store.due_for_sweep(now_ms):
                if (partition, key) in self.book.pending:
                    continue  # changed by a batch not committed yet: the next sweep
                after: Entry | None
                if isinstance(state, UniqueEntry):
                    after, changed = self.unique.sweep(state, now_ms)
                else:
                    after, changed = rule.sweep(state, now_ms=now_ms, grace_ms=self.book.grace_ms)
                if changed:
                    self._rec.steered(feed, key, after)
                    changed_count += 1
        changed_count += self.groups.sweep(feeds, now_ms)
        if changed_count:
            self._metrics.steering_swept.labels(self._queue).inc(changed_count)
        return changed_count

    # ------------------------------------------------------------------ records
    def _cancel_key(
        self, feed: PartitionFeed, key: bytes, job_id: str, key_text: str, now_ms: int
    ) -> None:
        value = encode_key_state(
            idempotency_key=key_text, job_id=job_id, state="cancelled", at_ms=now_ms
        )
        self._rec.add(feed, self._idem_topic, feed.partition, key, value, _KEY_HEADERS)
        self._rec.final(feed, key, CANCELLED, now_ms)

    def _write_timer(
        self,
        feed: PartitionFeed,
        job: Job,
        headers: list[tuple[str, bytes]],
        timer: rule.NewTimer,
        now_ms: int,
        *,
        deadline: bytes | None,
        old_due: int | None = None,
    ) -> None:
        due = timer.due_ms if timer.due_ms is not None else job.due_ms
        job = replace(job, due_ms=due)
        kept = [(k, v) for k, v in headers if k in _KEPT and v is not None]
        rec = timer_record(job, now_ms=now_ms, placer=self._placer, trace_headers=kept)
        extra: list[tuple[str, str | int | bytes | None]] = [
            (hdr.VERSION, timer.token),
            (hdr.PARTITION, feed.partition),  # it fires into this partition, whose owner decides
            # a cron occurrence written again is a job, not an occurrence to plan again
            (hdr.KIND, hdr.KIND_JOB),
            (hdr.SCHEDULE, None),
            (hdr.SCHEDULE_VERSION, None),
        ]
        if deadline is not None and deadline.isdigit() and old_due is not None:
            extra.append(
                (hdr.EXPIRES, moved_deadline(int(deadline), old_due_ms=old_due, new_due_ms=due))
            )
        out = hdr.replace(rec.headers, extra)
        self._rec.add(feed, self._timers_topic, rec.partition, rec.key, rec.value, out)

    def _outcome(
        self,
        feed: PartitionFeed,
        *,
        job_id: str,
        key_text: str,
        task: str,
        state: str,
        attempt: int,
        now_ms: int,
        due_ms: int | None,
        error: str | None = None,
        command_id: str | None = None,
        version: str | None = None,
        trace: str | None = None,
        schedule_id: str | None = None,
        first_job_id: str | None = None,
    ) -> None:
        value = encode_outcome_v3(
            job_id=job_id,
            queue=self._queue,
            task=task,
            idempotency_key=key_text,
            state=state,
            attempt=attempt,
            at_ms=now_ms,
            due_ms=due_ms,
            error=error,
            worker=self._worker_id,
            trace_id=trace,
            schedule_id=schedule_id,
            exec_partition=feed.partition,
            version=version,
            command_id=command_id,
            first_job_id=first_job_id,
        )
        self._rec.add(feed, self._outcomes_topic, -1, job_id.encode(), value, _OUTCOME_V3_HEADERS)

    def state_record(
        self, feed: PartitionFeed, key: bytes, state: Entry | None
    ) -> tuple[str, int, bytes, bytes | None, list[tuple[str, bytes]]]:
        """``(topic, partition, key, value, headers)`` of a state change (None: a tombstone)."""
        value = None if state is None else encode_entry(state)
        return (self._steering_topic, feed.partition, topic_key(key), value, _STATE_HEADERS)


def _patched(job: Job, patch: Patch) -> Job:
    """``job`` with the payload (and content type) of ``patch``."""
    if patch.payload is None and patch.content_type is None:
        return job
    payload = patch.payload if patch.payload is not None else job.payload
    content_type = patch.content_type or job.content_type
    return replace(
        job,
        payload=payload,
        content_type=content_type,
        content_hash=content_hash(job.task, payload, content_type),
    )
