"""The walkthrough of docs/queues.md, followed as a newcomer would, against the real broker.

Its commands run through the CLI, ``myapp/tasks.py`` is written as shown and
imported, the producer example runs as written while an emitter and a worker
run, the jobs run on ``billing``, the error shown is the one the CLI prints,
and the route table parses as shown.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import pytest

from dueflow.apps.cli.main import main
from dueflow.config import load_settings
from dueflow.consumers import TaskRegistry
from dueflow.rules.routing import Router
from tests.conftest import KafkaCluster
from tests.integration.worker_support import WorkerThread, wait_for
from tests.support.emitters import FAST_EMITTER, threaded_emitter

README = Path(__file__).resolve().parents[2] / "docs" / "queues.md"


def _section() -> str:
    return README.read_text().split("\n## A walkthrough\n", 1)[1].split("\n## ", 1)[0]


def _blocks(section: str, lang: str) -> list[str]:
    """The fenced blocks of ``lang`` ("" for plain ones), in order."""
    out: list[str] = []
    current: list[str] | None = None
    current_lang = ""
    for line in section.splitlines():
        if line.startswith("```"):
            if current is None:
                current, current_lang = [], line[3:].strip()
            else:
                if current_lang == lang:
                    out.append("\n".join(current) + "\n")
                current = None
        elif current is not None:
            current.append(line)
    return out


def _commands(block: str) -> list[list[str]]:
    out = []
    for line in block.splitlines():
        command = line.split("  #", 1)[0].strip()
        if command.startswith("dueflow "):
            out.append(shlex.split(command)[1:])
    return out


def _run(capsys: pytest.CaptureFixture[str], argv: list[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    code = main(argv)
    got = capsys.readouterr()
    return code, got.out, got.err


@pytest.mark.timeout(240)
def test_the_queues_section_works_as_written(
    kafka: KafkaCluster,
    prefix: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    env = {
        "DUEFLOW_BOOTSTRAP": kafka.bootstrap,
        "DUEFLOW_TOPIC_PREFIX": prefix,
        "DUEFLOW_QUEUES": "default:1",
        "DUEFLOW_WHEEL_LEVELS": "8x100,8x500,6x2000",
        "DUEFLOW_WHEEL_NEAR_PARTITIONS": "2",
        "DUEFLOW_WHEEL_NEAR_WINDOW_MS": "300",
        "DUEFLOW_WHEEL_LOOKAHEAD_MS": "100",
        "DUEFLOW_WORKER_SESSION_TIMEOUT_MS": "3000",
        "DUEFLOW_WORKER_COMMIT_INTERVAL_MS": "50",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    section = _section()
    setup, run_it, error = _blocks(section, "")
    # 1. Setup: every command but the broker (the test's broker is running) and the
    # emitter, which runs on a thread below.
    assert ["emitter"] in _commands(setup)  # the walkthrough starts one
    for argv in _commands(setup):
        if argv[0] in ("broker", "emitter"):
            continue
        code, out, err = _run(capsys, argv)
        assert code == 0, (argv, out, err)
    code, out, _ = _run(capsys, ["queue", "describe", "billing", "--json"])
    assert '"rate_limit_per_s": 50.0' in out

    # 2. The handler module, as shown, importable as myapp.tasks.
    tasks_py, producer_py = _blocks(section, "python")
    assert tasks_py.startswith("# myapp/tasks.py\n")
    (tmp_path / "myapp").mkdir()
    (tmp_path / "myapp" / "__init__.py").write_text("")
    (tmp_path / "myapp" / "tasks.py").write_text(tasks_py)
    monkeypatch.syspath_prepend(str(tmp_path))

    settings = load_settings(env=env, overrides={"emitter": FAST_EMITTER})
    registry = TaskRegistry.from_modules(["myapp.tasks"])
    with threaded_emitter(settings) as emitter, WorkerThread(settings, registry) as worker:
        emitter.wait_active()
        assert [r.queue for r in worker.worker.runtimes] == ["billing"]  # routed by @task
        # 3. The producer, as written.
        capsys.readouterr()
        namespace: dict[str, Any] = {"__name__": "readme_queues"}
        exec(compile(producer_py, str(README), "exec"), namespace)
        printed = capsys.readouterr().out.splitlines()  # the job may have run already
        assert printed[0] == "billing"
        printed.extend(capsys.readouterr().out.splitlines())
        # 4. The shell lines after it (the worker runs here already, on a thread).
        (schedule,) = [argv for argv in _commands(run_it) if argv[0] == "schedule"]
        printed.extend(capsys.readouterr().out.splitlines())  # nothing printed is dropped
        code = main(schedule)
        out = capsys.readouterr().out
        assert code == 0
        assert "(queue billing, task send-invoice)" in out
        printed.extend(out.splitlines())  # the worker's thread may print meanwhile

        def ran() -> bool:
            printed.extend(capsys.readouterr().out.splitlines())
            return {"invoice 42 attempt 1", "invoice 43 attempt 1"} <= set(printed)

        wait_for("both invoices to run", ran, 60)

    # 5. The error shown for a typo is the CLI's, word for word.
    code, _, err = _run(capsys, ["schedule", "send-invoice", "--queue", "biling"])
    assert code == 2
    # (only the CLI's own line: a background thread of an earlier step may log
    # into the captured stream too, e.g. "--- Logging error ---" once it is closed)
    (line,) = [x for x in err.splitlines() if x.startswith("dueflow: ")]
    assert " ".join(line.split()) == " ".join(error.split())

    # 6. The route table parses as shown, and routes as the text says.
    (toml,) = _blocks(section, "toml")
    config = tmp_path / "dueflow.toml"
    config.write_text(toml)
    routed = load_settings(config_file=config, env={})
    router = Router(routed.routes)
    assert router.queue_for("send-invoice") == "billing"
    assert router.queue_for("reports.daily") == "reports"
    from_env = load_settings(env={"DUEFLOW_ROUTES": "send-invoice=billing,reports.*=reports"})
    assert from_env.routes == routed.routes
