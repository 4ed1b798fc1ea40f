"""``dueflow queue finalize``: refused while a worker of the release before is in the
queue's group (named by its client id), then the features record every client reads."""

from __future__ import annotations

import json

import pytest
from confluent_kafka import Consumer

from dueflow import __version__
from dueflow.apps.cli.main import main
from dueflow.apps.ops.finalize import FinalizeRefused, finalize_queue
from dueflow.kafka.clients import consumer_config
from dueflow.kafka.features import read_queue_features
from dueflow.kafka.reading import ops_consumer
from dueflow.kafka.topics import names
from dueflow.records.features import worker_client_id
from tests.conftest import KafkaCluster
from tests.integration.worker_support import wait_for, worker_settings

QUEUE = "jobs"


def _member(settings: object, client_id: str | None) -> Consumer:
    """A member of the queue's worker group (KIP-848, as workers join), with partitions."""
    group = names(settings).worker_group(QUEUE)  # type: ignore[arg-type]
    extra = {"group.protocol": "consumer"}
    if client_id is not None:
        extra["client.id"] = client_id
    consumer = Consumer(consumer_config(settings, group, **extra))  # type: ignore[arg-type]
    consumer.subscribe([names(settings).exec(QUEUE)])  # type: ignore[arg-type]
    wait_for(
        "the member to get partitions", lambda: bool(consumer.poll(0.2) or consumer.assignment())
    )
    return consumer


@pytest.mark.timeout(120)
def test_finalize_is_refused_while_an_old_worker_is_a_member_then_written_once(
    kafka: KafkaCluster, prefix: str, capsys: pytest.CaptureFixture[str]
) -> None:
    settings = worker_settings(kafka, prefix, queues=[{"name": QUEUE, "partitions": 2}])
    old = _member(settings, None)  # librdkafka's default client id: a release before
    try:
        with pytest.raises(FinalizeRefused) as refused:
            finalize_queue(settings, QUEUE, by="ada", now_ms=1)
        assert refused.value.members
        assert "rdkafka" in refused.value.members[0]
        capsys.readouterr()
        code = main(
            ["queue", "finalize", QUEUE, *kafka.cli_options(prefix), "--queues", f"{QUEUE}:2"]
        )
        assert code == 1
        assert "do not apply commands" in capsys.readouterr().err
    finally:
        old.close()
    new = _member(settings, worker_client_id(__version__, "host-a"))
    try:
        done = finalize_queue(settings, QUEUE, by="ada", now_ms=1_900_000_000_000)
        assert done.written
        assert [w.split(" @ ")[0] for w in done.workers] == [
            worker_client_id(__version__, "host-a")
        ]
        again = finalize_queue(settings, QUEUE, by="bob", now_ms=1_900_000_000_001)
        assert not again.written
    finally:
        new.close()
    consumer = ops_consumer(settings)
    try:
        features, problems = read_queue_features(settings, consumer)
    finally:
        consumer.close()
    assert problems == []
    got = features[QUEUE]
    assert got.steerable
    assert (got.by, got.at_ms) == ("ada", 1_900_000_000_000)
    capsys.readouterr()
    options = [*kafka.cli_options(prefix), "--queues", f"{QUEUE}:2"]
    assert main(["queue", "describe", QUEUE, *options, "--json"]) == 0
    described = json.loads(capsys.readouterr().out)
    assert described["finalized"]["by"] == "ada"
    assert main(["queue", "describe", QUEUE, *options]) == 0
    assert "steering     commands, any horizon" in capsys.readouterr().out
