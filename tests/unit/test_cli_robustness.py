"""The CLI's parsing fixes, exit codes, ``--version`` and librdkafka's log lines (no broker)."""

from __future__ import annotations

import argparse
import importlib.metadata
import time
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import KafkaError, KafkaException

import dueflow
from dueflow.apps.cli import main as cli
from dueflow.apps.cli import schedule_cmd
from dueflow.apps.cli.common import bootstrap_source
from dueflow.config import load_settings
from dueflow.errors import (
    ConflictError,
    DueflowError,
    InvalidInput,
    KafkaOperationError,
    WorkerStartupFailed,
)
from dueflow.kafka.clients import ClientLog, client_scope, log_line_key, make_producer
from tests.support.stderr_lines import own_lines

UNREACHABLE = "127.0.0.1:1"

# ------------------------------------------------------------ negative values


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["schedule", "t", "--delay", "-5m"], ["schedule", "t", "--delay=-5m"]),
        (["schedule", "t", "--delay", "-1.5s"], ["schedule", "t", "--delay=-1.5s"]),
        (["schedule", "t", "--jitter", "-10"], ["schedule", "t", "--jitter=-10"]),
        (["schedule", "t", "--delay", "5m"], ["schedule", "t", "--delay", "5m"]),
        # a flag, then an option: nothing to attach
        (
            ["schedule", "t", "--json", "--delay", "1m"],
            ["schedule", "t", "--json", "--delay", "1m"],
        ),
        # an option name after a value option stays an option
        (["schedule", "t", "--delay", "--json"], ["schedule", "t", "--delay", "--json"]),
        # after "--" everything is positional
        (["schedule", "--", "--delay", "-5m"], ["schedule", "--", "--delay", "-5m"]),
    ],
)
def test_negative_values_are_attached_to_their_option(argv: list[str], expected: list[str]) -> None:
    options = cli.value_options(cli.build_parser())
    assert cli.attach_negative_values(argv, options) == expected


def test_value_options_are_those_that_take_one_value() -> None:
    options = cli.value_options(cli.build_parser())
    assert {"--delay", "--jitter", "--timeout", "--bootstrap", "--from", "--tz"} <= options
    assert not {"--json", "--verbose", "-v", "--dry-run", "--help", "--version"} & options


