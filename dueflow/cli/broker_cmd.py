"""``dueflow broker start|stop|status|fetch``: the local single-node broker."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from dueflow.broker.local import LocalBroker, fetch_jars, kafka_version
from dueflow.cli.common import print_json


def register(sub: Any) -> None:
    p = sub.add_parser("broker", help="run a local Kafka broker from Maven Central jars")
    bsub = p.add_subparsers(dest="broker_command", metavar="ACTION")
    bsub.required = True
    for name, func, help_ in (
        ("start", _start, "start the broker (a no-op if it runs) and wait until it answers"),
        ("stop", _stop, "stop the broker of the pid file and wait for it"),
        ("status", _status, "say whether the broker runs and answers"),
        ("fetch", _fetch, "resolve the broker jars with Maven into the cache"),
    ):
        sp = bsub.add_parser(name, help=help_)
        sp.add_argument("--port", type=int, default=9092, help="client port on 127.0.0.1")
        sp.add_argument("--controller-port", type=int, help="KRaft controller port (port+1)")
        sp.add_argument("--dir", type=Path, help="state directory (data, logs, pid file)")
        sp.add_argument("--cache", type=Path, help="jar cache (env DUEFLOW_CACHE)")
        sp.add_argument("--heap", default="1g", help="JVM heap, e.g. 512m or 1g")
        sp.add_argument("--json", action="store_true", help="machine-readable output")
        sp.set_defaults(func=func)


def _broker(args: argparse.Namespace) -> LocalBroker:
    return LocalBroker(
        port=args.port,
        controller_port=args.controller_port,
        state_dir=args.dir,
        cache_dir=args.cache,
        heap=args.heap,
    )


def _start(args: argparse.Namespace) -> int:
    broker = _broker(args)
    t0 = time.monotonic()
    pid, started = broker.start()
    elapsed = time.monotonic() - t0
    if args.json:
        print_json(
            {"pid": pid, "started": started, "bootstrap": broker.bootstrap, "seconds": elapsed}
        )
    elif started:
        print(f"broker started: pid {pid}, {broker.bootstrap}, ready in {elapsed:.1f}s")
        print(f"  logs: {broker.paths.log_file}")
    else:
        print(f"broker already running: pid {pid}, {broker.bootstrap}")
    return 0


def _stop(args: argparse.Namespace) -> int:
    broker = _broker(args)
    pid = broker.stop()
    if args.json:
        print_json({"stopped": pid is not None, "pid": pid})
    elif pid is None:
        print(f"no broker running on port {args.port} (state dir {broker.paths.root})")
    else:
        print(f"broker stopped: pid {pid}")
    return 0


def _status(args: argparse.Namespace) -> int:
    broker = _broker(args)
    pid = broker.running_pid()
    ready = pid is not None and broker.is_ready()
    if args.json:
        print_json({"running": pid is not None, "pid": pid, "ready": ready})
    elif pid is None:
        print(f"not running (port {args.port})")
    else:
        print(f"running: pid {pid}, {broker.bootstrap}, {'answers' if ready else 'not answering'}")
    return 0 if pid is not None else 3


def _fetch(args: argparse.Namespace) -> int:
    t0 = time.monotonic()
    jars = fetch_jars(args.cache, quiet=not args.json)
    print(f"kafka {kafka_version()} jars in {jars} ({time.monotonic() - t0:.1f}s)")
    return 0
