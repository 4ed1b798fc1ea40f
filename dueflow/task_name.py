"""What a task name may be: one rule for the scheduling side and the workers (pure).

A worker registers handlers with ``@task(name)`` and refuses names outside
this rule; the scheduling client, the CLI and cron schedules refuse them too,
so a job is never written for a task no worker can ever register (it would
only reach the DLQ as ``unknown_task``).

A name is 1 to 200 characters of ASCII letters, digits and ``_ . : / -``
(``email.send``, ``billing:charge``, ``reports/daily``).
"""

from __future__ import annotations

import re

from dueflow.errors import InvalidInput

MAX_TASK_NAME_CHARS = 200
TASK_NAME_ACCEPTED = (
    f"1-{MAX_TASK_NAME_CHARS} characters of A-Z a-z 0-9 _ . : / - "
    "(the names a worker can register with @task)"
)
_TASK_NAME = re.compile(rf"[A-Za-z0-9_.:/-]{{1,{MAX_TASK_NAME_CHARS}}}")


def is_task_name(value: object) -> bool:
    """Whether ``value`` is a task name a worker accepts."""
    return isinstance(value, str) and _TASK_NAME.fullmatch(value) is not None


def check_task_name(value: object, *, field: str = "task") -> str:
    """``value`` when it is a valid task name, else :class:`InvalidInput` naming ``field``."""
    if not isinstance(value, str) or _TASK_NAME.fullmatch(value) is None:
        raise InvalidInput(field, value, TASK_NAME_ACCEPTED)
    return value


__all__ = ["MAX_TASK_NAME_CHARS", "TASK_NAME_ACCEPTED", "check_task_name", "is_task_name"]
