"""The jobs one client scheduled recently: a bounded LRU for conflict detection.

A job id reused with the same content is accepted idempotently (the first
result is returned, nothing is written); reused with different content it is
a :class:`~dueflow.errors.ConflictError`. The memory is per client instance
and holds the last ``capacity`` jobs: a reuse across processes, or after the
id fell out of the LRU, is not detected here. Workers still see
``content_hash`` in the job and in idempotency records.
"""

from __future__ import annotations

import threading

from dueflow.errors import ConflictError
from dueflow.producers.results import Scheduled

DEFAULT_CAPACITY = 100_000

# What is kept per job (a plain tuple: schedule_many stores one per job):
# (content_hash, due_ms, queue, task, idempotency_key, partition)
Entry = tuple[str, int, str, str, str, int]


class RecentJobs:
    """Thread-safe, bounded memory of ``job_id -> Entry``, approximately LRU.

    Two generations of plain dicts (cheaper than an ordered LRU, which matters
    at 100k jobs/s): new entries go to the young one; when it holds half the
    capacity it becomes the old one and the previous old one is dropped. A
    hit in the old generation moves the entry to the young one. So at most
    ``capacity`` entries are kept and at least the last ``capacity // 2``.

    Jobs given to :meth:`remember` (drawn ids, ``schedule_many``) are put in
    the dicts when the memory is next read, not at once: a call that schedules
    more jobs than the memory holds, with no lookup in between, then never
    inserts the ones that would have been dropped again before anyone asked
    (about 0.4 us a job). Every read sees what eager inserts would have left.
    """

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        if capacity < 0:
            raise ValueError("capacity must be >= 0")
        self.capacity = capacity
        self._generation = max(1, capacity // 2)
        self._young: dict[str, Entry] = {}
        self._old: dict[str, Entry] = {}
        # remembered, not yet in the dicts (ids new to both), oldest first
        self._pending_ids: list[str] = []
        self._pending: list[Entry] = []
        self._lock = threading.Lock()

    def __len__(self) -> int:
        with self._lock:
            self._index()
            return len(self._young) + len(self._old)

    def _find(self, job_id: str) -> Entry | None:
        self._index()
        found = self._young.get(job_id)
        if found is None:
            found = self._old.pop(job_id, None)
            if found is not None:
                self._add(job_id, found)
        return found

    def _add(self, job_id: str, entry: Entry) -> None:
        if not self.capacity:
            return
        young = self._young
        young[job_id] = entry
        if len(young) >= self._generation:
            self._old = young
            self._young = {}

    def get(self, job_id: str) -> Scheduled | None:
        """What this client scheduled as ``job_id`` (``duplicate=True``), if it remembers."""
        with self._lock:
            found = self._find(job_id)
        return None if found is None else _scheduled(job_id, found)

    def claim(self, job_id: str, entry: Entry, task: str) -> Scheduled | None:
        """Remember ``entry`` for ``job_id`` unless the id is known.

        Returns ``None`` when the caller should write the job; the earlier
        result (``duplicate=True``) when the same content was scheduled
        before. Raises :class:`ConflictError` for other content.
        """
        with self._lock:
            self._index()
            found = self._young.get(job_id)
            if found is None:
                found = self._old.pop(job_id, None)
                self._add(job_id, entry if found is None else found)
                if found is None:
                    return None
        if found[0] != entry[0]:
            raise ConflictError(
                f"job_id {job_id!r} was already scheduled by this client with other content "
                f"(task {found[3]!r}, content hash {found[0]}; now task {task!r}, content "
                f"hash {entry[0]}); accepted: a new job id, or the same task and payload to "
                "repeat it idempotently"
            )
        return _scheduled(job_id, found)

    def remember(self, job_ids: list[str], entries: list[Entry]) -> None:
        """Remember jobs whose ids are new (drawn by this client a moment ago, so
        they cannot conflict): what :meth:`claim` stores, for a batch at once
        (``job_ids[i]`` is the job of ``entries[i]``)."""
        if not self.capacity:
            return
        with self._lock:
            self._pending_ids.extend(job_ids)
            self._pending.extend(entries)
            if len(self._pending_ids) >= 3 * self._generation:
                self._drop_overtaken()

    def _index(self) -> None:
        """Put the remembered jobs into the generations, as inserting them one by
        one would (lock held). Ids are new, so each insert adds one entry: the
        pending ones fill the young generation to its size, then whole new ones."""
        ids, entries = self._pending_ids, self._pending
        if not ids:
            return
        self._pending_ids, self._pending = [], []
        size = self._generation
        start, end = 0, len(ids)
        while start < end:
            young = self._young
            room = size - len(young)
            if start == 0 and room >= end:  # the common case: no slices
                young.update(zip(ids, entries, strict=True))
            else:
                stop = start + room
                young.update(zip(ids[start:stop], entries[start:stop], strict=True))
            start += room
            if len(young) >= size:
                self._old = young
                self._young = {}

    def _drop_overtaken(self) -> None:
        """Drop the pending jobs that inserting would drop again: all but the last
        generation they complete and the one they start (lock held)."""
        size = self._generation
        # The young generation and the pending jobs as one sequence, cut every
        # `size` entries: what survives is its last full generation and the rest.
        total = len(self._young) + len(self._pending_ids)
        last_full = total // size - 1  # the generation that ends up old
        if last_full < 1:
            return
        cut = last_full * size - len(self._young)  # its first job among the pending
        self._young, self._old = {}, {}
        del self._pending_ids[:cut]
        del self._pending[:cut]

    def move(self, job_id: str, due_ms: int, partition: int) -> None:
        """A job this client remembers was rescheduled: remember its new due time."""
        with self._lock:
            found = self._find(job_id)
            if found is not None:
                moved = (found[0], due_ms, found[2], found[3], found[4], partition)
                # where _find left it: the young generation, or the old one if
                # moving it there filled the young one
                if job_id in self._young:
                    self._young[job_id] = moved
                else:
                    self._old[job_id] = moved

    def forget(self, job_id: str) -> None:
        """Drop ``job_id`` (its write failed, so a retry must write again)."""
        with self._lock:
            self._index()
            self._young.pop(job_id, None)
            self._old.pop(job_id, None)


def _scheduled(job_id: str, e: Entry) -> Scheduled:
    return Scheduled(job_id, e[1], e[2], e[3], e[4], e[0], e[5], duplicate=True)
