"""Entry point of the ``dueflow`` command: builds the parser from command modules.

Exit codes (also in ``dueflow --help`` and docs/command-line.md):

== ==========================================================================
0  done
1  done, and the answer is "no": job not found, nothing deleted, a check or
   a redrive that reported problems
2  usage or bad input (a bad flag, field or setting): nothing was written
3  the Kafka cluster cannot be reached (``broker status``: no local broker)
4  Kafka was reached but an operation failed (missing topics, a timeout,
   a refused request)
130 interrupted (Ctrl-C)
== ==========================================================================

Commands that take ``--bootstrap`` talk to Kafka: they run in a
:func:`~dueflow.kafka.clients.client_scope`, which checks once, before the first
client connects, that the cluster answers (about a second when it refuses,
``--connect-timeout`` at most), and shows each distinct librdkafka log line
once instead of a line per reconnect attempt (every line with ``--verbose``).
"""

from __future__ import annotations

import argparse
import functools
import importlib
import os
import re
import sys
import traceback
from collections.abc import Sequence

from confluent_kafka import KafkaException

from dueflow import __version__
from dueflow.apps.cli.common import bootstrap_source
from dueflow.control_chars import escape_text
from dueflow.errors import (
    ClusterUnreachable,
    ConfigError,
    ConflictError,
    DueflowError,
    InvalidInput,
    WorkerStartupFailed,
)
from dueflow.kafka.clients import (
    ClientLog,
    client_scope,
    is_unreachable,
    probe_cluster,
    wait_for_cluster,
)

EXIT_OK = 0
EXIT_NO = 1
EXIT_USAGE = 2
EXIT_UNREACHABLE = 3
EXIT_FAILED = 4
EXIT_APP = 5
EXIT_INTERRUPTED = 130

EXIT_CODES_HELP = """exit codes:
  0    done
  1    done, and the answer is "no" (job not found, nothing deleted, problems reported)
  2    usage or bad input: nothing was written
  3    the Kafka cluster cannot be reached (broker status: no local broker)
  4    Kafka was reached but an operation failed
  5    the worker's app failed to start (a startup hook raised)
  130  interrupted"""

# Each module has register(subparsers); its parsers set `func(args) -> int`.
COMMAND_MODULES = (
    "dueflow.apps.cli.broker_cmd",
    "dueflow.apps.cli.topics_cmd",
    "dueflow.apps.cli.status_cmd",
    "dueflow.apps.cli.schedule_cmd",
    "dueflow.apps.cli.cron_cmd",
    "dueflow.apps.cli.worker_cmd",
    "dueflow.apps.cli.emitter_cmd",
    "dueflow.apps.cli.queue_cmd",
    "dueflow.apps.cli.dlq_cmd",
    "dueflow.apps.cli.replay_cmd",
    "dueflow.apps.cli.deploy_cmd",
)


def version_text() -> str:
    """``dueflow --version``: this package and the Kafka client it runs on."""
    import confluent_kafka

    client: object = confluent_kafka.version()  # a str in 2.x, (str, int) before
    client = client[0] if isinstance(client, tuple) else client
    return (
        f"dueflow {__version__} (confluent-kafka {client}, "
        f"librdkafka {confluent_kafka.libversion()[0]}, Python {sys.version.split()[0]})"
    )


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="dueflow",
        description="dueflow: a fault-tolerant, Kafka-native job scheduler.",
        epilog=EXIT_CODES_HELP,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=version_text())
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(sub)
    return parser


# A value that starts with "-" and a digit: a negative duration or number.
_NEGATIVE = re.compile(r"^-\d")


def value_options(parser: argparse.ArgumentParser) -> set[str]:
    """Option strings that take exactly one value in every (sub)parser that has them."""
    takes: dict[str, bool] = {}
    stack = [parser]
    while stack:
        p = stack.pop()
        for action in p._actions:  # argparse has no public view of its actions
            if isinstance(action, argparse._SubParsersAction):
                stack.extend(action.choices.values())
                continue
            one = action.nargs is None and not isinstance(action.const, bool | int)
            for opt in action.option_strings:
                takes[opt] = takes.get(opt, True) and one and action.nargs != 0
    return {opt for opt, one in takes.items() if one}


