"""The example app of the deployment files (docker-compose.yml, deploy/kubernetes/).

Three queues with different job timeouts: the Kubernetes manifests give each
queue's workers a drain and a termination grace period that fit its longest
job (``dueflow deploy kubernetes`` reads these timeouts).
"""

from __future__ import annotations

import time
from typing import Any

from dueflow.consumers import TaskContext, task


@task("ping", queue="default", timeout=5)
def ping(payload: Any, ctx: TaskContext) -> None:
    return None


@task("send-invoice", queue="billing", timeout=30, max_attempts=5)
def send_invoice(payload: Any, ctx: TaskContext) -> dict[str, Any]:
    # A real handler calls the payment provider with ctx.idempotency_key.
    return {"invoice": payload.get("invoice") if isinstance(payload, dict) else None}


@task("build-report", queue="reports", timeout=600)
def build_report(payload: Any, ctx: TaskContext) -> None:
    seconds = float(payload.get("seconds", 1)) if isinstance(payload, dict) else 1.0
    time.sleep(min(seconds, 600.0))
