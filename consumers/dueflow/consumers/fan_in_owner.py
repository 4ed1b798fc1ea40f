"""Fan-in in the worker: the group's owner, and a member's end on its way to it.

A group (:mod:`dueflow.rules.fan_in`) is kept by the worker that owns
partition murmur2(group id) of its callback's queue. Its commands reach the
head of that partition like any command and are applied here, in the batch
being built, so they commit in one transaction with the command's offset:

- ``group_open``: the group's state (``g\\x00<group id>`` in the queue's
  steering topic), with the callback's job;
- ``group_add``: the members' timers (header ``df-group``: where their ends
  go) and their ``scheduled`` outcomes: a member exists once its chunk commits;
- ``group_seal``: the number of members;
- ``member_ended``: one member's end, folded by its job id.

When the last end is folded into a sealed group, the callback's timer (due
now, header ``df-group-results``: every member's state) and its ``scheduled``
outcome are written, and the group's state removed, in that same transaction.

A member's worker (:meth:`GroupApplier.member_ended`) writes the end, in the
transaction of the member's final outcome, as a timer that the emitter fires
into the owner's exec partition (:func:`dueflow.records.group_state.notice_timer`):
the member's transaction never touches an exec partition, so it never holds
back the jobs of the owner's partition (a transaction open on a partition
holds its read_committed readers until it commits).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import replace
from typing import Any, Protocol

from dueflow import headers as hdr
from dueflow.consumers.feeds import Delivery, PartitionFeed, identity
from dueflow.errors import InvalidInput, UndecodableRecord
from dueflow.group_model import GroupState, MemberEnd
from dueflow.observability.logs import event
from dueflow.records.command import MARK
from dueflow.records.group_state import (
    STATE_HEADERS,
    encode_group_state,
    group_key,
    member_address,
    notice_timer,
    parse_member_address,
)
from dueflow.records.timer_record import JOB_SCHEMA, TimerPlacer, timer_record
from dueflow.records.worker_codec import OUTCOME_V3, decode_job, encode_outcome_v3, encode_scheduled
from dueflow.rules import fan_in
from dueflow.steering_model import Command

_LOG = logging.getLogger("dueflow.worker.groups")
_OUTCOME_V3_HEADERS = [(hdr.SCHEMA, OUTCOME_V3)]
_SCHEDULED_HEADERS = [(hdr.SCHEMA, b"dueflow.Outcome/1")]
GROUP_OPS = frozenset({"group_open", "group_add", "group_seal", "member_ended"})
_MISSING: Any = object()
# feed, group id, the group's state after (None: removed)
GroupFinal = tuple[PartitionFeed, str, GroupState | None]


class Recorder(Protocol):
    records: list[tuple[Any, ...]]  # the batch being built

    def add(
        self,
        feed: PartitionFeed,
        topic: str,
        partition: int,
        key: bytes | None,
        value: bytes | None,
        headers: list[tuple[str, bytes]],
    ) -> None: ...


class GroupBook:
    """The groups of the partitions one queue runtime owns (in memory, read from the
    steering topic at each assignment), and the changes of batches not committed yet."""

    def __init__(self) -> None:
        self._groups: dict[int, dict[str, GroupState]] = {}
        self._parked: dict[int, dict[str, GroupState]] = {}
        self._unread: set[int] = set()  # partitions whose groups were never read
        self.pending: dict[tuple[int, str], GroupState | None] = {}
        self.batch: list[GroupFinal] = []
        # The in-memory worker owns every partition from the start, read or not.
        self.owns_all = False

    def attach(self, partition: int) -> None:
        if partition in self._groups:
            return
        parked = self._parked.pop(partition, None)
        if parked is None:
            self._unread.add(partition)
            parked = {}
        self._groups[partition] = parked

    def park(self, partition: int) -> None:
        groups = self._groups.pop(partition, None)
        if groups is not None:
            self._parked[partition] = groups

    def drop_parked(self) -> None:
        self._parked.clear()

    def unread(self, partition: int) -> bool:
        """Whether the partition's groups must be read from the topic's start (this
        process never read them: the steering read starts over)."""
        return partition in self._unread

    def load(self, partition: int, staged: dict[str, GroupState | None], *, whole: bool) -> None:
        """Groups read from the steering topic (``whole``: from its start)."""
        groups = self._groups.setdefault(partition, {})
        if whole:
            groups.clear()
            self._unread.discard(partition)
        for group_id, state in staged.items():
            if state is None:
                groups.pop(group_id, None)
            else:
                groups[group_id] = state

    def states(self, partition: int) -> list[GroupState]:
        """The committed groups of ``partition``."""
        return list(self._groups.get(partition, {}).values())

    def get(self, partition: int, group_id: str) -> GroupState | None:
        if self.pending:
            found = self.pending.get((partition, group_id), _MISSING)
            if found is not _MISSING:
                return found  # type: ignore[no-any-return]
        groups = self._groups.get(partition)
        return groups.get(group_id) if groups else None

    def take(self) -> list[GroupFinal]:
        batch, self.batch = self.batch, []
        return batch

    def committed(self, changes: Iterable[GroupFinal]) -> None:
        for feed, group_id, state in changes:
            p = feed.partition
            groups = self._groups.get(p)
            if groups is None:
                groups = self._parked.get(p)
            if groups is None and self.owns_all:
                groups = self._groups[p] = {}
            if groups is not None:
                if state is None:
                    groups.pop(group_id, None)
                else:
                    groups[group_id] = state
            if self.pending.get((p, group_id), _MISSING) is state:
                del self.pending[(p, group_id)]

    def forget(self, changes: Iterable[GroupFinal]) -> None:
        for feed, group_id, state in changes:
            if self.pending.get((feed.partition, group_id), _MISSING) is state:
                del self.pending[(feed.partition, group_id)]

    def clear(self) -> None:
        self.pending.clear()
        self.batch = []

    def __len__(self) -> int:
        return sum(len(g) for g in self._groups.values())


class GroupApplier:
    """Applies group commands (as the owner) and sends members' ends (as a member's worker)."""

    def __init__(
        self,
        *,
        queue: str,
        recorder: Recorder,
        topics: Any,  # dueflow.kafka.topics.TopicNames
        placer: TimerPlacer,
        worker_id: str,
    ) -> None:
        self.book = GroupBook()
        self._queue = queue
        self._rec = recorder
        self._topics = topics
        self._steering_topic = topics.steering(queue)
        self._outcomes_topic = topics.outcomes
        self._timers_topic = topics.timers
        self._placer = placer
        self._worker_id = worker_id
        # (partition, group id) -> index of the group's state record in the batch being
        # built: a later change of the group in the same batch replaces it.
        self._written: dict[tuple[int, str], int] = {}

    # ------------------------------------------------------------------ the owner
    def command(self, feed: PartitionFeed, cmd: Command, now_ms: int) -> None:
        """Apply a group command at the head of its partition."""
        spec = cmd.member if cmd.op == "member_ended" else cmd.group
        group_id = spec.get("group_id") if isinstance(spec, dict) else None
        if not isinstance(group_id, str) or not group_id:
            self._refused(feed, cmd, f"invalid: field {cmd.op} needs a group_id", now_ms)
            return
        p = feed.partition
        state = self.book.get(p, group_id)
        if cmd.op == "member_ended":
            assert isinstance(spec, dict)
            end = MemberEnd(
                job_id=str(spec.get("member_job_id") or ""),
                state=str(spec.get("state") or ""),
                result=spec.get("result"),
                error=spec.get("error"),
            )
            folded = fan_in.member_ended(state, end, now_ms=now_ms)
            if folded.ignored:
                event(
                    _LOG,
                    "member end of no open group ignored",
                    queue=self._queue,
                    group=group_id,
                    member=end.job_id,
                )
        elif cmd.op == "group_open":
            then = (cmd.group or {}).get("then")
            if not isinstance(then, bytes) or not then:
                self._refused(feed, cmd, "invalid: group_open needs then (a Job value)", now_ms)
                return
            folded = fan_in.opened(state, group_id=group_id, then_job=then, now_ms=now_ms)
        elif cmd.op == "group_seal":
            size = (cmd.group or {}).get("size")
            folded = fan_in.sealed(state, size=size if type(size) is int else 0, now_ms=now_ms)
        else:
            folded = self._add(feed, cmd, state, group_id, now_ms)
        if folded.refused:
            self._refused(feed, cmd, folded.refused, now_ms)
            return
        if folded.changed:
            self._state(feed, group_id, folded.state)
        if folded.complete is not None:
            self._callback(feed, folded.complete, now_ms)

    def _add(
        self,
        feed: PartitionFeed,
        cmd: Command,
        state: GroupState | None,
        group_id: str,
        now_ms: int,
    ) -> fan_in.Folded:
        if state is None:
            return fan_in.Folded(None, False, refused=f"{fan_in.UNKNOWN_GROUP}: not open")
        if state.size is not None:
            return fan_in.Folded(state, False, refused=f"{fan_in.SIZE_CHANGED}: sealed already")
        members = (cmd.group or {}).get("members") or []
        jobs = []
        for i, raw in enumerate(members):
            try:
                jobs.append(decode_job(raw, JOB_SCHEMA))
            except UndecodableRecord as exc:
                why = f"invalid: group.members[{i}] is not a dueflow.Job value: {exc}"
                return fan_in.Folded(state, False, refused=why)
        address = member_address(group_id, self._queue, feed.partition)
        for job in jobs:
            rec = timer_record(job, now_ms=now_ms, placer=self._placer)
            headers = hdr.replace(rec.headers, [(hdr.GROUP, address)])
            self._rec.add(feed, self._timers_topic, rec.partition, rec.key, rec.value, headers)
            self._scheduled(feed, job, now_ms)
        return fan_in.Folded(state, False)

    def _callback(self, feed: PartitionFeed, group: GroupState, now_ms: int) -> None:
        assert group.then_job is not None
        job = replace(decode_job(group.then_job, JOB_SCHEMA), due_ms=now_ms)
        rec = timer_record(job, now_ms=now_ms, placer=self._placer)
        headers = hdr.replace(rec.headers, [(hdr.GROUP_RESULTS, fan_in.summary_bytes(group))])
        self._rec.add(feed, self._timers_topic, rec.partition, rec.key, rec.value, headers)
        self._scheduled(feed, job, now_ms)
        event(
            _LOG,
            "group complete",
            queue=self._queue,
            group=group.group_id,
            members=len(group.ended),
            callback=job.job_id,
        )

    def _scheduled(self, feed: PartitionFeed, job: Any, now_ms: int) -> None:
        value = encode_scheduled(
            job.job_id, job.queue, job.task, job.idempotency_key, job.due_ms, now_ms, None, None
        )
        self._rec.add(
            feed, self._outcomes_topic, -1, job.job_id.encode(), value, _SCHEDULED_HEADERS
        )

    def _state(self, feed: PartitionFeed, group_id: str, state: GroupState | None) -> None:
        value = None if state is None else encode_group_state(state)
        key = group_key(group_id)
        record = (feed, self._steering_topic, feed.partition, key, value, STATE_HEADERS)
        records = self._rec.records
        at = self._written.get((feed.partition, group_id))
        if at is not None and at < len(records) and records[at][1:4] == record[1:4]:
            # This batch writes the group already: only its last state counts (a
            # compacted topic), so a burst of members' ends costs one record.
            records[at] = record
        else:
            if len(self._written) > 10_000:
                self._written.clear()
            self._written[(feed.partition, group_id)] = len(records)
            records.append(record)
        self.book.batch.append((feed, group_id, state))
        self.book.pending[(feed.partition, group_id)] = state

    def _refused(self, feed: PartitionFeed, cmd: Command, why: str, now_ms: int) -> None:
        value = encode_outcome_v3(
            job_id=cmd.job_id,
            queue=self._queue,
            task="",
            idempotency_key=cmd.idempotency_key,
            state="refused",
            attempt=0,
            at_ms=now_ms,
            error=why,
            worker=self._worker_id,
            exec_partition=feed.partition,
            command_id=cmd.command_id,
        )
        self._rec.add(
            feed, self._outcomes_topic, -1, cmd.job_id.encode(), value, _OUTCOME_V3_HEADERS
        )
        event(
            _LOG,
            "group command refused",
            logging.WARNING,
            queue=self._queue,
            op=cmd.op,
            command=cmd.command_id,
            reason=why,
        )

    def sweep(self, feeds: dict[int, PartitionFeed], now_ms: int) -> int:
        """Give up groups of the partitions of ``feeds`` (their exec feeds, loaded) that
        were not sealed within :data:`~dueflow.rules.fan_in.SEAL_TIMEOUT_MS`: their
        callback is answered ``dead`` (never run) and their state removed. How many."""
        given_up = 0
        for partition, feed in feeds.items():
            for state in self.book.states(partition):
                if (partition, state.group_id) in self.book.pending:
                    continue  # changed by a batch not committed yet: the next sweep
                folded = fan_in.expired_unsealed(state, now_ms=now_ms)
                if not folded.changed:
                    continue
                self._state(feed, state.group_id, None)
                self._abandoned(feed, state, folded.refused, now_ms)
                given_up += 1
        return given_up

    def _abandoned(self, feed: PartitionFeed, state: GroupState, why: str, now_ms: int) -> None:
        job = decode_job(state.then_job, JOB_SCHEMA) if state.then_job else None
        if job is not None:
            value = encode_outcome_v3(
                job_id=job.job_id,
                queue=job.queue,
                task=job.task,
                idempotency_key=job.idempotency_key,
                state="dead",
                attempt=0,
                at_ms=now_ms,
                error=why,
                worker=self._worker_id,
                exec_partition=feed.partition,
            )
            self._rec.add(
                feed, self._outcomes_topic, -1, job.job_id.encode(), value, _OUTCOME_V3_HEADERS
            )
        event(
            _LOG,
            "group given up",
            logging.WARNING,
            queue=self._queue,
            group=state.group_id,
            ended=len(state.ended),
            reason=why,
        )

    # ------------------------------------------------------------------ a member's worker
    def member_ended(
        self,
        d: Delivery,
        how: str,
        now_ms: int,
        *,
        result: bytes | None = None,
        error: str | None = None,
    ) -> None:
        """Member delivery ``d`` (header ``df-group``) ended ``how``: its notice to the
        group's owner joins the batch (the transaction of the member's end)."""
        raw = d.hmap.get(hdr.GROUP)
        if raw is None:
            return
        try:
            group_id, queue, partition = parse_member_address(raw)
        except UndecodableRecord as exc:
            event(_LOG, "member with a bad df-group", logging.WARNING, error=str(exc))
            return
        job_id, _task, _key = identity(d)
        cmd = Command(
            command_id=f"{job_id}.ended",
            op="member_ended",
            job_id=job_id,
            idempotency_key=group_id,
            queue=queue,
            at_ms=now_ms,
            member={
                "group_id": group_id,
                "member_job_id": job_id,
                "state": how,
                "result": result,
                "error": error,
            },
        )
        rec = notice_timer(cmd, owner_partition=partition, now_ms=now_ms, placer=self._placer)
        self._rec.add(d.feed, self._timers_topic, rec.partition, rec.key, rec.value, rec.headers)


def check_group_command(cmd: Command, record_key: bytes | None) -> None:
    """The key of a group command is its group id followed by ``\\x00cmd``."""
    spec = cmd.member if cmd.op == "member_ended" else cmd.group
    group_id = spec.get("group_id") if isinstance(spec, dict) else None
    if not isinstance(group_id, str) or record_key != group_id.encode() + MARK:
        raise InvalidInput("key", record_key, "the group id followed by \\x00cmd")
