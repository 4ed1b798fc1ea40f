"""``dueflow broker start|stop|status|env|fetch``: the local broker, or with ``--nodes N``
a local replicated cluster of N KRaft nodes (``dueflow.broker.cluster``); with
``--security sasl_ssl`` its client port speaks SASL_SSL with SCRAM logins
(``dueflow.broker.security``), and ``start`` and ``env`` print the settings
dueflow's clients need, never the password itself."""

from __future__ import annotations

import argparse
import functools
import os
import shlex
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from dueflow.apps.cli.common import print_json
from dueflow.broker.cluster import LocalCluster
from dueflow.broker.local import LocalBroker, fetch_jars, kafka_version
from dueflow.broker.security import (
    CLIENT_MECHANISM,
    CLIENT_USER,
    SECURITY_MODES,
    SecurityFiles,
    client_exports,
    client_settings,
    env_name,
)
from dueflow.errors import InvalidInput

SINGLE_HEAP, NODE_HEAP = "1g", "512m"


def register(sub: Any) -> None:
    p = sub.add_parser("broker", help="run a local Kafka broker from Maven Central jars")
    bsub = p.add_subparsers(dest="broker_command", metavar="ACTION")
    bsub.required = True
    for name, func, help_ in (
        ("start", _start, "start the broker (a no-op if it runs) and wait until it answers"),
        ("stop", _stop, "stop the broker of the pid file and wait for it"),
        ("status", _status, "say whether the broker runs and answers"),
        (
            "env",
            _env,
            "print the `export` lines that give dueflow's clients this broker's settings "
            '(for `eval "$(dueflow broker env)"`; the password is read from its file)',
        ),
    ):
        sp = bsub.add_parser(name, help=help_, description=help_)
        sp.add_argument(
            "--port",
            type=int,
            help="client port on 127.0.0.1 (a cluster's base: node i uses port+2(i-1); "
            f"env DUEFLOW_BROKER_PORT, default {DEFAULT_PORT})",
        )
        sp.add_argument("--controller-port", type=int, help="KRaft controller port (port+1)")
        sp.add_argument(
            "--nodes",
            type=int,
            default=1,
            help="nodes: 1 is one broker; 3 is a replicated cluster (replication factor 3, "
            "min ISR 2, internal topics too)",
        )
        sp.add_argument("--dir", type=Path, help="state directory (data, logs, pid file)")
        _cache_option(sp)
        sp.add_argument(
            "--heap",
            help=f"JVM heap per node, e.g. 512m or 1g (default {SINGLE_HEAP}; "
            f"{NODE_HEAP} with --nodes > 1)",
        )
        sp.add_argument(
            "--security",
            choices=SECURITY_MODES,
            help="plaintext, or sasl_ssl: the client port speaks TLS with SCRAM-SHA-512/256 "
            "logins (CA, certificate and a generated password made at the first start, "
            "in <dir>/security); default: what the state dir was started with, else plaintext",
        )
        sp.add_argument("--json", action="store_true", help="machine-readable output")
        sp.set_defaults(func=functools.partial(_with_port, func))
    fetch_help = (
        "download the Kafka broker jars (Maven Central, through Maven and the "
        "package's pom.xml) into the cache, so that `start` needs no network"
    )
    fetch = bsub.add_parser("fetch", help=fetch_help, description=fetch_help)
    _cache_option(fetch)
    fetch.add_argument("--json", action="store_true", help="machine-readable output")
    fetch.set_defaults(func=_fetch)


DEFAULT_PORT = 9092


def _with_port(func: Callable[[argparse.Namespace], int], args: argparse.Namespace) -> int:
    """Run an action with ``--port`` resolved (:func:`_default_port` when not given)."""
    if args.port is None:
        args.port = _default_port()
    return func(args)


def _default_port() -> int:
    """``--port`` when not given: ``DUEFLOW_BROKER_PORT``, else 9092."""
    raw = os.environ.get("DUEFLOW_BROKER_PORT")
    if not raw:
        return DEFAULT_PORT
    try:
        return int(raw)
    except ValueError:
        raise InvalidInput("DUEFLOW_BROKER_PORT", raw, "a port number") from None


