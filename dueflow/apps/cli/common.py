"""Pieces every CLI command shares: global options, settings, output."""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tomllib
from collections.abc import Mapping, Sequence
from typing import Any

from dueflow.config import Settings, load_settings
from dueflow.control_chars import escape_text, json_text
from dueflow.kafka import clients
from dueflow.observability import logs

# How long a command waits for the cluster to answer before it gives up (exit 3).
CONNECT_TIMEOUT_S = 4.0
# ... and a service (worker, emitter, status view): it waits through a broker's
# restart, as a supervisor starting it beside the cluster expects.
SERVICE_CONNECT_TIMEOUT_S = 120.0


def add_global_options(parser: argparse.ArgumentParser, *, service: bool = False) -> None:
    """Options every command that talks to Kafka accepts (they override DUEFLOW_* and
    the TOML file). Taking them marks the command as one that talks to Kafka: ``main``
    checks that the cluster answers before its first client connects. A ``service``
    waits for it (up to ``SERVICE_CONNECT_TIMEOUT_S``, saying so once) where a
    command fails within seconds."""
    parser.set_defaults(kafka_command=True, service=service)
    timeout = SERVICE_CONNECT_TIMEOUT_S if service else CONNECT_TIMEOUT_S
    g = parser.add_argument_group("cluster")
    g.add_argument("--bootstrap", help="Kafka bootstrap servers (env DUEFLOW_BOOTSTRAP)")
    g.add_argument("--config", help="TOML settings file (env DUEFLOW_CONFIG)")
    g.add_argument("--topic-prefix", help="topic name prefix (env DUEFLOW_TOPIC_PREFIX)")
    g.add_argument("--queues", help="queues as name[:partitions],... (env DUEFLOW_QUEUES)")
    g.add_argument(
        "--log-format", choices=["json", "text"], help="log lines as JSON or text for humans"
    )
    g.add_argument(
        "--log-level",
        choices=["DEBUG", "INFO", "WARNING", "ERROR"],
        type=str.upper,
        help="least severe log level written (env DUEFLOW_OBSERVABILITY_LOG_LEVEL)",
    )
    g.add_argument(
        "--connect-timeout",
        type=float,
        default=timeout,
        metavar="SECONDS",
        help=(
            f"wait this long for the cluster to answer at start, then give up "
            f"(exit 3; default {timeout:g})"
            if service
            else f"give up (exit 3) when the cluster does not answer this long "
            f"(default {timeout:g}; sooner when it refuses)"
        ),
    )
    g.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="every Kafka client log line (default: each distinct one once) and tracebacks",
    )


def add_listener_options(parser: argparse.ArgumentParser, *, merged: bool = False) -> None:
    """``--metrics-port`` and ``--metrics-bind``: the listener of /metrics, /livez, /readyz."""
    g = parser.add_argument_group("metrics and health")
    g.add_argument(
        "--metrics-port",
        type=int,
        help="serve Prometheus /metrics and the /livez and /readyz probes on this port"
        + ("; with --processes, one merged view" if merged else "")
        + " (env DUEFLOW_OBSERVABILITY_METRICS_PORT)",
    )
    g.add_argument(
        "--metrics-bind",
        help="address of that listener: 127.0.0.1 (default), 0.0.0.0 for every interface "
        "(env DUEFLOW_OBSERVABILITY_METRICS_BIND)",
    )


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Settings from defaults < TOML < environment < these CLI flags."""
    overrides: dict[str, Any] = {
        "bootstrap": getattr(args, "bootstrap", None),
        "topic_prefix": getattr(args, "topic_prefix", None),
        "queues": getattr(args, "queues", None),
        "observability": {
            "log_format": getattr(args, "log_format", None),
            "log_level": getattr(args, "log_level", None),
            "metrics_port": getattr(args, "metrics_port", None),
            "metrics_bind": getattr(args, "metrics_bind", None),
        },
    }
    return load_settings(
        config_file=getattr(args, "config", None), env=os.environ, overrides=overrides
    )


def bootstrap_source(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> str:
    """Where the bootstrap servers of this run came from, for error messages."""
    env = os.environ if env is None else env
    if getattr(args, "bootstrap", None):
        return "--bootstrap"
    if env.get("DUEFLOW_BOOTSTRAP"):
        return "DUEFLOW_BOOTSTRAP"
    config = getattr(args, "config", None) or env.get("DUEFLOW_CONFIG")
    if config:
        with contextlib.suppress(OSError, tomllib.TOMLDecodeError), open(config, "rb") as fh:
            if "bootstrap" in tomllib.load(fh):
                return f"`bootstrap` in {config}"
    return "the default; set --bootstrap or DUEFLOW_BOOTSTRAP"


def check_cluster(settings: Settings) -> None:
    """Stop with exit code 3 now if the cluster does not answer: for commands that start
    long-running processes, before they set anything up."""
    clients.check_cluster(settings)


def configure_logging(settings: Settings) -> None:
    """Set up ``dueflow.*`` logs at process start (``--log-format``, ``--log-level``)."""
    logs.configure(settings.observability.log_format, settings.observability.log_level)


def print_json(data: Any) -> None:
    """``data`` as indented JSON on stdout: valid JSON whatever its strings hold, no
    control character raw (:func:`~dueflow.control_chars.json_text`)."""
    sys.stdout.write(json_text(data, indent=True) + "\n")


def print_text(text: str) -> None:
    """``text`` and a newline on stdout, every control character but its newlines
    escaped. Values from the wire in ``text`` must be escaped by the caller
    (:func:`~dueflow.control_chars.escape_text`), newlines included, so that one
    cannot forge a line; this is the guard for anything that was not."""
    sys.stdout.write(escape_text(text, keep="\n") + "\n")


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain-text table with aligned columns; every cell escaped (:func:`escape_text`)."""
    cells = [[escape_text(h) for h in headers]] + [[escape_text(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def fail(message: str, code: int = 1) -> int:
    sys.stderr.write(f"dueflow: {escape_text(message)}\n")
    return code
