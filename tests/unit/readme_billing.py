# docs/testing.md's myapp/billing.py (test_testing_readme.py keeps them equal)
from typing import Any

from dueflow import TaskContext, task
from dueflow.model import Backoff, BackoffKind


class PaymentProvider:
    """The client of an external payment API (the real one is not called in tests)."""

    def charge(self, order_id: int, *, idempotency_key: str) -> None:
        raise NotImplementedError("talks to the payment API")


provider = PaymentProvider()


@task(
    "charge-order",
    max_attempts=3,
    backoff=Backoff(BackoffKind.FIXED, base_ms=30_000, jitter=False),
)
def charge_order(payload: dict[str, Any], ctx: TaskContext) -> None:
    # The key is the same for every attempt: the provider charges once.
    provider.charge(payload["order_id"], idempotency_key=ctx.idempotency_key)
