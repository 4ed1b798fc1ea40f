"""Entry point of the ``dueflow`` command: builds the parser from command modules."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

from dueflow.errors import DueflowError

# Each module has register(subparsers); its parsers set `func(args) -> int`.
COMMAND_MODULES = (
    "dueflow.cli.broker_cmd",
    "dueflow.cli.topics_cmd",
    "dueflow.cli.status_cmd",
    "dueflow.cli.schedule_cmd",
    "dueflow.cli.cron_cmd",
    "dueflow.cli.worker_cmd",
    "dueflow.cli.emitter_cmd",
    "dueflow.cli.queue_cmd",
    "dueflow.cli.dlq_cmd",
    "dueflow.cli.replay_cmd",
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dueflow",
        description="dueflow: a fault-tolerant, Kafka-native job scheduler.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except DueflowError as exc:
        sys.stderr.write(f"dueflow: {exc}\n")
        return 2
    except KeyboardInterrupt:
        return 130
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
