"""Test ``@task`` handlers without Kafka: dueflow's pipeline in memory, on a fake clock.

::

    from dueflow.testing import InMemoryPipeline

    def test_invoice_is_sent_after_ten_minutes():
        with InMemoryPipeline([send_invoice]) as pipeline:
            job = pipeline.scheduler.schedule("send-invoice", {"id": 7}, delay="10m")
            pipeline.advance(minutes=10)
            assert [r.outcome for r in pipeline.runs(job.job_id)] == ["succeeded"]

- :class:`InMemoryPipeline`: the scheduling client (:class:`InMemoryScheduler`,
  the real :class:`dueflow.Scheduler` over an in-memory log), the emitter and a
  worker (:class:`InMemoryWorker`) running your handlers, eagerly or on a
  :class:`FakeClock`; inspection for assertions (runs, pending jobs, dead
  letters, a job's state).
- :func:`make_context`: a :class:`~dueflow.TaskContext` for calling a handler
  directly (``TaskContext.for_test``).
- ``pytest_plugins = ["dueflow.testing.pytest_plugin"]``: the fixtures
  ``dueflow_pipeline`` (an :class:`InMemoryPipeline` on a fake clock) and
  ``dueflow_eager`` (each job runs when it is scheduled), which run the handlers
  of the ``dueflow_tasks`` fixture with the settings of ``dueflow_settings``
  (override both in your tests).

Scheduling checks, retries, backoff and jitter, dead letters, timeouts,
idempotency keys, cron occurrences and misfires, follow-up jobs
(``ctx.schedule``) and worker hooks are computed by dueflow's own code, the
same that runs against Kafka; where memory differs (one job at a time, no
rate limits, process isolation in-process) the modules say so. The user guide's
"Testing your handlers" (docs/testing.md) has the details.

Not to be confused with :mod:`dueflow.consumers.testing`: helpers that write
exec records to a real broker, for dueflow's own integration tests and
benchmarks.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dueflow.lazy_exports import lazy_exports

if TYPE_CHECKING:  # what type checkers see of the lazy names below ("X as X": exported)
    from dueflow.apps.ops.dlq import DeadLetterEntry as DeadLetterEntry
    from dueflow.consumers.context import TaskContext as TaskContext
    from dueflow.consumers.failures import Failure as Failure
    from dueflow.consumers.failures import JobTimeout as JobTimeout
    from dueflow.testing.clock import FakeClock as FakeClock
    from dueflow.testing.context import make_context as make_context
    from dueflow.testing.emitter import Quarantined as Quarantined
    from dueflow.testing.hooks import HookError as HookError
    from dueflow.testing.pipeline import InMemoryPipeline as InMemoryPipeline
    from dueflow.testing.pipeline import RunawayJobs as RunawayJobs
    from dueflow.testing.scheduler import InMemoryScheduler as InMemoryScheduler
    from dueflow.testing.views import JobRun as JobRun
    from dueflow.testing.views import JobState as JobState
    from dueflow.testing.views import PendingJob as PendingJob
    from dueflow.testing.worker import InMemoryWorker as InMemoryWorker

# Imported on first use: the pytest plugin (a submodule) loads this package, and a
# test run that never asks for a fixture should not pay for the pipeline's imports.
_EXPORTS = {
    "DeadLetterEntry": "dueflow.apps.ops.dlq",
    "FakeClock": "dueflow.testing.clock",
    "Failure": "dueflow.consumers.failures",
    "HookError": "dueflow.testing.hooks",
    "InMemoryPipeline": "dueflow.testing.pipeline",
    "InMemoryScheduler": "dueflow.testing.scheduler",
    "InMemoryWorker": "dueflow.testing.worker",
    "JobRun": "dueflow.testing.views",
    "JobState": "dueflow.testing.views",
    "JobTimeout": "dueflow.consumers.failures",
    "PendingJob": "dueflow.testing.views",
    "Quarantined": "dueflow.testing.emitter",
    "RunawayJobs": "dueflow.testing.pipeline",
    "TaskContext": "dueflow.consumers.context",
    "make_context": "dueflow.testing.context",
}


__all__ = [
    "DeadLetterEntry",
    "Failure",
    "FakeClock",
    "HookError",
    "InMemoryPipeline",
    "InMemoryScheduler",
    "InMemoryWorker",
    "JobRun",
    "JobState",
    "JobTimeout",
    "PendingJob",
    "Quarantined",
    "RunawayJobs",
    "TaskContext",
    "make_context",
]

if not TYPE_CHECKING:  # type checkers see the imports above, not Any
    __getattr__ = lazy_exports(__name__, _EXPORTS, globals())
