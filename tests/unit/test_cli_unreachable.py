"""Every command that talks to Kafka fails fast and clearly when the cluster is unreachable.

The commands come from the parser itself: a command that takes ``--bootstrap``
talks to Kafka (``add_global_options`` marks it), so a new command is in this
table as soon as it exists. Its arguments are made up from the parser; where
made-up ones are not enough (the command would exit 2 on bad input before it
connects), ``EXTRA`` gives valid ones. No broker is needed: 127.0.0.1:1
refuses every connection.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from dueflow.apps.cli.main import EXIT_UNREACHABLE, build_parser, main
from tests.support.stderr_lines import own_lines

UNREACHABLE = "127.0.0.1:1"
LIMIT_S = 5.0

# Values for required arguments, by their dest (default "x").
SAMPLE = {
    "task": "t",
    "job_id": "job-1",
    "schedule_id": "s1",
    "cron": "0 3 * * *",
    "tz": "UTC",
    "app": "demo.tasks",
    "queue": "default",
    "ref": "0:0",
    "topic": "dueflow.exec.default",
    "start": "0",
    "partitions": "3",
    "at": "2030-01-01T00:00:00Z",
    "payload": '{"user": 42}',
}
# What a command needs besides its required arguments to pass its input checks.
EXTRA: dict[tuple[str, ...], list[str]] = {
    ("cancel",): ["job-1"],
    ("worker",): ["--queues", "emails"],
    ("dlq", "redrive"): ["--all"],
    ("cron", "update"): ["--cron", "0 4 * * *"],
    ("queue", "finalize"): ["default"],
}


def leaf_commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every runnable command of the parser tree, as (path, its parser)."""
    subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    if not subs:
        yield path, parser
        return
    for name, sub in subs[0].choices.items():
        yield from leaf_commands(sub, (*path, name))


def sample_argv(path: tuple[str, ...], parser: argparse.ArgumentParser) -> list[str]:
    argv = list(path)
    for action in parser._actions:
        if not action.option_strings and action.nargs is None:
            argv.append(SAMPLE.get(action.dest, "x"))
        elif action.required:
            argv += [action.option_strings[0], SAMPLE.get(action.dest, "x")]
    for group in parser._mutually_exclusive_groups:
        if group.required:  # one of them: a flag when there is one
            flags = [a for a in group._group_actions if a.nargs == 0]
            chosen = (flags or group._group_actions)[0]
            argv.append(chosen.option_strings[0])
            if chosen.nargs != 0:
                argv.append(SAMPLE.get(chosen.dest, "x"))
    return argv + EXTRA.get(path, [])


def kafka_commands() -> list[list[str]]:
    return [
        sample_argv(path, p)
        for path, p in leaf_commands(build_parser())
        if p.get_default("kafka_command")
    ]


def is_service(argv: list[str]) -> bool:
    """worker, emitter, status-view: they wait for the cluster at start."""
    return any(
        path == tuple(argv[: len(path)]) and p.get_default("service")
        for path, p in leaf_commands(build_parser())
    )


def test_the_table_has_every_command_that_talks_to_kafka() -> None:
    commands = kafka_commands()
    services = sorted(" ".join(a[:1]) for a in commands if is_service(a))
    assert services == ["emitter", "status-view", "worker"]
    assert len(commands) == len({tuple(a[:2]) for a in commands}) >= 20
    # The local broker commands manage a process, not a cluster connection.
    assert all(argv[0] != "broker" for argv in commands)
    for path in EXTRA:  # no stale entries
        assert any(tuple(argv[: len(path)]) == path for argv in commands), path