def _cache_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--cache",
        type=Path,
        help="jar cache (env DUEFLOW_CACHE; default ~/.cache/dueflow)",
    )


def _cluster(args: argparse.Namespace) -> LocalCluster | None:
    """The cluster of ``--nodes N`` (N > 1); None for the single broker."""
    if args.nodes < 1:
        raise InvalidInput("--nodes", args.nodes, "1 or more")
    if args.nodes == 1:
        return None
    if args.controller_port is not None:
        raise InvalidInput(
            "--controller-port",
            args.controller_port,
            "nothing with --nodes > 1 (node i uses port+2(i-1) and the port after it)",
        )
    return LocalCluster(
        nodes=args.nodes,
        base_port=args.port,
        state_dir=args.dir,
        cache_dir=args.cache,
        heap=args.heap or NODE_HEAP,
        security=args.security,
    )


def _broker(args: argparse.Namespace) -> LocalBroker:
    return LocalBroker(
        port=args.port,
        controller_port=args.controller_port,
        state_dir=args.dir,
        cache_dir=args.cache,
        heap=args.heap or SINGLE_HEAP,
        security=args.security,
    )


def _client_doc(bootstrap: str, files: SecurityFiles | None) -> dict[str, Any]:
    """What ``--json`` says about the client settings: never the password."""
    if files is None:
        return {"security": "plaintext", "env": {"DUEFLOW_BOOTSTRAP": bootstrap}}
    shown = {k: v for k, v in client_settings(files, "").items() if k != "sasl.password"}
    return {
        "security": "sasl_ssl",
        "password_file": str(files.client_password),
        "kafka": shown,
        "env": {"DUEFLOW_BOOTSTRAP": bootstrap, **{env_name(k): v for k, v in shown.items()}},
        "password_env": env_name("sasl.password"),
    }


def _env_command(args: argparse.Namespace) -> str:
    """``dueflow broker env`` with the options that name the broker of ``args``."""
    words = ["dueflow", "broker", "env", "--port", str(args.port)]
    if args.nodes != 1:
        words += ["--nodes", str(args.nodes)]
    if args.dir is not None:
        words += ["--dir", str(args.dir)]
    return shlex.join(words)


def _print_client_settings(
    args: argparse.Namespace, bootstrap: str, files: SecurityFiles | None
) -> None:
    """The settings a client needs, for a person: no secret in them."""
    if files is None:
        return
    print(
        f"  SASL_SSL: clients log in as {CLIENT_USER!r} ({CLIENT_MECHANISM}; SCRAM-SHA-256 "
        "works too) with the password in"
    )
    print(f"    {files.client_password} (mode 0600), and trust {files.ca_pem}")
    print(f'  client settings (or: eval "$({_env_command(args)})"):')
    for line in client_exports(bootstrap=bootstrap, files=files):
        print(f"    {line}")


def _start(args: argparse.Namespace) -> int:
    cluster = _cluster(args)
    if cluster is not None:
        return _start_cluster(args, cluster)
    broker = _broker(args)
    t0 = time.monotonic()
    pid, started = broker.start()
    elapsed = time.monotonic() - t0
    if args.json:
        print_json(
            {
                "pid": pid,
                "started": started,
                "bootstrap": broker.bootstrap,
                "seconds": elapsed,
                "client": _client_doc(broker.bootstrap, _files(broker)),
            }
        )
    elif started:
        print(f"broker started: pid {pid}, {broker.bootstrap}, ready in {elapsed:.1f}s")
        print(f"  logs: {broker.paths.log_file}")
    else:
        print(f"broker already running: pid {pid}, {broker.bootstrap}")
    if not args.json:
        _print_client_settings(args, broker.bootstrap, _files(broker))
    return 0


def _files(target: LocalBroker | LocalCluster) -> SecurityFiles | None:
    return target.security_files if target.secured else None


