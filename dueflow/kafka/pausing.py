"""Pause and resume queues: write and read the control topic.

The I/O edge of :mod:`dueflow.records.pause_command`.
"""

from __future__ import annotations

import getpass
import os
import socket
from typing import Any

from confluent_kafka import Consumer

from dueflow.config import Settings
from dueflow.errors import KafkaOperationError
from dueflow.kafka.clients import make_producer
from dueflow.kafka.control_topic import read_control
from dueflow.kafka.fatal import served
from dueflow.kafka.topics import names
from dueflow.records.pause_command import (
    QueueControl,
    decode_control,
    encode_control,
    paused_queues,
)


def operator_name() -> str:
    """Who runs this command: ``$DUEFLOW_OPERATOR``, else ``user@host``."""
    explicit = os.environ.get("DUEFLOW_OPERATOR")
    if explicit:
        return explicit
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}"


def write_queue_control(settings: Settings, control: QueueControl, timeout_s: float = 30.0) -> None:
    """Write one pause/resume command and wait for the broker's acknowledgement."""
    settings.queue(control.queue)  # ConfigError naming the queue when it is not configured
    key, value = encode_control(control)
    producer = make_producer(settings)
    errors: list[Any] = []
    producer.produce(
        names(settings).control,
        value,
        key,
        on_delivery=lambda err, _msg: errors.append(err),
    )
    left = served(producer.flush, timeout_s)
    if left or errors != [None]:
        raise KafkaOperationError(f"control record not written: {errors or 'timed out'}")


def read_queue_controls(
    settings: Settings, consumer: Consumer, timeout_s: float = 30.0
) -> tuple[dict[str, QueueControl], list[str]]:
    """The paused queues (with the command that paused them) and the problems of
    records that are no command."""
    return read_control(settings, consumer, decode_control, paused_queues, timeout_s)