@pytest.mark.parametrize("argv", kafka_commands(), ids=lambda a: " ".join(a[:2]))
def test_unreachable_cluster_fails_fast_with_one_line(
    argv: list[str], monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DUEFLOW_BOOTSTRAP", UNREACHABLE)
    for name in ("DUEFLOW_CONFIG", "DUEFLOW_QUEUES", "DUEFLOW_TOPIC_PREFIX"):
        monkeypatch.delenv(name, raising=False)
    service = is_service(argv)
    if service:  # it would wait two minutes (a broker restarting): not this long
        argv = [*argv, "--connect-timeout", "1.5"]
    started = time.monotonic()
    code = main(argv)
    elapsed = time.monotonic() - started
    out, err = capfd.readouterr()
    lines = own_lines(err, UNREACHABLE)
    assert code == EXIT_UNREACHABLE, err
    refused = f"Connect to ipv4#{UNREACHABLE} failed: Connection refused"
    waited = (
        [
            f"dueflow: the Kafka cluster at {UNREACHABLE} does not answer yet ({refused}); "
            "waiting up to 1.5 s"
        ]
        if service
        else []
    )
    assert lines == [
        *waited,
        f"dueflow: cannot reach the Kafka cluster at {UNREACHABLE} (bootstrap, from "
        f"DUEFLOW_BOOTSTRAP): {refused}",
    ]
    assert "Traceback" not in err
    assert out == ""
    assert elapsed < LIMIT_S


@pytest.mark.parametrize("argv", [["job", "job-1"], ["status"]])
def test_the_installed_command_fails_fast_as_a_process(argv: list[str]) -> None:
    """The two commands of the issue, end to end: a new interpreter, its imports, the exit."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("DUEFLOW_")}
    env["DUEFLOW_BOOTSTRAP"] = UNREACHABLE
    started = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "dueflow", *argv],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    elapsed = time.monotonic() - started
    assert proc.returncode == EXIT_UNREACHABLE, proc.stderr
    assert len(proc.stderr.splitlines()) == 1, proc.stderr
    assert proc.stderr.startswith(f"dueflow: cannot reach the Kafka cluster at {UNREACHABLE}")
    assert elapsed < LIMIT_S + 1  # plus the interpreter's start


def test_the_status_commands_do_not_import_the_sdk() -> None:
    """``dueflow status`` and ``dueflow job`` start without ``dueflow.producers`` (the
    whole SDK: a second more of a loaded host's start); ``job --result`` imports it
    when it runs."""
    code = (
        "import sys, dueflow.apps.cli.status_cmd; "
        "print(sorted(m for m in sys.modules if m.startswith('dueflow.producers')))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_message_names_the_flag_when_the_flag_set_it(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("DUEFLOW_BOOTSTRAP", raising=False)
    assert main(["cron", "list", "--bootstrap", UNREACHABLE]) == EXIT_UNREACHABLE
    assert "(bootstrap, from --bootstrap)" in capfd.readouterr().err


def test_verbose_shows_the_client_lines_and_the_traceback(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("DUEFLOW_BOOTSTRAP", UNREACHABLE)
    assert main(["cron", "list", "--verbose"]) == EXIT_UNREACHABLE
    err = capfd.readouterr().err
    assert "dueflow: kafka client: FAIL" in err
    assert "Traceback" in err
    assert err.splitlines()[-1].startswith("dueflow: cannot reach the Kafka cluster")


def test_a_service_waits_for_a_cluster_that_comes_up() -> None:
    # A worker started beside a broker that is restarting waits for it, saying so once.
    from dueflow.config import load_settings
    from dueflow.errors import ClusterUnreachable
    from dueflow.kafka.clients import wait_for_cluster

    answers = iter([False, False, False, True])
    said: list[str] = []

    def probe(_settings: object, **_kw: object) -> None:
        if not next(answers):
            raise ClusterUnreachable(UNREACHABLE, "Connection refused")

    settings = load_settings(env={"DUEFLOW_BOOTSTRAP": UNREACHABLE}, overrides={})
    wait_for_cluster(settings, timeout_s=30, say=said.append, probe=probe)
    assert said == [
        f"the Kafka cluster at {UNREACHABLE} does not answer yet (Connection refused); "
        "waiting up to 30 s",
        f"the Kafka cluster at {UNREACHABLE} answers",
    ]


def test_a_service_does_not_wait_for_a_cluster_that_refuses_it() -> None:
    # A wrong password stays wrong: the SASL refusal ends the wait at once.
    from dueflow.config import load_settings
    from dueflow.errors import ClusterUnreachable
    from dueflow.kafka.clients import wait_for_cluster

    calls: list[int] = []

    def probe(_settings: object, **_kw: object) -> None:
        calls.append(1)
        raise ClusterUnreachable(UNREACHABLE, "SASL authentication error", refused=True)

    settings = load_settings(env={"DUEFLOW_BOOTSTRAP": UNREACHABLE}, overrides={})
    said: list[str] = []
    with pytest.raises(ClusterUnreachable, match="SASL"):
        wait_for_cluster(settings, timeout_s=30, say=said.append, probe=probe)
    assert calls == [1]
    assert said == []
