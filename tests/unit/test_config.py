from __future__ import annotations

from pathlib import Path

import pytest

from dueflow.config import QueueSpec, Settings, load_settings
from dueflow.errors import ConfigError
from dueflow.rules.wheel import WheelLevel


def test_defaults_are_valid() -> None:
    s = load_settings(env={})
    assert s.bootstrap == "127.0.0.1:9092"
    assert s.queue_names == ["default"]
    assert s.wheel.total_partitions == 4 + 4 * 64


def test_sources_in_order_file_env_overrides(tmp_path: Path) -> None:
    cfg = tmp_path / "dueflow.toml"
    cfg.write_text(
        """
bootstrap = "file:9092"
topic_prefix = "fromfile"
replication_factor = 3
min_insync_replicas = 2
[kafka]
"security.protocol" = "SSL"
[[queues]]
name = "billing"
partitions = 12
retry_tiers_ms = [500, 5000]
[wheel]
near_window_ms = 3000
levels = [[62, 1000], [64, 60000]]
[emitter]
session_timeout_ms = 3000
"""
    )
    env = {
        "DUEFLOW_CONFIG": str(cfg),
        "DUEFLOW_TOPIC_PREFIX": "fromenv",
        "DUEFLOW_KAFKA_SASL_MECHANISM": "PLAIN",
        "DUEFLOW_EMITTER_BATCH_MAX_MS": "50",
        "DUEFLOW_WORKER_CONCURRENCY": "8",
    }
    s = load_settings(env=env, overrides={"bootstrap": "cli:9092", "topic_prefix": None})
    assert s.bootstrap == "cli:9092"  # CLI beats file
    assert s.topic_prefix == "fromenv"  # env beats file; None override ignored
    assert s.replication_factor == 3
    assert s.kafka == {"security.protocol": "SSL", "sasl.mechanism": "PLAIN"}
    assert s.queues == (QueueSpec("billing", 12, (500, 5000)),)
    assert s.wheel.levels == (WheelLevel(62, 1000), WheelLevel(64, 60000))
    assert s.wheel.near_window_ms == 3000
    assert s.emitter.session_timeout_ms == 3000
    assert s.emitter.batch_max_ms == 50
    assert s.worker.concurrency == 8
    assert s.client_config()["sasl.mechanism"] == "PLAIN"


def test_queues_from_env_text() -> None:
    s = load_settings(env={"DUEFLOW_QUEUES": "billing:12, default"})
    assert [(q.name, q.partitions) for q in s.queues] == [("billing", 12), ("default", 6)]


@pytest.mark.parametrize(
    ("overrides", "setting", "fragment"),
    [
        ({"bootstrap": "nohostport"}, "bootstrap", "host:port"),
        ({"topic_prefix": "bad prefix!"}, "topic_prefix", "A-Za-z0-9"),
        ({"queues": "a,a"}, "queues[1].name", "not used by another queue"),
        ({"queues": "bad/name"}, "queues[0].name", "A-Za-z0-9"),
        ({"queues": "a:0"}, "queues[0].partitions", ">= 1"),
        ({"queues": "a:x"}, "queues[0].partitions", "an integer"),
        ({"replication_factor": 1, "min_insync_replicas": 2}, "min_insync_replicas", "at most"),
        ({"emitter": {"session_timeout_ms": "soon"}}, "emitter.session_timeout_ms", "integer"),
        ({"emitter": {"nope": 1}}, "emitter.nope", "known settings"),
        ({"observability": {"log_format": "xml"}}, "observability.log_format", "'json'"),
        ({"observability": {"job_log": "some"}}, "observability.job_log", "'failures'"),
        ({"observability": {"status_store": "disk"}}, "observability.status_store", "'memory'"),
        ({"observability": {"status_hot_jobs": 0}}, "observability.status_hot_jobs", ">= 1"),
        (
            {"observability": {"status_lookup_timeout_ms": -1}},
            "observability.status_lookup_timeout_ms",
            ">= 1",
        ),
        ({"wheel": {"near_window_ms": 1000}}, "wheel.near_window_ms", "lookahead"),
        ({"wheel": {"levels": [[64, 1000], [64, 3_600_000]]}}, "wheel.levels[1]", "level 0"),
        ({"emitter": {"batch_min_ms": 200}}, "emitter.batch_min_ms", "batch_max_ms (100)"),
        ({"emitter": {"batch_min_ms": -1}}, "emitter.batch_min_ms", "from 0"),
        ({"worker": {"max_memory": "lots"}}, "worker.max_memory", "a number with a unit"),
        ({"worker": {"max_memory": "1MiB"}}, "worker.max_memory", "16 MiB"),
        ({"worker": {"max_memory_hard": "1GiB"}}, "worker.max_memory_hard", "max_memory is unset"),
        (
            {"worker": {"max_memory": "1GiB", "max_memory_hard": "1GiB"}},
            "worker.max_memory_hard",
            "more bytes than worker.max_memory",
        ),
        ({"worker": {"watchdog_interval_s": -1}}, "worker.watchdog_interval_s", ">= 0"),
        ({"worker": {"watchdog_restart_s": 0}}, "worker.watchdog_restart_s", "> 0"),
        ({"worker": {"watchdog_stall_s": 0}}, "worker.watchdog_stall_s", "> 0"),
        (
            {"worker": {"max_memory": "1GiB", "watchdog_interval_s": 0}},
            "worker.watchdog_interval_s",
            "while worker.max_memory is set",
        ),
    ],
)
def test_validation_errors_name_the_setting(
    overrides: dict[str, object], setting: str, fragment: str
) -> None:
    with pytest.raises(ConfigError) as info:
        load_settings(env={}, overrides=overrides)
    assert info.value.setting == setting
    assert fragment in str(info.value)


def test_missing_config_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="existing TOML file"):
        load_settings(config_file=tmp_path / "nope.toml", env={})


def test_bad_toml_is_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("bootstrap = ")
    with pytest.raises(ConfigError, match="valid TOML"):
        load_settings(config_file=bad, env={})


def test_unknown_queue_lookup_names_the_choices() -> None:
    s = Settings()
    with pytest.raises(ConfigError, match=r"\['default'\]"):
        s.queue("billing")


def test_worker_memory_limits_from_file_and_env(tmp_path: Path) -> None:
    assert Settings().worker.max_memory is None  # off by default
    assert Settings().worker.memory_ceiling is None
    config = tmp_path / "dueflow.toml"
    config.write_text('[worker]\nmax_memory = "512MiB"\n')
    s = load_settings(config_file=config, env={})
    assert s.worker.max_memory == 512 * 2**20
    assert s.worker.memory_ceiling == 1024 * 2**20  # twice, unless set
    s = load_settings(
        env={"DUEFLOW_WORKER_MAX_MEMORY": "800M", "DUEFLOW_WORKER_MAX_MEMORY_HARD": "1G"}
    )
    assert (s.worker.max_memory, s.worker.memory_ceiling) == (800_000_000, 1_000_000_000)
    s = load_settings(config_file=config, env={"DUEFLOW_WORKER_MAX_MEMORY": ""})
    assert s.worker.max_memory is None  # the environment unsets it
