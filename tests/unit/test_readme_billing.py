# docs/testing.md's tests/test_billing.py (test_testing_readme.py keeps them equal)
import pytest

from dueflow.testing import InMemoryPipeline, make_context
from tests.unit import readme_billing as billing  # README: from myapp import billing


class FlakyProvider:
    """Fails the first charge, as a provider that is briefly unavailable."""

    def __init__(self) -> None:
        self.charges: list[tuple[int, str]] = []

    def charge(self, order_id: int, *, idempotency_key: str) -> None:
        self.charges.append((order_id, idempotency_key))
        if len(self.charges) == 1:
            raise ConnectionError("provider unavailable")


@pytest.fixture
def provider(monkeypatch: pytest.MonkeyPatch) -> FlakyProvider:
    flaky = FlakyProvider()
    monkeypatch.setattr(billing, "provider", flaky)
    return flaky


@pytest.fixture
def dueflow_tasks() -> list[object]:
    return [billing.charge_order]  # what the dueflow_pipeline fixture runs


def test_a_failed_charge_is_retried_30_s_later(
    dueflow_pipeline: InMemoryPipeline, provider: FlakyProvider
) -> None:
    scheduler = dueflow_pipeline.scheduler
    job = scheduler.schedule("charge-order", {"order_id": 42}, delay="10m")

    dueflow_pipeline.advance(minutes=10)  # due: the first attempt fails
    (first,) = dueflow_pipeline.runs(job.job_id)
    assert first.outcome == "retrying"
    assert first.error == "ConnectionError: provider unavailable"
    assert first.retry_at_ms == first.at_ms + 30_000  # the task's fixed backoff

    dueflow_pipeline.advance(seconds=29)  # never early
    assert len(dueflow_pipeline.runs(job.job_id)) == 1

    dueflow_pipeline.advance(seconds=1)
    runs = dueflow_pipeline.runs(job.job_id)
    assert [(r.attempt, r.outcome) for r in runs] == [(1, "retrying"), (2, "succeeded")]
    assert dueflow_pipeline.job(job.job_id).state == "succeeded"
    assert provider.charges == [(42, job.idempotency_key)] * 2  # one key for both


def test_the_handler_alone(provider: FlakyProvider) -> None:
    ctx = make_context("charge-order", {"order_id": 7}, attempt=3, max_attempts=3)
    provider.charges.append((0, "an earlier call"))  # the next one succeeds
    billing.charge_order({"order_id": 7}, ctx)
    assert provider.charges[-1] == (7, ctx.idempotency_key)
    assert ctx.is_last_attempt
