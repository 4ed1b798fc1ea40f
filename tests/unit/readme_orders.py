# docs/handlers.md's myapp/orders.py (test_readme_chain.py keeps them equal)
from typing import Any

from dueflow import TaskContext, task


@task("charge-order")
def charge_order(payload: dict[str, Any], ctx: TaskContext) -> None:
    order = payload["order_id"]
    ...  # charge the card, with ctx.idempotency_key as the provider's key
    # Both are written only if this attempt succeeds, in its Kafka transaction:
    ctx.schedule("ship-order", {"order_id": order})
    ctx.schedule("ask-for-review", {"order_id": order}, delay="7d")


@task("ship-order")
def ship_order(payload: dict[str, Any], ctx: TaskContext) -> None: ...  # call the warehouse


@task("ask-for-review")
def ask_for_review(payload: dict[str, Any], ctx: TaskContext) -> None: ...  # send the email