def _env(args: argparse.Namespace) -> int:
    target: LocalBroker | LocalCluster = _cluster(args) or _broker(args)
    files = _files(target)
    if args.json:
        print_json(_client_doc(target.bootstrap, files))
    elif files is None:
        print(f"export DUEFLOW_BOOTSTRAP={target.bootstrap}")
    else:
        print("\n".join(client_exports(bootstrap=target.bootstrap, files=files)))
    return 0


def _stop(args: argparse.Namespace) -> int:
    cluster = _cluster(args)
    if cluster is not None:
        return _stop_cluster(args, cluster)
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
    cluster = _cluster(args)
    if cluster is not None:
        return _status_cluster(args, cluster)
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
    jars = fetch_jars(args.cache)
    seconds = time.monotonic() - t0
    if args.json:
        print_json({"kafka": kafka_version(), "jars": str(jars), "seconds": seconds})
    else:
        print(f"kafka {kafka_version()} jars in {jars} ({seconds:.1f}s)")
    return 0


def _start_cluster(args: argparse.Namespace, cluster: LocalCluster) -> int:
    t0 = time.monotonic()
    result = cluster.start()
    # made now, not by the first worker or emitter (which would wait for three replicas)
    cluster.create_internal_topics()
    elapsed = time.monotonic() - t0
    nodes = [
        {"node": n, "pid": pid, "started": started, "bootstrap": cluster.broker(n).bootstrap}
        for n, (pid, started) in result.items()
    ]
    if args.json:
        print_json(
            {
                "nodes": nodes,
                "started": any(x["started"] for x in nodes),
                "bootstrap": cluster.bootstrap,
                "seconds": elapsed,
                "client": _client_doc(cluster.bootstrap, _files(cluster)),
            }
        )
        return 0
    fresh = [x for x in nodes if x["started"]]
    if fresh:
        print(f"cluster started: {len(nodes)} nodes, ready in {elapsed:.1f}s")
    else:
        print(f"cluster already running: {len(nodes)} nodes")
    for x in nodes:
        state = "started" if x["started"] else "already running"
        print(f"  node {x['node']}: pid {x['pid']}, {x['bootstrap']} ({state})")
    print(f"bootstrap: {cluster.bootstrap}")
    print(f"  logs: {cluster.root}/node-<id>/logs/server.log")
    _print_client_settings(args, cluster.bootstrap, _files(cluster))
    return 0


def _stop_cluster(args: argparse.Namespace, cluster: LocalCluster) -> int:
    stopped = cluster.stop()
    if args.json:
        print_json(
            {
                "stopped": any(pid is not None for pid in stopped.values()),
                "nodes": [{"node": n, "pid": pid} for n, pid in stopped.items()],
            }
        )
    elif all(pid is None for pid in stopped.values()):
        print(f"no cluster node running on ports from {args.port} (state dir {cluster.root})")
    else:
        for n, pid in stopped.items():
            print(f"node {n}: " + ("not running" if pid is None else f"stopped: pid {pid}"))
    return 0


def _status_cluster(args: argparse.Namespace, cluster: LocalCluster) -> int:
    pids = cluster.running()
    answers = {
        n: pid is not None and cluster.broker(n).is_ready(brokers=len(pids))
        for n, pid in pids.items()
    }
    running = all(pid is not None for pid in pids.values())
    ready = running and all(answers.values())
    if args.json:
        print_json(
            {
                "running": running,
                "ready": ready,
                "bootstrap": cluster.bootstrap,
                "nodes": [
                    {"node": n, "pid": pid, "running": pid is not None, "ready": answers[n]}
                    for n, pid in pids.items()
                ],
            }
        )
    else:
        up = sum(pid is not None for pid in pids.values())
        print(
            f"{up} of {len(pids)} nodes running"
            + (", all answer with every broker" if ready else "")
            + f"; bootstrap {cluster.bootstrap}"
        )
        for n, pid in pids.items():
            b = cluster.broker(n)
            if pid is None:
                print(f"  node {n}: not running ({b.bootstrap})")
            else:
                said = "answers" if answers[n] else "not answering"
                print(f"  node {n}: pid {pid}, {b.bootstrap}, {said}")
    return 0 if running else 3
