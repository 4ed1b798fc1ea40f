"""``dueflow worker`` options: queue selection and worker settings."""

from __future__ import annotations

from pathlib import Path

import pytest

from dueflow.apps.cli.main import build_parser
from dueflow.apps.cli.worker_cmd import worker_settings
from dueflow.errors import InvalidInput


def parse(*argv: str) -> object:
    return build_parser().parse_args(["worker", "--app", "x.tasks", *argv])


def test_queues_select_configured_ones_and_add_unknown_ones(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "dueflow.toml"
    config.write_text(
        '[[queues]]\nname = "billing"\npartitions = 12\nretry_tiers_ms = [500, 5000]\n'
    )
    monkeypatch.setenv("DUEFLOW_CONFIG", str(config))
    args = parse(
        "--queues",
        "billing,reports:3",
        "--concurrency",
        "16",
        "--processes",
        "2",
        "--drain-timeout",
        "4.5",
    )
    settings, queues = worker_settings(args)  # type: ignore[arg-type]
    assert queues == ["billing", "reports"]
    billing = settings.queue("billing")
    assert (billing.partitions, billing.retry_tiers_ms) == (12, (500, 5000))  # kept
    assert settings.queue("reports").partitions == 3  # added
    assert (settings.worker.concurrency, settings.worker.processes) == (16, 2)
    assert settings.worker.shutdown_grace_s == 4.5


def test_without_queues_the_tasks_decide(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DUEFLOW_CONFIG", raising=False)
    monkeypatch.delenv("DUEFLOW_QUEUES", raising=False)
    settings, queues = worker_settings(parse())  # type: ignore[arg-type]
    assert queues is None
    assert settings.queue_names == ["default"]


def test_a_bad_queue_selection_names_the_option() -> None:
    with pytest.raises(InvalidInput, match="--queues"):
        worker_settings(parse("--queues", "billing:many"))  # type: ignore[arg-type]


def test_observability_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DUEFLOW_CONFIG", raising=False)
    settings, _ = worker_settings(parse())  # type: ignore[arg-type]
    assert (settings.observability.metrics_port, settings.observability.job_log) == (None, "all")
    args = parse("--metrics-port", "9470", "--job-log", "failures", "--log-format", "text")
    settings, _ = worker_settings(args)  # type: ignore[arg-type]
    obs = settings.observability
    assert (obs.metrics_port, obs.job_log, obs.log_format) == (9470, "failures", "text")


def test_max_memory_option(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("DUEFLOW_CONFIG", raising=False)
    monkeypatch.delenv("DUEFLOW_WORKER_MAX_MEMORY", raising=False)
    settings, _ = worker_settings(parse())  # type: ignore[arg-type]
    assert settings.worker.max_memory is None
    settings, _ = worker_settings(parse("--max-memory", "1.5GiB"))  # type: ignore[arg-type]
    assert settings.worker.max_memory == 3 * 2**29
    with pytest.raises(InvalidInput, match="--max-memory"):
        worker_settings(parse("--max-memory", "a lot"))  # type: ignore[arg-type]
