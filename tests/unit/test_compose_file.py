"""docker-compose.kafka.yml: accepted by `docker compose config`, and shaped as documented."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

COMPOSE = Path(__file__).resolve().parents[2] / "docker-compose.kafka.yml"


def _has_compose() -> bool:
    if shutil.which("docker") is None:
        return False
    probe = subprocess.run(["docker", "compose", "version"], capture_output=True, check=False)
    return probe.returncode == 0


@pytest.mark.skipif(
    not _has_compose(),
    reason=(
        "`docker compose` is not available here (no docker client, or no compose plugin: "
        "`make compose-plugin` builds it)"
    ),
)
def test_docker_compose_accepts_the_file() -> None:
    res = subprocess.run(
        ["docker", "compose", "-f", str(COMPOSE), "config", "-q"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert res.returncode == 0, res.stderr


def test_three_kraft_brokers_with_rf3_and_min_isr2() -> None:
    doc: dict[str, Any] = yaml.safe_load(COMPOSE.read_text())
    services = doc["services"]
    assert sorted(services) == ["kafka-1", "kafka-2", "kafka-3"]
    ids = set()
    for svc in services.values():
        image = svc["image"]
        assert image.startswith("apache/kafka:")
        assert image.split(":")[1][0].isdigit(), "the image must be pinned to a version"
        env = svc["environment"]
        ids.add(env["KAFKA_NODE_ID"])
        assert env["KAFKA_PROCESS_ROLES"] == "broker,controller"
        assert env["KAFKA_CONTROLLER_QUORUM_VOTERS"].count("@") == 3
        assert env["KAFKA_DEFAULT_REPLICATION_FACTOR"] == "3"
        assert env["KAFKA_MIN_INSYNC_REPLICAS"] == "2"
        assert env["KAFKA_TRANSACTION_STATE_LOG_MIN_ISR"] == "2"
    assert ids == {"1", "2", "3"}
