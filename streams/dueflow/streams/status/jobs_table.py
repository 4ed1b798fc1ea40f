"""The status view's ``jobs`` table: job id -> the job's view, in a faust table.

:func:`jobs_table` makes the table on a faust app, stored by a
:class:`~dueflow.streams.status.job_store.JobStore` over the view's job file (a
SQLite file, or its in-memory stand-in when ``status_store`` is ``memory``). A
file that holds nothing yet is first filled from the whole changelog in bulk
(:mod:`.changelog_load`); on stop, the store waits until the changelog has stored
every record the fold sent (``changelog``), then writes their rows.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import faust

from dueflow.config import Settings
from dueflow.observability.metrics import Metrics
from dueflow.streams.status.changelog_load import load_changelog
from dueflow.streams.status.changelog_writer import ChangelogWriter
from dueflow.streams.status.job_file import JobFile, MemoryJobFile
from dueflow.streams.status.job_store import JobStore

RECOVERY_BATCH = 10_000  # changelog records per job-file transaction at recovery


class JobsTable(faust.Table[str, bytes]):
    """The ``jobs`` table, stored by a :class:`JobStore` made by ``make_store``."""

    def __init__(self, app: Any, *, make_store: Callable[[Any], JobStore], **kw: Any) -> None:
        self._make_store = make_store
        super().__init__(app, **kw)

    def _new_store(self) -> JobStore:
        return self._make_store(self)


def jobs_table(
    app: Any,
    settings: Settings,
    *,
    job_file_path: Path,
    changelog_topic: str,
    changelog: ChangelogWriter,
    metrics: Metrics,
    on_recovered: Callable[[frozenset[int]], None],
) -> JobsTable:
    """The ``jobs`` table of ``app`` (not yet added to its tables), its rows in the file
    at ``job_file_path``; ``on_recovered`` is called with the active partitions after
    each recovery."""
    s = settings
    obs = s.observability
    # Keys and values are JSON; the jobs' values are sent as bytes made by orjson.
    return JobsTable(
        app,
        name="jobs",
        default=None,
        partitions=s.outcomes_partitions,
        help="job id -> the job's current view",
        value_type=bytes,
        recovery_buffer_size=RECOVERY_BATCH,
        beacon=app.tables.beacon,
        make_store=lambda table: JobStore(
            "sqlite://",
            app,
            table,
            table_name=table.name,
            loop=table.loop,
            file=(
                MemoryJobFile(job_file_path)
                if obs.status_store == "memory"
                else JobFile(job_file_path, cache_mib=obs.status_cache_mib)
            ),
            hot_jobs=obs.status_hot_jobs,
            on_restored=metrics.status_restored.inc,
            preload=functools.partial(load_changelog, s, changelog_topic, s.outcomes_partitions),
            drain=lambda: changelog.stored(),
            on_recovered=on_recovered,
        ),
    )
