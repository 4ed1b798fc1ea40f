# docs/workers.md's myapp/reports.py (test_docs_results.py keeps them equal)
from typing import Any

from dueflow import TaskContext, task

ROWS = {"2030-01": [120, 80, 45, 5]}  # stands in for your database
OUTBOX: list[tuple[str, str]] = []  # stands in for your mail service


@task("monthly-report")
def monthly_report(payload: dict[str, Any], ctx: TaskContext) -> dict[str, Any]:
    rows = ROWS[payload["month"]]
    total = 0
    for done, amount in enumerate(rows, 1):
        total += amount
        ctx.progress(done / len(rows), {"rows": done})  # no I/O: call it as often as you like
    # The next step receives this job's result as ctx.parent_result:
    ctx.schedule("email-report", {"to": payload["to"]}, pass_result=True)
    return {"month": payload["month"], "total": total}  # the job's result (JSON)


@task("email-report")
def email_report(payload: dict[str, Any], ctx: TaskContext) -> None:
    report = ctx.parent_result
    OUTBOX.append((payload["to"], f"{report['month']}: {report['total']}"))
