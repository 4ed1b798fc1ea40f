"""How the in-memory client finds a job: every outcome record in the log, and its
timer record.

The same fold as on a cluster (:func:`dueflow.rules.job_status.job_status`), over
every record of the outcomes topic (memory has no scan window); the timer is
the newest record of the job in the timer (else exec) topic.
"""

from __future__ import annotations

from dueflow import headers as hdr
from dueflow.config import Settings
from dueflow.errors import UndecodableRecord
from dueflow.kafka.topics import names
from dueflow.producers.timer_finder import FoundTimer, WantedTimer
from dueflow.records import codec
from dueflow.rules.job_status import JobStatus, job_status
from dueflow.testing.log import MemoryLog


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


class MemoryTimerFinder:
    """:class:`~dueflow.producers.timer_finder.TimerFinder` over a :class:`MemoryLog`: the
    newest timer (else exec) record of the job. Memory keeps every record, fired or
    not; whether the job is still pending is what its outcomes say."""

    def __init__(self, settings: Settings, log: MemoryLog) -> None:
        self._names = names(settings)
        self._log = log

    def find(self, wanted: WantedTimer, *, now_ms: int) -> FoundTimer | None:
        key, job = wanted.key.encode(), wanted.job_id.encode()
        for topic in (self._names.timers, self._names.exec(wanted.queue)):
            found = [
                r
                for r in self._log.records(topic)
                if r.key() == key and hdr.header(r.headers(), hdr.JOB_ID) == job
            ]
            if found:
                return FoundTimer.of_record(found[-1], fired=topic != self._names.timers)
        return None