@pytest.mark.parametrize("flag", ["--delay", "--jitter", "--timeout"])
def test_a_negative_duration_reaches_the_real_check(
    flag: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code = cli.main(["schedule", "t", flag, "-5m", "--bootstrap", UNREACHABLE])
    err = capsys.readouterr().err
    assert code == cli.EXIT_USAGE
    assert err.startswith(f"dueflow: {flag[2:]}: got '-5m'; accepted:")
    assert "expected one argument" not in err


def test_a_negative_delay_says_it_must_not_be_negative(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["schedule", "t", "--delay", "-5m", "--bootstrap", UNREACHABLE]) == 2
    assert "must not be negative" in capsys.readouterr().err


# ------------------------------------------------------------ time zones


def test_cron_add_suggests_the_zone(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["cron", "add", "s", "--cron", "0 3 * * *", "--tz", "Europe/Berln", "--task", "t"]
    assert cli.main([*argv, "--bootstrap", UNREACHABLE]) == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.startswith("dueflow: timezone: got 'Europe/Berln'")
    assert "did you mean 'Europe/Berlin'?" in err


# ------------------------------------------------------------ --version


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        cli.main(["--version"])
    assert info.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"dueflow {dueflow.__version__} (confluent-kafka ")
    assert "librdkafka" in out


def test_the_version_is_the_distributions() -> None:
    assert dueflow.__version__ == importlib.metadata.version("dueflow")


# ------------------------------------------------------------ exit codes


@pytest.mark.parametrize(
    ("raised", "code", "line"),
    [
        (InvalidInput("delay", "-5m", "a duration"), 2, "dueflow: delay: got '-5m'"),
        (ConflictError("job id reused"), 2, "dueflow: job id reused"),
        (KafkaOperationError("topic dueflow.timers does not exist"), 4, "dueflow: topic"),
        (DueflowError("first line\nsecond line"), 4, "dueflow: first line"),
        (
            KafkaOperationError(
                "describe x",
                cause=KafkaException(KafkaError(KafkaError._TRANSPORT, "down")),
            ),
            3,
            "dueflow: describe x",
        ),
        (KafkaException(KafkaError(KafkaError._ALL_BROKERS_DOWN, "all down")), 3, "dueflow: kafka"),
        (KafkaException(KafkaError(KafkaError.TOPIC_AUTHORIZATION_FAILED, "no")), 4, "dueflow: k"),
        (
            WorkerStartupFailed("app:open_db", "ConnectionError: refused"),
            5,
            "dueflow: worker startup hook app:open_db failed: ConnectionError: refused",
        ),
        (KeyboardInterrupt(), 130, None),
    ],
)
def test_errors_map_to_exit_codes_with_one_line(
    raised: BaseException,
    code: int,
    line: str | None,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    def command(args: argparse.Namespace) -> int:
        raise raised

    monkeypatch.setattr(schedule_cmd, "_schedule", command)
    assert cli.main(["schedule", "t", "--bootstrap", UNREACHABLE]) == code
    err = capsys.readouterr().err
    if line is None:
        assert err == ""
    else:
        assert err.startswith(line)
        assert len(err.splitlines()) == 1
        assert "Traceback" not in err


def test_the_exit_codes_are_in_the_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["--help"])
    out = capsys.readouterr().out
    for code in ("0", "1", "2", "3", "4", "130"):
        assert f"\n  {code} " in out


# ------------------------------------------------------------ where bootstrap came from


@pytest.mark.parametrize(
    ("flag", "env", "in_file", "source"),
    [
        ("h:1", {"DUEFLOW_BOOTSTRAP": "e:1"}, True, "--bootstrap"),
        (None, {"DUEFLOW_BOOTSTRAP": "e:1"}, True, "DUEFLOW_BOOTSTRAP"),
        (None, {}, True, "`bootstrap` in {path}"),
        (None, {}, False, "the default; set --bootstrap or DUEFLOW_BOOTSTRAP"),
    ],
)
def test_bootstrap_source(
    flag: str | None, env: dict[str, str], in_file: bool, source: str, tmp_path: Path
) -> None:
    path = tmp_path / "dueflow.toml"
    path.write_text('bootstrap = "f:1"\n' if in_file else 'topic_prefix = "p"\n')
    args = argparse.Namespace(bootstrap=flag, config=str(path))
    assert bootstrap_source(args, env) == source.format(path=path)


# ------------------------------------------------------------ librdkafka's lines


@pytest.mark.parametrize(
    ("a", "b", "same"),
    [
        (
            "127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused "
            "(after 0ms in state CONNECT)",
            "127.0.0.1:1/bootstrap: Connect to ipv4#127.0.0.1:1 failed: Connection refused "
            "(after 12ms in state CONNECT)",
            True,
        ),
        (
            "b:9092/1: Disconnected (after 5003ms in state UP)",
            "b:9092/1: Disconnected (after 17ms in state UP, 3 identical error(s) suppressed)",
            True,
        ),
        (
            "b:9092/1: Disconnected (after 5003ms in state UP)",
            "b:9092/2: Disconnected (after 5003ms in state UP)",
            False,  # another broker: worth its own line
        ),
        (
            "b:9092/bootstrap: SSL handshake failed: certificate verify failed",
            "b:9092/bootstrap: Connect to ipv4#10.0.0.1:9092 failed: Connection refused",
            False,
        ),
    ],
)
def test_log_line_key(a: str, b: str, same: bool) -> None:
    assert (log_line_key("FAIL", a) == log_line_key("FAIL", b)) is same


def _line(message: str, client: str = "rdkafka#producer-1") -> tuple[Any, ...]:
    return (40, "%s [%s] %s", "FAIL", client, message)


def test_client_log_emits_each_distinct_line_once() -> None:
    shown: list[str] = []
    log = ClientLog(emit=lambda level, text: shown.append(text))
    refused = (
        "h:1/bootstrap: Connect to ipv4#h:1 failed: Connection refused "
        "(after {}ms in state CONNECT)"
    )
    for i in range(50):
        log.log(*_line(refused.format(i), client=f"rdkafka#consumer-{i % 3}"))
    log.log(*_line("h:1/bootstrap: SASL authentication error: Authentication failed"))
    assert len(shown) == 2
    assert "Connection refused" in shown[0]
    assert "SASL authentication error" in shown[1]
    assert log.suppressed == 49
    assert len(log.distinct()) == 2


def test_client_log_keeps_a_loading_coordinator_to_itself() -> None:
    """librdkafka retries a coordinator that is still loading by itself: a command that
    then succeeds prints nothing on stderr (shown with ``verbose``)."""
    loading = (
        "Failed to acquire idempotence PID from broker h:1/1: "
        "Broker: Coordinator load in progress: retrying"
    )
    shown: list[str] = []
    log = ClientLog(emit=lambda level, text: shown.append(text))
    log.log(*_line(loading))
    log.log(*_line("h:1/1: Broker: Not coordinator: retrying"))
    assert shown == []
    assert len(log.distinct()) == 2
    verbose = ClientLog(verbose=True, emit=lambda level, text: shown.append(text))
    verbose.log(*_line(loading))
    assert len(shown) == 1


def test_client_log_verbose_emits_every_line() -> None:
    shown: list[str] = []
    log = ClientLog(verbose=True, emit=lambda level, text: shown.append(text))
    for _ in range(5):
        log.log(*_line("h:1/bootstrap: Connect to ipv4#h:1 failed: Connection refused"))
    assert len(shown) == 5


def test_clients_in_a_scope_print_no_librdkafka_lines(capfd: pytest.CaptureFixture[str]) -> None:
    """A producer polled while its broker refuses: librdkafka tries again and again; one
    line is kept, none reaches stderr on its own."""
    settings = load_settings(env={}, overrides={"bootstrap": UNREACHABLE})
    kept: list[str] = []
    log = ClientLog(emit=lambda level, text: kept.append(text))
    with client_scope(log, probe=None):
        producer = make_producer(settings)
    deadline = time.monotonic() + 10
    while log.suppressed < 3 and time.monotonic() < deadline:
        producer.poll(0.1)
    del producer
    assert log.suppressed >= 3  # the attempts happened...
    assert len(kept) == 1  # ...and one line of them was kept
    assert not [
        line for line in own_lines(capfd.readouterr().err, UNREACHABLE) if line.startswith("%3|")
    ]


def test_no_scope_no_change() -> None:
    """Library use and long-running processes: clients get no logger of dueflow's."""
    from dueflow.kafka.clients import _scoped

    settings = load_settings(env={}, overrides={"bootstrap": UNREACHABLE})
    assert "logger" not in _scoped(settings, {"bootstrap.servers": UNREACHABLE})


def test_the_docs_show_what_the_command_prints(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "command-line.md").read_text()
    reaching = page.split("\n## Reaching the cluster\n", 1)[1].split("\n## ", 1)[0]
    example = reaching.split("```", 2)[1].strip().splitlines()
    command, printed, _, code = example
    env, *argv = command.removeprefix("$ ").split()
    name, _, value = env.partition("=")
    monkeypatch.setenv(name, value)
    assert argv[0] == "dueflow"
    assert cli.main(argv[1:]) == int(code)
    assert capfd.readouterr().err.strip() == printed
    rows = [line.split("|")[1].strip() for line in page.splitlines() if line.startswith("| ")]
    assert rows[1:] == ["0", "1", "2", "3", "4", "5", "130"]
