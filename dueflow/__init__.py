"""dueflow: a fault-tolerant, Kafka-native job scheduler.

The public API is re-exported here lazily, so ``import dueflow`` stays cheap
and has no side effects.
"""

from __future__ import annotations

from pkgutil import extend_path
from typing import TYPE_CHECKING

from dueflow.lazy_exports import lazy_exports

# The components (dueflow.consumers, .producers, .streams, .broker) and the
# schemas are source roots of their own in a checkout (consumers/dueflow/...):
# every ``dueflow/`` folder on sys.path is part of this package. An installed
# wheel holds them all in one folder.
__path__ = extend_path(__path__, __name__)

__version__ = "0.2.0"

if TYPE_CHECKING:  # what type checkers see of the lazy names below ("X as X": exported)
    from dueflow.config import QueueSpec as QueueSpec
    from dueflow.config import Settings as Settings
    from dueflow.config import load_settings as load_settings
    from dueflow.consumers import FollowUp as FollowUp
    from dueflow.consumers import TaskContext as TaskContext
    from dueflow.consumers import TaskRegistry as TaskRegistry
    from dueflow.consumers import WorkerInfo as WorkerInfo
    from dueflow.consumers import on_failure as on_failure
    from dueflow.consumers import on_shutdown as on_shutdown
    from dueflow.consumers import on_startup as on_startup
    from dueflow.consumers import task as task
    from dueflow.errors import ConflictError as ConflictError
    from dueflow.errors import DueflowError as DueflowError
    from dueflow.errors import InvalidInput as InvalidInput
    from dueflow.errors import JobError as JobError
    from dueflow.errors import PermanentJobError as PermanentJobError
    from dueflow.model import Backoff as Backoff
    from dueflow.producers import AsyncScheduler as AsyncScheduler
    from dueflow.producers import JobRequest as JobRequest
    from dueflow.producers import Scheduler as Scheduler
    from dueflow.rules.cron import CronSchedule as CronSchedule
    from dueflow.rules.cron import MisfirePolicy as MisfirePolicy
    from dueflow.rules.wheel import WheelGeometry as WheelGeometry
    from dueflow.rules.wheel import WheelLevel as WheelLevel

_EXPORTS = {
    "Settings": "dueflow.config",
    "QueueSpec": "dueflow.config",
    "load_settings": "dueflow.config",
    "WheelGeometry": "dueflow.rules.wheel",
    "WheelLevel": "dueflow.rules.wheel",
    "DueflowError": "dueflow.errors",
    "InvalidInput": "dueflow.errors",
    "ConflictError": "dueflow.errors",
    "JobError": "dueflow.errors",
    "PermanentJobError": "dueflow.errors",
    "Scheduler": "dueflow.producers",
    "AsyncScheduler": "dueflow.producers",
    "JobRequest": "dueflow.producers",
    "task": "dueflow.consumers",
    "on_startup": "dueflow.consumers",
    "on_shutdown": "dueflow.consumers",
    "on_failure": "dueflow.consumers",
    "WorkerInfo": "dueflow.consumers",
    "FollowUp": "dueflow.consumers",
    "TaskContext": "dueflow.consumers",
    "TaskRegistry": "dueflow.consumers",
    "CronSchedule": "dueflow.rules.cron",
    "MisfirePolicy": "dueflow.rules.cron",
    "Backoff": "dueflow.model",
}


__all__ = [
    "AsyncScheduler",
    "Backoff",
    "ConflictError",
    "CronSchedule",
    "DueflowError",
    "FollowUp",
    "InvalidInput",
    "JobError",
    "JobRequest",
    "MisfirePolicy",
    "PermanentJobError",
    "QueueSpec",
    "Scheduler",
    "Settings",
    "TaskContext",
    "TaskRegistry",
    "WheelGeometry",
    "WheelLevel",
    "WorkerInfo",
    "load_settings",
    "on_failure",
    "on_shutdown",
    "on_startup",
    "task",
]

if not TYPE_CHECKING:  # type checkers see the imports above, not Any
    __getattr__ = lazy_exports(__name__, _EXPORTS, globals())
