"""One worker process: a :class:`~dueflow.consumers.worker_loop.Worker` run until
SIGTERM or SIGINT (:func:`run_worker`).

The first signal begins a graceful shutdown (:meth:`Worker.stop`: in-flight
jobs finish for up to ``worker.shutdown_grace_s``, what finished is
committed). Whose sync handler threads still run then, the groups are not
left: the process exits and its partitions move after the session timeout, so
no job runs in two places at once. A second signal exits at once; what was
not committed is redelivered in the same way.

Restarts (:mod:`dueflow.consumers.restart`): a worker that stops to restart
(``worker.max_memory``, a blocked event loop: :mod:`dueflow.consumers.worker_watchdog`)
execs the same command line again (``restart_in_place``), or returns or exits
with :data:`~dueflow.consumers.restart.RESTART_EXIT_CODE` for whatever runs it.

The worker's parts are importable from here: :class:`Worker`
(:mod:`~dueflow.consumers.worker_loop`), :func:`select_queues`
(:mod:`~dueflow.consumers.queue_selection`), :func:`default_stores` and
:func:`default_steering_stores` (:mod:`~dueflow.consumers.worker_startup`).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import signal
from collections.abc import Sequence

from dueflow.config import Settings
from dueflow.consumers.queue_selection import select_queues
from dueflow.consumers.registry import TaskRegistry
from dueflow.consumers.restart import RESTART_EXIT_CODE, RESTARTED_ENV, ProcessRestart
from dueflow.consumers.store import StoreFactory
from dueflow.consumers.worker_loop import Worker
from dueflow.consumers.worker_startup import default_steering_stores, default_stores
from dueflow.observability.health import Health
from dueflow.observability.logs import event
from dueflow.observability.metrics import Metrics
from dueflow.observability.tracing import JobTracer

__all__ = [
    "GEN0_THRESHOLD",
    "GEN1_THRESHOLD",
    "Worker",
    "default_steering_stores",
    "default_stores",
    "run_worker",
    "select_queues",
    "tune_gc",
]

_LOG = logging.getLogger("dueflow.worker")

# Young objects the cyclic GC lets accumulate before a pass. Not more: a pass
# scans them all while the loop waits (at 5,000 jobs/s on two workers, 10,000
# pause it for about 4 ms at the median; 50,000, for 23 ms and up to 119 ms,
# at the same CPU per job).
GEN0_THRESHOLD = 10_000
# Gen-0 passes between two gen-1 passes (Python's default: 10). A gen-1 pass
# scans every object that outlived a gen-0 pass and is still alive (records read
# and not committed yet), so each costs about the same however rare: at 100 the
# collector's CPU in a burst halves (0.49 -> 0.28 s per 200,000 jobs, one worker
# process), its longest pause about 40 ms once in those jobs.
GEN1_THRESHOLD = 100


def tune_gc(threshold: int = GEN0_THRESHOLD) -> None:
    """Fewer cyclic-GC passes in a worker process, none of them long.

    A job allocates a handful of container objects (record wrapper, context,
    tuples) that die by reference counting; with the default gen-0
    threshold (700) the collector runs every ~100 jobs and costs about a
    third of a no-op job. Objects from start-up are frozen (never scanned
    again) and the gen-0 threshold is raised, to :data:`GEN0_THRESHOLD`: a
    pass scans every young object, so its pause grows with the threshold,
    and the jobs due meanwhile wait for it. Gen-1 passes come every
    :data:`GEN1_THRESHOLD` gen-0 passes. Only for processes that run a
    worker and nothing else: :func:`run_worker` calls it, an application
    that embeds :class:`Worker` decides for itself.
    """
    gc.freeze()
    gen2 = gc.get_threshold()[2]
    gc.set_threshold(threshold, GEN1_THRESHOLD, gen2)


def run_worker(
    settings: Settings,
    registry: TaskRegistry,
    *,
    queues: Sequence[str] | None = None,
    metrics: Metrics | None = None,
    stores: StoreFactory | None = None,
    restart_in_place: bool = False,
    health: Health | None = None,
) -> int:
    """Run a :class:`Worker` in this process until SIGTERM/SIGINT; return the exit code.

    When the worker stops to restart (``worker.max_memory``, a blocked event
    loop), ``restart_in_place`` execs the same command line again (a process
    with no supervisor); otherwise it returns, or exits with,
    :data:`~dueflow.consumers.restart.RESTART_EXIT_CODE` (75) for whatever runs
    it to start it again (:mod:`dueflow.consumers.restart`).
    """

    tune_gc()

    tracer = JobTracer.from_env(os.environ, service_name="dueflow-worker")
    metrics = metrics or Metrics()
    restart = ProcessRestart(in_place=restart_in_place)
    restarted = os.environ.pop(RESTARTED_ENV, None)
    if restarted:
        # The image before this one restarted in place: it could not count it.
        metrics.worker_restarts.labels(restarted).inc()
        event(_LOG, "worker process restarted in place", reason=restarted, pid=os.getpid())

    async def main() -> Worker:
        worker = Worker(
            settings,
            registry,
            queues=queues,
            metrics=metrics,
            stores=stores,
            tracer=tracer,
            process_exits=True,
            restart=restart,
            health=health,
        )
        received = _stop_on_signals(worker)
        await worker.run()
        _after_run(worker, signalled=bool(received), restart=restart, metrics=metrics)
        if not worker.left_groups:
            # No interpreter teardown: it would close the consumers, i.e. leave.
            tracer.close()
            if worker.restart_reason is not None:
                restart(worker.restart_reason)
            logging.shutdown()
            os._exit(worker.exit_code)
        return worker

    try:
        worker = asyncio.run(main())
    finally:
        tracer.close()
    if worker.restart_reason is not None and restart.in_place:
        restart(worker.restart_reason)
    return worker.exit_code


def _stop_on_signals(worker: Worker) -> list[int]:
    """SIGTERM and SIGINT on the running loop: the first stops ``worker`` gracefully,
    a second exits at once. Returns the signals received (filled as they come)."""
    received: list[int] = []

    def on_signal(signum: int) -> None:
        received.append(signum)
        if len(received) == 1:
            event(_LOG, "shutting down", signal=signal.Signals(signum).name)
            worker.stop()
        else:
            event(_LOG, "second signal: exiting now", logging.WARNING)
            logging.shutdown()
            os._exit(128 + signum)

    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, on_signal, signum)
    return received


def _after_run(
    worker: Worker, *, signalled: bool, restart: ProcessRestart, metrics: Metrics
) -> None:
    """A worker that stopped to restart (and not on a signal) exits with
    RESTART_EXIT_CODE, counted; after a signal it does not restart."""
    if worker.restart_reason is not None and not signalled:
        if not restart.counted_by_successor:
            metrics.worker_restarts.labels(worker.restart_reason).inc()
        event(
            _LOG,
            "worker process restarting",
            reason=worker.restart_reason,
            in_place=restart.in_place,
            left_groups=worker.left_groups,
        )
        worker.exit_code = RESTART_EXIT_CODE
    else:
        worker.restart_reason = None
