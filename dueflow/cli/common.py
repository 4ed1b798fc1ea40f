"""Pieces every CLI command shares: global options, settings, output."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import Any

import orjson

from dueflow import logs
from dueflow.config import Settings, load_settings


def add_global_options(parser: argparse.ArgumentParser) -> None:
    """Options every command accepts (they override DUEFLOW_* and the TOML file)."""
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


def settings_from_args(args: argparse.Namespace) -> Settings:
    """Settings from defaults < TOML < environment < these CLI flags."""
    overrides: dict[str, Any] = {
        "bootstrap": getattr(args, "bootstrap", None),
        "topic_prefix": getattr(args, "topic_prefix", None),
        "queues": getattr(args, "queues", None),
        "observability": {
            "log_format": getattr(args, "log_format", None),
            "log_level": getattr(args, "log_level", None),
        },
    }
    return load_settings(
        config_file=getattr(args, "config", None), env=os.environ, overrides=overrides
    )


def configure_logging(settings: Settings) -> None:
    """Set up ``dueflow.*`` logs at process start (``--log-format``, ``--log-level``)."""
    logs.configure(settings.observability.log_format, settings.observability.log_level)


def print_json(data: Any) -> None:
    sys.stdout.write(orjson.dumps(data, option=orjson.OPT_INDENT_2).decode() + "\n")


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A plain-text table with aligned columns."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in row] for row in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def fail(message: str, code: int = 1) -> int:
    sys.stderr.write(f"dueflow: {message}\n")
    return code
