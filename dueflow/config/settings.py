"""The settings of a dueflow process: :class:`Settings`, its sections
(:mod:`dueflow.config.sections`) and the top-level fields."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dueflow.config import validation
from dueflow.config.sections import (
    EmitterSettings,
    ObservabilitySettings,
    ProducerSettings,
    QueueSpec,
    WorkerSettings,
)
from dueflow.errors import ConfigError
from dueflow.kafka.kafka_settings import KafkaSettings
from dueflow.rules.wheel import WheelGeometry


@dataclass(frozen=True, slots=True)
class Settings:
    """Everything a dueflow process needs to know about its cluster and topics."""

    bootstrap: str = "127.0.0.1:9092"  # Kafka bootstrap servers, host:port[,host:port...]
    # Prefix of every topic and group name: deployments with other prefixes share
    # a cluster without seeing each other.
    topic_prefix: str = "dueflow"
    queues: tuple[QueueSpec, ...] = (QueueSpec("default"),)
    wheel: WheelGeometry = WheelGeometry()
    replication_factor: int = 1  # replicas of each topic `dueflow topics ensure` creates
    min_insync_replicas: int = 1  # their min.insync.replicas, at most replication_factor
    schedules_partitions: int = 3  # partitions of the cron schedules topic, `<prefix>.schedules`
    outcomes_partitions: int = 6  # partitions of the outcomes topic, `<prefix>.outcomes`
    # librdkafka settings for every client; may hold passwords: the repr hides them.
    kafka: Mapping[str, str] = field(default_factory=KafkaSettings)
    # Task name or glob -> queue, in the order given (see dueflow.rules.routing).
    routes: tuple[tuple[str, str], ...] = ()
    # Modules whose @task declarations tell a producer a task's queue, and which
    # tasks exist: another is refused unless the route table names it.
    app: tuple[str, ...] = ()
    emitter: EmitterSettings = EmitterSettings()
    worker: WorkerSettings = WorkerSettings()
    observability: ObservabilitySettings = ObservabilitySettings()
    producer: ProducerSettings = ProducerSettings()

    def __post_init__(self) -> None:
        if not isinstance(self.kafka, KafkaSettings):
            # frozen: the one place the field is replaced, by its read-only, redacting form
            object.__setattr__(self, "kafka", KafkaSettings(self.kafka))

    def queue(self, name: str) -> QueueSpec:
        """The queue called ``name``; :class:`ConfigError` if it is not configured."""
        for q in self.queues:
            if q.name == name:
                return q
        raise ConfigError("queue", name, f"one of the configured queues {self.queue_names}")

    @property
    def queue_names(self) -> list[str]:
        return [q.name for q in self.queues]

    def client_config(self, **extra: Any) -> dict[str, Any]:
        """librdkafka configuration: bootstrap, pass-through settings, then ``extra``."""
        conf: dict[str, Any] = {"bootstrap.servers": self.bootstrap}
        conf.update(self.kafka)
        conf.update(extra)
        return conf

    def validate(self) -> Settings:
        """Check every setting; raise :class:`ConfigError` naming the first bad one."""
        validation.validate_cluster(self)
        self.wheel.validate()
        validation.validate_topics(self)
        validation.validate_emitter(self.emitter)
        validation.validate_worker(self.worker)
        validation.validate_fire_ahead(self.emitter, self.worker)
        validation.validate_observability(self.observability)
        validation.validate_producer(self.producer)
        return self
