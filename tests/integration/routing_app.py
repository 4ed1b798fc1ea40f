"""Handlers whose ``@task`` declarations route their jobs (tests/integration/test_queue_routing.py).

A producer that imports this module (``Scheduler(settings, app=...)``,
``dueflow schedule --app ...``) sends ``charge`` jobs to ``billing`` and
``ship`` jobs to ``shipping`` by task name alone. The ledger path comes from
``DUEFLOW_TEST_LEDGER`` (set by the test that starts the worker process).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from dueflow.consumers import TaskContext, task
from tests.integration.worker_support import Ledger


def _effect(ctx: TaskContext) -> None:
    ledger = Ledger(Path(os.environ["DUEFLOW_TEST_LEDGER"]))
    ledger.run(ctx.idempotency_key, ctx.attempt)
    ledger.effect(ctx.idempotency_key)


@task("charge", queue="billing")
def charge(_payload: Any, ctx: TaskContext) -> None:
    _effect(ctx)


@task("ship", queue="shipping")
def ship(_payload: Any, ctx: TaskContext) -> None:
    _effect(ctx)
