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
from dueflow.producers.steering_commands import Verdict
from dueflow.producers.timer_finder import FoundTimer, WantedTimer
from dueflow.producers.verdicts import Mark, outcome_verdict
from dueflow.records import codec
from dueflow.rules.job_status import JobStatus, job_status, scheduled_content_hash
from dueflow.testing.log import MemoryLog


class MemoryLookup:
    """:class:`~dueflow.producers.lookup.JobLookup` over a :class:`MemoryLog`."""

    def __init__(self, settings: Settings, log: MemoryLog) -> None:
        self._topic = names(settings).outcomes
        self._log = log

    def status(self, job_id: str, *, timeout_s: float | None = None) -> JobStatus | None:
        key = job_id.encode()
        found = []
        content_hash = None
        for record in self._log.records(self._topic):
            if record.key() != key:
                continue
            try:
                version = codec.parse_schema_header(
                    hdr.header(record.headers(), hdr.SCHEMA), expected="outcome"
                )
                outcome = codec.decode("outcome", record.value() or b"", writer_version=version)
            except UndecodableRecord:
                continue  # the status view skips it too
            found.append((record.partition(), outcome))
            content_hash = scheduled_content_hash(outcome, record.headers()) or content_hash
        return job_status(job_id, found, source="memory", content_hash=content_hash)


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


class MemoryVerdicts:
    """:class:`~dueflow.producers.verdicts.Verdicts` over a :class:`MemoryLog`: the
    pipeline's worker applies a command as soon as it is written, so its verdict is
    in the log when the call asks (no waiting)."""

    def __init__(self, settings: Settings, log: MemoryLog) -> None:
        self._topic = names(settings).outcomes
        self._log = log

    def mark(self, job_id: str) -> Mark:
        return Mark(job_id, 0, len(self._log.records(self._topic)))

    def wait(self, mark: Mark, command_id: str, timeout_s: float) -> Verdict | None:
        for record in self._log.records(self._topic)[mark.offset :]:
            found = outcome_verdict(
                record.key(), record.value(), record.headers(), mark.job_id, command_id
            )
            if found is not None:
                return found
        return None

    def close(self) -> None:
        pass
