"""The ``jobs`` table's faust store: a SQLite file behind the compacted changelog.

faust keeps a table in a store and rebuilds it from the table's changelog
topic. With its memory store every start re-reads the whole changelog and
every job's view lives in RAM (about 1 KB a job). :class:`JobStore` keeps the
views in a :class:`~dueflow.streams.status.job_file.JobFile` instead, which
remembers, per changelog partition, the offset it holds everything up to
(:meth:`persisted_offset`): faust's recovery then reads only the newer
records, and a deleted file is made again from the whole changelog (first in
bulk by ``preload``, :mod:`.changelog_load`, then by faust for the rest).

The file only ever holds what the changelog holds. The view's fold stages a
job's new view (:meth:`stage`: answered at once, from memory) and sends its
changelog record; the row is written when the broker has acknowledged that
record (:meth:`saved`, then :meth:`flush`: one transaction for everything
acknowledged, rows and offsets together). So a crash at any point leaves a
file that matches the changelog up to its offsets. The per-queue counts are
counted from the file after each recovery (:meth:`count_states`, then
``on_recovered``), so they agree with the views after any crash.

Reads look in the staged views, then a bounded LRU of recently written views
(``hot_jobs``; a job's outcomes mostly come close together, and the fold needs
the previous view for each), then the rows the fold read for its batch in one
query (:meth:`prefetch`), then the file. Memory is bounded by settings,
not by the number of jobs: the LRU, SQLite's page cache (``cache_mib``) and
the staged views of the batches in flight.

Jobs of a changelog partition this view is not active for are not answered
(as faust's memory store drops them): another view instance owns them.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from typing import Any

import orjson
from faust.stores import base as faust_stores

from dueflow.observability.logs import event
from dueflow.rules.job_state import count_deltas
from dueflow.streams.status.job_file import JobRow, JobRows
from dueflow.streams.status.job_search import Cursor, JobFilter, JobPage

log = logging.getLogger("dueflow.status")


class Staged:
    """A view the fold wrote whose changelog record is not acknowledged yet
    (``view`` None: the job leaves the table), with its row to write then."""

    __slots__ = ("partition", "row", "view")

    def __init__(self, partition: int, view: bytes | None, row: JobRow | None) -> None:
        self.partition = partition
        self.view = view
        self.row = row


def job_id_of_key(key: bytes) -> str:
    """The job id of a changelog key (JSON-encoded by faust's default key serializer)."""
    if key[:1] == b'"':
        return str(orjson.loads(key))
    return key.decode()


class JobStore(faust_stores.Store[str, Any]):
    """faust store of the ``jobs`` table (see the module doc)."""

    def __init__(
        self,
        url: Any,
        app: Any,
        table: Any,
        *,
        file: JobRows,
        hot_jobs: int,
        on_restored: Callable[[int], None] | None = None,
        preload: Callable[[JobRows], int] | None = None,
        on_recovered: Callable[[frozenset[int]], None] | None = None,
        drain: Callable[[], Awaitable[None]] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(url, app, table, **kwargs)
        self.file = file
        self.hot_jobs = hot_jobs
        self._on_restored = on_restored
        self._preload = preload
        self._on_recovered = on_recovered
        self._drain = drain
        self._opened = False
        self._hot: OrderedDict[str, tuple[int, bytes]] = OrderedDict()
        self._staged: dict[str, Staged] = {}
        # Rows of the jobs of the batch being folded, read together (None: no row).
        self._prefetched: dict[str, tuple[int, bytes] | None] = {}
        self._acked: list[tuple[str, int, Staged]] = []
        # Changelog partitions this view answers for; None until the first recovery
        # (a view used without faust's recovery, as in unit tests, answers all).
        self.active: frozenset[int] | None = None
        self.restored = 0  # changelog records applied from the changelog since start
        self._crashing: asyncio.Future[None] | None = None

    # ------------------------------------------------------------------ file
    def _file(self) -> JobRows:
        if not self._opened:
            self.file.open()
            self._opened = True
        return self.file

    async def on_start(self) -> None:
        """Open the file; an empty one is first filled by ``preload`` (in bulk, on a
        thread), so faust's recovery reads only what came after; then the search
        indexes are made where missing (on a thread)."""
        file = self._file()
        loop = asyncio.get_running_loop()
        if self._preload is not None and not file.offsets:
            try:
                loaded = await loop.run_in_executor(None, self._preload, file)
            except Exception as exc:  # faust's recovery reads what the load did not
                event(log, "status.job_file_load_failed", logging.WARNING, error=repr(exc))
            else:
                self._count_restored(loaded)
        # After the bulk load (an index is faster built over rows than kept while
        # loading them), off the loop (the probes keep answering meanwhile).
        took = await loop.run_in_executor(None, file.ensure_search_indexes)
        if took > 1.0:
            event(log, "status.job_file_indexed", path=str(file.path), seconds=round(took, 1))

    def _count_restored(self, n: int) -> None:
        self.restored += n
        if self._on_restored is not None:
            self._on_restored(n)

    async def on_stop(self) -> None:
        try:
            if self._drain is not None:
                await self._drain()  # the acknowledgements of what was sent
        except Exception as exc:  # stopping anyway: the changelog has what the file lacks
            event(log, "status.flush_on_stop_failed", logging.WARNING, error=repr(exc))
        self.flush()
        self.file.close()
        self._opened = False

    # ------------------------------------------------------------- the fold
    def raw(self, job_id: str) -> bytes | None:
        """The JSON of ``job_id``'s view; None when this view does not know it."""
        staged = self._staged.get(job_id)
        if staged is not None:
            return staged.view
        found = self._hot.get(job_id)
        if found is None:
            prefetched = self._prefetched
            found = prefetched[job_id] if job_id in prefetched else self._file().get(job_id)
        if found is None or (self.active is not None and found[0] not in self.active):
            return None
        return found[1]

    def view(self, job_id: str) -> dict[str, Any] | None:
        """``job_id``'s view; None when this view does not know it."""
        raw = self.raw(job_id)
        return None if raw is None else dict(orjson.loads(raw))

    def prefetch(self, job_ids: Iterable[str]) -> None:
        """Read the rows of ``job_ids`` that are neither staged nor hot in one go (a
        batch's jobs, before the fold asks for each); kept until
        :meth:`forget_prefetched`."""
        staged, hot = self._staged, self._hot
        wanted = {j for j in job_ids if j not in staged and j not in hot}
        self._prefetched = dict.fromkeys(wanted)
        if wanted:
            self._prefetched.update(self._file().get_many(wanted))

    def forget_prefetched(self) -> None:
        """Drop the rows :meth:`prefetch` read (the batch's views are staged now)."""
        self._prefetched = {}

    def stage(
        self,
        job_id: str,
        partition: int,
        view: bytes | None,
        doc: Mapping[str, Any] | None = None,
    ) -> Staged:
        """The fold's new view of ``job_id`` (None: it leaves; ``doc``: the view
        parsed, if the caller has it), answered from now on; written to the file once
        :meth:`saved` says its changelog record is stored."""
        if view is None:
            row = None
        elif doc is None:
            row = JobRow.of(job_id, partition, view)
        else:
            row = JobRow.of_doc(job_id, partition, view, doc)
        staged = self._staged[job_id] = Staged(partition, view, row)
        hot = self._hot
        if view is None:
            hot.pop(job_id, None)
        else:
            hot[job_id] = (partition, view)
            hot.move_to_end(job_id)
            if len(hot) > self.hot_jobs:
                hot.popitem(last=False)
        return staged

    def saved(self, job_id: str, staged: Staged, offset: int) -> None:
        """The changelog record of ``staged`` is stored at ``offset`` of its partition."""
        self._acked.append((job_id, offset, staged))

    def flush(self) -> int:
        """Write every acknowledged view (and the offsets they reach) in one
        transaction; returns how many."""
        acked, self._acked = self._acked, []
        if not acked:
            return 0
        offsets: dict[int, int] = {}
        changes: list[tuple[str, JobRow | None]] = []
        for job_id, offset, staged in acked:
            p = staged.partition
            if offset > offsets.get(p, -1):
                offsets[p] = offset
            changes.append((job_id, staged.row))
        self._file().write(changes, offsets)
        staged_now = self._staged
        for job_id, _offset, staged in acked:
            if staged_now.get(job_id) is staged:
                del staged_now[job_id]
        return len(acked)

    def count_states(self, partitions: Iterable[int]) -> list[tuple[int, str, str, int]]:
        """``(partition, queue, state, n)`` of the views of ``partitions`` as they are
        answered: the file's rows, corrected by the views staged over them (``n`` of a
        correction is -1 or +1; rows of the same key add up)."""
        wanted = frozenset(partitions)
        file = self._file()
        out = file.count_states(wanted)
        for job_id, staged in self._staged.items():
            if staged.partition not in wanted:
                continue
            found = file.get(job_id)
            before = None if found is None else orjson.loads(found[1])
            after = None if staged.view is None else orjson.loads(staged.view)
            out += [(staged.partition, q, st, d) for q, st, d in count_deltas(before, after)]
        return out

    @property
    def unsaved(self) -> int:
        """Views staged whose rows are not written yet."""
        return len(self._staged)

    # ---------------------------------------------------- sweep and recents
    def finished_before(
        self, cutoff_ms: int, *, after: tuple[int, str] | None = None, limit: int = 1000
    ) -> list[JobRow]:
        """Rows of finished jobs quiet since ``cutoff_ms`` (see :meth:`JobFile.finished_before`)."""
        return self._file().finished_before(cutoff_ms, after=after, limit=limit)

    def is_staged(self, job_id: str) -> bool:
        return job_id in self._staged

    def newest(self, limit: int) -> list[str]:
        """Ids of the most recently updated jobs this view answers for, newest first."""
        return self._file().newest(limit, self.active)

    def search(self, flt: JobFilter, *, before: Cursor | None, limit: int) -> JobPage:
        """A page of the jobs ``flt`` finds among those this view answers for, newest
        first, from the file on this thread (see :class:`JobSearcher` for a thread of
        its own)."""
        return self._file().search(flt, before=before, limit=limit, partitions=self.active)

    # ------------------------------------------------------- faust's store API
    def persisted_offset(self, tp: Any) -> int | None:
        """The newest changelog offset of ``tp`` the file holds (faust reads after it)."""
        return self._file().offsets.get(int(tp.partition))

    def set_persisted_offset(self, tp: Any, offset: int) -> None:
        """Not used: offsets move with the rows they cover (:meth:`flush`)."""

    def apply_changelog_batch(
        self,
        batch: Iterable[Any],
        to_key: Callable[[Any], Any],
        to_value: Callable[[Any], Any],
    ) -> None:
        """Changelog records read by faust's recovery (or a standby) into the file."""
        changes: list[tuple[str, JobRow | None]] = []
        offsets: dict[int, int] = {}
        for ev in batch:
            msg = ev.message
            if msg.key is None:
                continue
            job_id = job_id_of_key(msg.key)
            p = int(msg.partition)
            if msg.offset > offsets.get(p, -1):
                offsets[p] = int(msg.offset)
            changes.append((job_id, None if msg.value is None else JobRow.of(job_id, p, msg.value)))
            self._staged.pop(job_id, None)  # the changelog is newer than anything staged
            self._hot.pop(job_id, None)
            self._prefetched.pop(job_id, None)
        if not changes and not offsets:
            return
        try:
            self._file().write(changes, offsets)
        except Exception as exc:
            # faust's recovery logs and drops a batch that raises: stop the view
            # instead, a restart reads the batch again (the offsets did not move).
            event(log, "status.job_file_write_failed", logging.ERROR, error=repr(exc))
            self._crashing = asyncio.ensure_future(self.crash(exc))
            raise
        self._count_restored(len(changes))

    async def need_active_standby_for(self, tp: Any) -> bool:
        return True

    async def on_rebalance(
        self,
        assigned: set[Any],
        revoked: set[Any],
        newly_assigned: set[Any],
        generation_id: int = 0,
    ) -> None:
        self.flush()
        if any(tp.topic in self.table.changelog_topic.topics for tp in revoked):
            self._hot.clear()  # another view may change them before they come back

    async def on_recovery_completed(self, active_tps: set[Any], standby_tps: set[Any]) -> None:
        topics = self.table.changelog_topic.topics
        self.active = frozenset(int(tp.partition) for tp in active_tps if tp.topic in topics)
        self.flush()
        file = self._file()
        event(
            log,
            "status.job_file_recovered",
            active=sorted(self.active),
            restored=self.restored,
            offsets={str(p): o for p, o in sorted(file.offsets.items())},
        )
        file.settle()
        if self._on_recovered is not None:
            self._on_recovered(self.active)

    def reset_state(self) -> None:
        """Delete the file: it is made again from the changelog."""
        self.file.close()
        self._opened = False
        for suffix in ("", "-wal", "-shm"):
            path = self.file.path.with_name(self.file.path.name + suffix)
            path.unlink(missing_ok=True)
        self._hot.clear()
        self._staged.clear()
        self._prefetched = {}

    async def backup_partition(
        self, tp: Any, flush: bool = True, purge: bool = False, keep: int = 1
    ) -> None:
        """Not supported (the changelog is the backup)."""

    def restore_backup(self, tp: Any, latest: bool = True, backup_id: int = 0) -> None:
        """Not supported (the changelog is the backup)."""

    # faust tables are mappings; the status view uses the methods above.
    def __getitem__(self, key: Any) -> Any:
        found = self.view(str(key))
        if found is None:
            raise KeyError(key)
        return found

    def __setitem__(self, key: Any, value: Any) -> None:
        raise TypeError("the jobs table is written with JobStore.stage")

    def __delitem__(self, key: Any) -> None:
        raise TypeError("the jobs table is written with JobStore.stage")

    def __contains__(self, key: object) -> bool:
        return self.raw(str(key)) is not None

    def __len__(self) -> int:
        return self._file().count()

    def __iter__(self) -> Iterator[Any]:
        return iter(self.newest(1 << 62))

    def __repr__(self) -> str:
        return f"<JobStore {self.file.path}>"

    def _clear(self) -> None:
        self.reset_state()
