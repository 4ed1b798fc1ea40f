# docs/handlers.md's tests/test_orders.py (test_readme_chain.py keeps them equal)
import pytest

from dueflow.testing import InMemoryPipeline, make_context
from tests.unit import readme_orders as orders  # README: from myapp import orders


@pytest.fixture
def dueflow_tasks() -> list[object]:
    return [orders.charge_order, orders.ship_order, orders.ask_for_review]


def test_a_paid_order_ships_at_once_and_asks_for_a_review_a_week_later(
    dueflow_pipeline: InMemoryPipeline,
) -> None:
    job = dueflow_pipeline.scheduler.schedule("charge-order", {"order_id": 7})
    dueflow_pipeline.run_due()
    charge, ship = dueflow_pipeline.runs()
    assert [f.task for f in charge.follow_ups] == ["ship-order", "ask-for-review"]
    assert ship.job_id == f"{job.idempotency_key}/0"  # derived: the same on a rerun
    assert ship.payload == {"order_id": 7}

    dueflow_pipeline.advance(days=6)
    assert len(dueflow_pipeline.runs()) == 2  # never early
    dueflow_pipeline.advance(days=1)
    assert dueflow_pipeline.runs()[-1].task == "ask-for-review"


def test_the_handler_alone() -> None:
    ctx = make_context("charge-order", {"order_id": 9}, idempotency_key="order-9")
    orders.charge_order({"order_id": 9}, ctx)
    assert [(f.task, f.job_id) for f in ctx.follow_ups] == [
        ("ship-order", "order-9/0"),
        ("ask-for-review", "order-9/1"),
    ]
