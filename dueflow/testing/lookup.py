"""How the in-memory client finds a job: every outcome record in the log.

The same fold as on a cluster (:func:`dueflow.job_status.job_status`), over
every record of the outcomes topic (memory has no scan window).
"""

from __future__ import annotations

from dueflow import headers as hdr
from dueflow.config import Settings
from dueflow.errors import UndecodableRecord
from dueflow.job_status import JobStatus, job_status
from dueflow.schemas import codec
from dueflow.testing.log import MemoryLog
from dueflow.topics import names


class MemoryLookup:
    """:class:`~dueflow.producers.lookup.JobLookup` over a :class:`MemoryLog`."""

    def __init__(self, settings: Settings, log: MemoryLog) -> None:
        self._topic = names(settings).outcomes
        self._log = log

    def status(self, job_id: str) -> JobStatus | None:
        key = job_id.encode()
        found = []
        for record in self._log.records(self._topic):
            if record.key() != key:
                continue
            try:
                version = codec.parse_schema_header(
                    hdr.header(record.headers(), hdr.SCHEMA), expected="outcome"
                )
                found.append(
                    (
                        record.partition(),
                        codec.decode("outcome", record.value() or b"", writer_version=version),
                    )
                )
            except UndecodableRecord:
                continue  # the status view skips it too
        return job_status(job_id, found, source="memory")
