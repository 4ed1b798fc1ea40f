"""The compose files: accepted by `docker compose config` (where Docker is), shaped as documented.

docker-compose.kafka.yml runs three brokers; docker-compose.yml includes it and
runs the topics, two emitters, two workers and the status view from the image
built here. Without a Docker engine (this machine) the checks stop short of
running them: every command is one the dueflow CLI accepts, every setting one
dueflow's settings loader takes, every mounted file exists, the health check
asks the image's /readyz listener, and compose waits longer than a worker drains.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.kafka.yml"
STACK = ROOT / "docker-compose.yml"


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
@pytest.mark.parametrize("path", [COMPOSE, STACK], ids=["kafka", "stack"])
def test_docker_compose_accepts_the_file(path: Path) -> None:
    res = subprocess.run(
        ["docker", "compose", "-f", str(path), "config", "-q"],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "DUEFLOW_STATUS_TOKEN": "a-token-of-the-compose-check"},
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


def _stack() -> dict[str, Any]:
    doc: dict[str, Any] = yaml.safe_load(STACK.read_text())  # resolves the << merges
    return doc


def _app_services() -> dict[str, dict[str, Any]]:
    return {
        k: v for k, v in _stack()["services"].items() if v.get("image", "").startswith("dueflow:")
    }


def test_the_stack_includes_the_brokers_and_runs_two_emitters_workers_and_the_status_view() -> None:
    doc = _stack()
    assert doc["include"] == ["docker-compose.kafka.yml"]
    services = _app_services()
    commands = {name: svc["command"][0] for name, svc in services.items()}
    assert sorted(n for n, c in commands.items() if c == "emitter") == ["emitter-1", "emitter-2"]
    assert commands["worker"] == "worker"
    assert services["worker"]["deploy"]["replicas"] >= 2
    assert commands["status-view"] == "status-view"
    assert commands["topics"] == "topics"
    for name, svc in services.items():
        assert svc["build"] == ".", name  # the image of this tree's Dockerfile
        if name != "topics":
            deps = svc["depends_on"]
            assert deps["topics"]["condition"] == "service_completed_successfully", name
    assert services["status-view"]["ports"] == ["127.0.0.1:6066:6066"]


def test_every_command_is_one_the_cli_accepts() -> None:
    from dueflow.apps.cli.main import build_parser

    parser = build_parser()
    for name, svc in _app_services().items():
        args = parser.parse_args(svc["command"])
        assert callable(args.func), name


def test_every_setting_loads_and_every_mounted_file_exists() -> None:
    import sys

    from dueflow.config import load_settings

    for name, svc in _app_services().items():
        env = {k: str(v) for k, v in svc["environment"].items()}
        mounts = {}
        for volume in svc["volumes"]:
            source, target, *_ = volume.split(":")
            assert (ROOT / source).exists(), f"{name}: {source} does not exist"
            mounts[target] = ROOT / source
        config = mounts[env.pop("DUEFLOW_CONFIG")]
        env = {k: v for k, v in env.items() if k.startswith("DUEFLOW_")}
        if "DUEFLOW_OBSERVABILITY_STATUS_TOKEN" in env:
            env["DUEFLOW_OBSERVABILITY_STATUS_TOKEN"] = "a-token-of-the-compose-check"
        settings = load_settings(config_file=config, env=env)
        assert settings.replication_factor == 3  # the three brokers of the kafka file
        if svc["command"][0] == "worker":
            app_dir = str(mounts[svc["environment"]["PYTHONPATH"]])
            sys.path.insert(0, app_dir)
            try:
                from dueflow.consumers.registry import TaskRegistry

                registry = TaskRegistry.from_modules([svc["command"][2]])
            finally:
                sys.path.remove(app_dir)
                sys.modules.pop(svc["command"][2], None)
            assert set(registry.queues) <= set(settings.queue_names)


def test_health_checks_ask_readyz_and_compose_waits_for_the_drain() -> None:
    from dueflow.config import load_settings

    settings = load_settings(config_file=ROOT / "deploy/compose/dueflow.toml", env={})
    for name, svc in _app_services().items():
        if name == "topics":
            continue
        check = " ".join(svc["healthcheck"]["test"])
        assert "http://127.0.0.1:9464/readyz" in check, name
        grace = int(svc["stop_grace_period"].rstrip("s"))
        assert grace >= settings.worker.shutdown_grace_s + 17, name  # drain + commit deadline
