"""dueflow: a fault-tolerant, Kafka-native job scheduler.

The public API is re-exported here lazily, so ``import dueflow`` stays cheap
and has no side effects.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "Settings": "dueflow.config",
    "QueueSpec": "dueflow.config",
    "load_settings": "dueflow.config",
    "WheelGeometry": "dueflow.wheel",
    "WheelLevel": "dueflow.wheel",
    "DueflowError": "dueflow.errors",
    "InvalidInput": "dueflow.errors",
    "ConflictError": "dueflow.errors",
    "JobError": "dueflow.errors",
    "PermanentJobError": "dueflow.errors",
    "Scheduler": "dueflow.producers",
    "AsyncScheduler": "dueflow.producers",
    "JobRequest": "dueflow.producers",
    "task": "dueflow.consumers",
    "TaskContext": "dueflow.consumers",
    "TaskRegistry": "dueflow.consumers",
    "CronSchedule": "dueflow.cron",
    "MisfirePolicy": "dueflow.cron",
    "Backoff": "dueflow.model",
}


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'dueflow' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(module), name)


__all__ = sorted(_EXPORTS)
