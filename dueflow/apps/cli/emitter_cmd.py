"""``dueflow emitter``: run one emitter process (active or hot standby)."""

from __future__ import annotations

import argparse
import gc
import os
import signal
import threading
from types import FrameType
from typing import Any

from dueflow.apps.cli.common import add_global_options, check_cluster, settings_from_args
from dueflow.observability import logs
from dueflow.observability.metrics import Metrics, serve
from dueflow.observability.tracing import JobTracer
from dueflow.streams.emitter.process import EmitterProcess


def register(sub: Any) -> None:
    p = sub.add_parser(
        "emitter",
        help="run an emitter: fires due timers while it holds the lease, else stands by",
    )
    add_global_options(p, service=True)
    p.add_argument(
        "--metrics-port",
        type=int,
        help="serve Prometheus /metrics on this port (env DUEFLOW_OBSERVABILITY_METRICS_PORT)",
    )
    p.set_defaults(func=_run)


def _run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    check_cluster(settings)  # before signal handlers, metrics, the GC freeze
    obs = settings.observability
    logs.configure(obs.log_format, obs.log_level)
    metrics = Metrics()
    port = args.metrics_port if args.metrics_port is not None else obs.metrics_port
    if port is not None:
        serve(metrics, port)
    stop = threading.Event()

    def _stop(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    # The heap holds tens of thousands of small acyclic objects; the default
    # cyclic-GC thresholds would scan them over and over on the hot path.
    gc.freeze()
    gc.set_threshold(50_000, 50, 100)
    tracer = JobTracer.from_env(os.environ, service_name="dueflow-emitter")
    try:
        EmitterProcess(settings, metrics, tracer=tracer).run(stop)
    finally:
        tracer.close()
    return 0
