"""``dueflow worker``: run task handlers.

    dueflow worker --app mypkg.tasks --queues billing,default --concurrency 64 --processes 2

``--app`` names modules whose ``@task`` functions are the handlers and whose
``@on_startup``/``@on_shutdown``/``@on_failure`` functions are the worker's
lifecycle hooks (repeatable or comma-separated; a startup hook that raises
stops the worker with exit code 5). ``--queues`` selects the queues to consume;
without it, the queues the registered tasks are routed to (``[routes]``, then
``@task(queue=...)``). A queue's spec (partitions, retry tiers, limits) comes
from the queue registry (``dueflow queue create``) or the static settings
(TOML or ``DUEFLOW_QUEUES``; the registry wins); ``name:partitions`` here
defines one statically. A queue that exists in neither yet is waited for: the
worker serves it as soon as it is created (docs/queues.md).

``--max-memory 800MiB``: a process whose resident memory reaches it finishes
its jobs, leaves its groups and restarts (``--processes N``: the supervisor
starts a fresh child; one process: it restarts in place, same pid). A process
whose event loop an async handler keeps blocked restarts the same way
(docs/workers.md, "Watchdog").
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import tempfile
from typing import Any

from dueflow.apps.cli.common import (
    add_global_options,
    add_listener_options,
    check_cluster,
    settings_from_args,
)
from dueflow.byte_size import parse_byte_size
from dueflow.config import QueueSpec, Settings
from dueflow.errors import InvalidInput
from dueflow.observability import logs
from dueflow.observability.health import HEARTBEAT_SAMPLE, READY_SAMPLE, ChildrenHealth, Health
from dueflow.observability.metrics import Metrics, enable_multiprocess, merged_samples, serve


def register(sub: Any) -> None:
    p = sub.add_parser(
        "worker",
        help="run task handlers for one or more queues",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_global_options(p, service=True)
    p.add_argument(
        "--app",
        action="append",
        required=True,
        help="module(s) with @task handlers and worker hooks, e.g. mypkg.tasks "
        "(repeatable, comma-separated)",
    )
    p.add_argument("--concurrency", type=int, help="jobs running at once per process")
    p.add_argument("--processes", type=int, help="worker processes (group members) to run")
    p.add_argument(
        "--drain-timeout", type=float, help="seconds in-flight jobs may finish at shutdown"
    )
    p.add_argument(
        "--max-memory",
        metavar="SIZE",
        help="restart a worker process after its jobs once its resident memory reaches "
        "SIZE (bytes, or with a unit: 800M, 1.5GiB); off by default "
        "(env DUEFLOW_WORKER_MAX_MEMORY)",
    )
    p.add_argument(
        "--job-log",
        choices=["all", "failures"],
        help="log every job's start and success too (all, the default) or only failed "
        "attempts, retries and dead letters (env DUEFLOW_OBSERVABILITY_JOB_LOG)",
    )
    add_listener_options(p, merged=True)
    p.set_defaults(func=_run)


def _selected(text: str | None) -> list[tuple[str, int | None]]:
    out: list[tuple[str, int | None]] = []
    for part in filter(None, (x.strip() for x in (text or "").split(","))):
        name, _, partitions = part.partition(":")
        try:
            out.append((name.strip(), int(partitions) if partitions else None))
        except ValueError as exc:
            raise InvalidInput("--queues", part, "name or name:partitions") from exc
    return out


def worker_settings(args: argparse.Namespace) -> tuple[Settings, list[str] | None]:
    """Settings from the usual sources plus this command's flags; the queues to consume."""
    selection = _selected(getattr(args, "queues", None))
    args.queues = None  # a selection here, not a redefinition of the configured queues
    settings = settings_from_args(args)
    known = {q.name for q in settings.queues}
    # name:partitions defines a static queue; a bare name is looked up (registry).
    extra = [
        QueueSpec(name, partitions)
        for name, partitions in selection
        if name not in known and partitions
    ]
    worker = settings.worker
    changes: dict[str, Any] = {}
    if args.concurrency is not None:
        changes["concurrency"] = args.concurrency
    if args.processes is not None:
        changes["processes"] = args.processes
    if args.drain_timeout is not None:
        changes["shutdown_grace_s"] = args.drain_timeout
    if getattr(args, "max_memory", None) is not None:
        try:
            changes["max_memory"] = parse_byte_size(args.max_memory)
        except ValueError as exc:
            raise InvalidInput("--max-memory", args.max_memory, str(exc)) from exc
    settings = dataclasses.replace(
        settings,
        queues=settings.queues + tuple(extra),
        worker=dataclasses.replace(worker, **changes),
    )
    observed: dict[str, Any] = {}
    if getattr(args, "job_log", None) is not None:
        observed["job_log"] = args.job_log
    if observed:
        settings = dataclasses.replace(
            settings, observability=dataclasses.replace(settings.observability, **observed)
        )
    return settings.validate(), [name for name, _ in selection] or None


def _run(args: argparse.Namespace) -> int:
    # imported here: the worker package and runtime (50-350 ms) load for this command only
    from dueflow.consumers.registry import TaskRegistry

    settings, queues = worker_settings(args)
    app = [m.strip() for item in args.app for m in item.split(",") if m.strip()]
    # The app first: an import error is the answer at once, not after waiting
    # for a cluster that may be down too.
    registry = TaskRegistry.from_modules(app)
    obs = settings.observability
    health = Health(liveness_timeout_s=obs.liveness_timeout_s)
    if settings.worker.processes > 1:
        from dueflow.consumers.supervisor import Supervisor  # this command's only

        own_dir = None
        on_turn = None
        if obs.metrics_port is not None:
            directory = os.environ.get("PROMETHEUS_MULTIPROC_DIR")
            if not directory:
                directory = own_dir = tempfile.mkdtemp(prefix="dueflow-metrics-")
            enable_multiprocess(directory)  # before the children start
            # The view merged over the children; the probes ask the children's gauges.
            merged = ChildrenHealth(
                health,
                expected=settings.worker.processes,
                samples=lambda: merged_samples([READY_SAMPLE, HEARTBEAT_SAMPLE]),
            )
            parent = Metrics()
            serve(parent, obs.metrics_port, addr=obs.metrics_bind, health=merged)

            def on_turn() -> None:
                merged.publish(parent.ready, parent.loop_heartbeat)

        try:
            check_cluster(settings)  # before logging is set up and processes start
            logs.configure(obs.log_format, obs.log_level)
            return Supervisor(
                settings,
                app=app,
                queues=queues,
                processes=settings.worker.processes,
                health=health,
                on_turn=on_turn,
            ).run()
        finally:
            if own_dir is not None:
                shutil.rmtree(own_dir, ignore_errors=True)

    from dueflow.consumers.worker_process import run_worker  # this command's only

    metrics = Metrics()
    if obs.metrics_port is not None:
        # First: the probes answer (live, not ready) while the cluster is waited for.
        serve(metrics, obs.metrics_port, addr=obs.metrics_bind, health=health)
    check_cluster(settings)  # before logging is set up
    logs.configure(obs.log_format, obs.log_level)
    # One process has no supervisor: a restart (max_memory, a blocked loop) is in place.
    return run_worker(
        settings,
        registry,
        queues=queues,
        metrics=metrics,
        restart_in_place=True,
        health=health,
    )