def attach_negative_values(argv: Sequence[str], options: set[str]) -> list[str]:
    """``--delay -5m`` as ``--delay=-5m``.

    argparse reads a token that starts with ``-`` as the next option unless it
    looks like a negative number, so ``--delay -5m`` failed with "expected one
    argument" instead of reaching the check that says a delay must not be
    negative. A value option followed by ``-<digit>...`` gets it as its value.
    """
    out: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        if token == "--":
            out.extend(argv[i:])
            break
        if token in options and i + 1 < len(argv) and _NEGATIVE.match(argv[i + 1]):
            out.append(f"{token}={argv[i + 1]}")
            i += 2
            continue
        out.append(token)
        i += 1
    return out


def import_from_working_directory(path: list[str] | None = None) -> None:
    """Put the working directory first on ``sys.path``, as ``python -m`` and Celery's
    ``-A`` do: ``dueflow worker --app myapp.tasks`` run from a project's folder finds
    ``./myapp`` without PYTHONPATH (the ``dueflow`` script's own path is its bin
    directory). Spawned worker children inherit it."""
    path = sys.path if path is None else path
    cwd = os.getcwd()
    if cwd not in path and "" not in path:
        path.insert(0, cwd)


def main(argv: Sequence[str] | None = None) -> int:
    import_from_working_directory()
    parser = build_parser()
    raw = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(attach_negative_values(raw, value_options(parser)))
    verbose = bool(getattr(args, "verbose", False))
    try:
        if not getattr(args, "kafka_command", False):
            code: int = args.func(args)
            return code
        log = ClientLog(verbose=verbose, emit=_write_client_line)
        probe = (
            functools.partial(
                wait_for_cluster,
                timeout_s=args.connect_timeout,
                say=_say,
                log=log if verbose else None,
            )
            if getattr(args, "service", False)
            else functools.partial(
                probe_cluster, timeout_s=args.connect_timeout, log=log if verbose else None
            )
        )
        with client_scope(log, probe=probe):
            code = args.func(args)
        return code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except ClusterUnreachable as exc:
        return _fail(
            f"cannot reach the Kafka cluster at {exc.bootstrap} "
            f"(bootstrap, from {bootstrap_source(args)}): {exc.reason}",
            EXIT_UNREACHABLE,
            exc,
            verbose,
        )
    except (InvalidInput, ConfigError, ConflictError) as exc:
        return _fail(str(exc), EXIT_USAGE, exc, verbose)
    except WorkerStartupFailed as exc:
        return _fail(str(exc), EXIT_APP, exc, verbose)
    except DueflowError as exc:
        code = EXIT_UNREACHABLE if exc.cause is not None and is_unreachable(exc.cause) else 4
        return _fail(str(exc), code, exc, verbose)
    except KafkaException as exc:  # a client error no dueflow code wrapped
        err = exc.args[0] if exc.args else exc
        text = err.str() if hasattr(err, "str") else str(err)
        code = EXIT_UNREACHABLE if is_unreachable(exc) else EXIT_FAILED
        return _fail(f"kafka: {text}", code, exc, verbose)


def _fail(message: str, code: int, exc: BaseException, verbose: bool) -> int:
    """One line on stderr (and the traceback with ``--verbose``)."""
    if verbose:
        sys.stderr.write(escape_text("".join(traceback.format_exception(exc)), keep="\n"))
    first = message.splitlines()[0] if message else type(exc).__name__
    sys.stderr.write(f"dueflow: {escape_text(first)}\n")
    return code


def _say(text: str) -> None:
    sys.stderr.write(f"dueflow: {escape_text(text)}\n")


def _write_client_line(level: int, text: str) -> None:
    sys.stderr.write(f"dueflow: kafka client: {escape_text(text)}\n")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
