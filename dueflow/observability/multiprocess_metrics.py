"""Metrics of ``dueflow worker --processes N``: the children write their samples to
files in ``PROMETHEUS_MULTIPROC_DIR`` and the parent serves their merged view.

Call :func:`enable_multiprocess` in the parent before the children start and before
any :class:`~dueflow.observability.metrics.Metrics` is built, and
:func:`process_exited` when a child ends.
"""

from __future__ import annotations

import glob
import os
import struct
from collections.abc import Iterable
from pathlib import Path

from prometheus_client import CollectorRegistry, multiprocess, values
from prometheus_client.metrics_core import Metric


def multiprocess_enabled() -> bool:
    """Whether this process writes (and serves) multiprocess metrics."""
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


def enable_multiprocess(directory: str | os.PathLike[str], *, clean: bool = True) -> Path:
    """Switch this process (and children started after) to multiprocess metrics.

    Call it in the parent of ``--processes N`` before any :class:`Metrics` is
    built. prometheus_client picks its value store when it is first imported,
    so setting ``PROMETHEUS_MULTIPROC_DIR`` later is not enough: this also
    re-selects the store. ``clean`` removes files of an earlier run (stale
    counters would otherwise be summed in).
    """
    path = Path(directory)
    path.mkdir(parents=True, exist_ok=True)
    if clean:
        for stale in path.glob("*.db"):
            stale.unlink()
    os.environ["PROMETHEUS_MULTIPROC_DIR"] = str(path)
    values.ValueClass = values.get_value_class()  # type: ignore[no-untyped-call]
    return path


def process_exited(pid: int) -> None:
    """Drop the live gauges of a child that exited (multiprocess mode only)."""
    if multiprocess_enabled():
        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]


_HEADER_BYTES = 8  # a sample file's "bytes used" word and its padding


class _ChildFilesCollector(multiprocess.MultiProcessCollector):
    """The merged view of the children's sample files, skipping a file a child is
    creating at that moment (empty until the child has sized it).

    The library's own collector raises ``struct.error`` on such a file, so one child
    starting could fail a scrape, or a health turn, of all of them.
    """

    def __init__(self, registry: CollectorRegistry | None) -> None:
        super().__init__(registry)  # type: ignore[no-untyped-call]

    def collect(self) -> Iterable[Metric]:
        for _ in range(3):
            files = [
                f for f in glob.glob(os.path.join(self._path, "*.db")) if _size(f) >= _HEADER_BYTES
            ]
            try:
                merged: Iterable[Metric] = self.merge(  # type: ignore[no-untyped-call]
                    files, accumulate=True
                )
                return merged
            except struct.error:
                continue  # sized between the listing and the read: list again
        return []


def _size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def merged_registry() -> CollectorRegistry:
    """A registry of the merged view of every process's sample files."""
    registry = CollectorRegistry()
    _ChildFilesCollector(registry)
    return registry


def merged_samples(names: Iterable[str]) -> list[tuple[str, dict[str, str], float]]:
    """The samples named ``names`` in the merged multiprocess view (with their ``pid``
    label for per-process gauges); empty when multiprocess mode is off."""
    if not multiprocess_enabled():
        return []
    wanted = set(names)
    collector = _ChildFilesCollector(None)
    return [
        (s.name, dict(s.labels), float(s.value))
        for family in collector.collect()
        for s in family.samples
        if s.name in wanted
    ]
