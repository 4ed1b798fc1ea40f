"""The Python examples of docs/scheduling.md run as written."""

from __future__ import annotations

import re
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from dueflow.config import load_settings
from dueflow.kafka.clients import make_admin
from dueflow.kafka.topic_admin import TopicAdmin
from dueflow.kafka.topics import names, topic_layout
from dueflow.producers import Scheduler
from tests.conftest import KafkaCluster
from tests.integration.records import high_watermarks

README = Path(__file__).resolve().parents[2] / "docs" / "scheduling.md"


@pytest.mark.timeout(300)
def test_readme_python_example(
    kafka: KafkaCluster,
    prefix: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    section = README.read_text().split("# Scheduling jobs\n", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    env = {
        "DUEFLOW_BOOTSTRAP": kafka.bootstrap,
        "DUEFLOW_TOPIC_PREFIX": prefix,
        "DUEFLOW_WHEEL_LEVELS": "10x1000,10x5000",
        "DUEFLOW_WHEEL_NEAR_PARTITIONS": "2",
        "DUEFLOW_WHEEL_NEAR_WINDOW_MS": "1500",
        "DUEFLOW_WHEEL_LOOKAHEAD_MS": "200",
    }
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    settings = load_settings(env=env)
    assert TopicAdmin(make_admin(settings), replication_factor=1).ensure(topic_layout(settings)).ok
    namespace: dict[str, Any] = {"__name__": "readme_example"}
    exec(compile(code, str(README), "exec"), namespace)
    out = capsys.readouterr().out.splitlines()
    assert out[1] == "scheduled"  # status() of a pending job
    assert out[2] == "['nightly-report']"
    assert out[3] == "100000 0 []"
    timers = sum(high_watermarks(settings, [names(settings).timers]).values())
    assert timers == 2 + 1 + 100_000  # and the rescheduled job's new timer


@pytest.mark.timeout(300)
def test_readme_rescheduling_example(
    kafka: KafkaCluster,
    prefix: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The example of "Rescheduling and cancelling" does what its comments say."""
    section = README.read_text().split("## Rescheduling and cancelling", 1)[1].split("\n## ", 1)[0]
    (code,) = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    settings = kafka.settings(prefix)
    assert TopicAdmin(make_admin(settings), replication_factor=1).ensure(topic_layout(settings)).ok
    namespace: dict[str, Any] = {
        "__name__": "readme_example",
        "settings": settings,
        "Scheduler": Scheduler,
    }
    exec(compile(code, str(README), "exec"), namespace)
    moved, cancelled = capsys.readouterr().out.splitlines()
    flag, rest = moved.split(" ", 1)
    old, new = rest.split(" -> ")
    assert flag == "True"
    later = datetime.fromisoformat(new) - datetime.fromisoformat(old)
    assert timedelta(hours=2) <= later < timedelta(hours=2, minutes=1)
    assert cancelled == "True True rescheduled"
