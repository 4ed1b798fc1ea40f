# docs/workers.md's tests/test_reports.py (test_docs_results.py keeps them equal)
import pytest

from dueflow.testing import InMemoryPipeline, make_context
from tests.unit import docs_reports as reports  # docs: from myapp import reports


@pytest.fixture
def dueflow_tasks() -> list[object]:
    return [reports.monthly_report, reports.email_report]


def test_the_report_its_progress_and_its_email(dueflow_pipeline: InMemoryPipeline) -> None:
    scheduler = dueflow_pipeline.scheduler
    job = scheduler.schedule("monthly-report", {"month": "2030-01", "to": "cfo@example.com"})
    dueflow_pipeline.run_due()  # the report, then its email (due at once)
    assert scheduler.result(job.job_id) == {"month": "2030-01", "total": 250}
    report = dueflow_pipeline.job(job.job_id)
    assert (report.progress, report.progress_detail) == (1.0, {"rows": 4})
    assert reports.OUTBOX[-1] == ("cfo@example.com", "2030-01: 250")


def test_the_handlers_alone() -> None:
    payload = {"month": "2030-01", "to": "cfo@example.com"}
    ctx = make_context("monthly-report", payload)
    assert reports.monthly_report(payload, ctx) == {"month": "2030-01", "total": 250}
    assert [r.fraction for r in ctx.progress_reports] == [0.25, 0.5, 0.75, 1.0]
    email = make_context(
        "email-report", {"to": "ops@example.com"}, parent_result={"month": "2030-02", "total": 9}
    )
    reports.email_report({"to": "ops@example.com"}, email)
    assert reports.OUTBOX[-1] == ("ops@example.com", "2030-02: 9")
