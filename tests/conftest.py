"""Shared fixtures: the real broker for integration tests, unique topic prefixes.

Integration tests use the broker at ``DUEFLOW_BOOTSTRAP`` when it is set;
otherwise the session starts a local broker (``dueflow.broker``) on a free
port in a temporary directory and stops it by pid at the end. A broker that
cannot be started fails the tests: it is never a skip.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import hypothesis
import pytest

from dueflow.broker.local import LocalBroker
from dueflow.broker.ports import free_port_pair
from dueflow.config import Settings, load_settings

# No per-example deadline: the test machines are shared and loaded, and a slow
# example is not a wrong one (hypothesis' default of 200 ms failed tests as flaky).
hypothesis.settings.register_profile("dueflow", deadline=None, print_blob=True)
hypothesis.settings.load_profile("dueflow")

# The in-memory pipeline's fixtures (dueflow_pipeline, ...), as users enable them.
pytest_plugins = ["dueflow.testing.pytest_plugin"]


def pytest_configure(config: pytest.Config) -> None:
    """A module setup.py compiles, edited since its build, would run as the old build."""
    from tests.support.native import stale_builds

    stale = stale_builds()
    if stale:
        raise pytest.UsageError(
            "; ".join(stale) + ": rebuild them with `make .venv/.installed` "
            "(or `pip install -e .`), or delete the .so files to run the Python source"
        )


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> Any:
    """``--dist loadgroup`` (``make test``): the groups of tests/support/serial.py."""
    if config.getvalue("dist") != "loadgroup":
        return None
    from tests.support.serial import make_scheduler

    return make_scheduler(config, log)


@dataclass
class KafkaCluster:
    bootstrap: str
    broker: LocalBroker | None  # None when DUEFLOW_BOOTSTRAP points at an external cluster

    def settings(self, prefix: str, **overrides: object) -> Settings:
        data: dict[str, object] = {"bootstrap": self.bootstrap, "topic_prefix": prefix}
        data.update(overrides)
        return load_settings(env={}, overrides=data)

    def cli_options(self, prefix: str) -> list[str]:
        """The flags that point a ``dueflow`` command at this cluster and a test's topics."""
        return ["--bootstrap", self.bootstrap, "--topic-prefix", prefix]


@pytest.fixture(scope="session")
def kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[KafkaCluster]:
    external = os.environ.get("DUEFLOW_BOOTSTRAP")
    if external:
        yield KafkaCluster(external, None)
        return
    port = free_port_pair()
    state = Path(tmp_path_factory.mktemp("broker"))
    broker = LocalBroker(
        port=port, state_dir=state, heap=os.environ.get("DUEFLOW_TEST_HEAP", "768m")
    )
    broker.start()
    try:
        yield KafkaCluster(broker.bootstrap, broker)
    finally:
        broker.stop()


@pytest.fixture
def prefix(request: pytest.FixtureRequest) -> Iterator[str]:
    """A topic prefix of this test only: every integration test gets its own topics.

    When the test used the broker, its topics are deleted afterwards, so a long
    session does not pile up thousands of partitions (and open files).
    """
    value = f"t{uuid.uuid4().hex[:10]}"
    yield value
    if "kafka" in request.fixturenames:
        cluster: KafkaCluster = request.getfixturevalue("kafka")
        _delete_topics(cluster.bootstrap, value)


def _delete_topics(bootstrap: str, prefix: str) -> None:
    from confluent_kafka.admin import AdminClient

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    try:
        topics = [t for t in admin.list_topics(timeout=10).topics if t.startswith(prefix + ".")]
        if topics:
            for fut in admin.delete_topics(topics, operation_timeout=30).values():
                with contextlib.suppress(Exception):  # a topic may be gone already
                    fut.result()
    except Exception:
        pass  # the broker may have been stopped by the test itself
