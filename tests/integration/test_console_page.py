"""The operator console in a real headless Chromium over a real pipeline.

The SDK schedules jobs, ``dueflow emitter``, ``dueflow worker`` and ``dueflow
status-view`` run as processes. The console's main flows: log in with the
token from the URL fragment the view printed (it leaves the address bar);
find the failed job (state dead, task), open it (timeline, attempt, the
hostile error text shown as text, never run), "fix the bug", retry it and
see it succeed; pause a queue and resume it; redrive dead letters by filter
after a preview of how many; every action in the action log with who did it.

With ``DUEFLOW_CONSOLE_SCREENSHOTS=DIR`` the pages' screenshots are written
to DIR (``docs/img`` for the docs).
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from selenium.common.exceptions import (
    NoSuchElementException,
    StaleElementReferenceException,
    TimeoutException,
)
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import Select, WebDriverWait

from dueflow.broker.ports import free_port
from dueflow.kafka.pausing import read_queue_controls
from dueflow.kafka.reading import ops_consumer
from dueflow.producers.scheduler import Scheduler
from dueflow.rules.job_state import MESSAGE_MAX_CHARS
from tests.integration.pipeline_support import QUEUE, Pipeline, scrape, wait_for
from tests.integration.status_support import ViewProcess, outcome, write_outcomes
from tests.integration.test_status_page import browser, pipeline  # noqa: F401 (fixtures)

CONSOLE_URL = re.compile(r"operator console: (http://\S+/console#token=([A-Za-z0-9_-]+))")


def until(driver: WebDriver, what: str, check: Any, view: ViewProcess, timeout: float = 60) -> Any:
    """Wait for ``check``; on a timeout say what the page and the view said."""
    try:
        return WebDriverWait(driver, timeout, poll_frequency=0.2).until(check)
    except TimeoutException:
        raise AssertionError(
            f"{what}: not within {timeout} s; message {message(driver)!r}\n{view.log()}"
        ) from None


def message(driver: WebDriver) -> str:
    text: str = driver.execute_script("return document.getElementById('message').textContent")
    return text


def shoot(driver: WebDriver, name: str, tmp: Path) -> None:
    where = os.environ.get("DUEFLOW_CONSOLE_SCREENSHOTS")
    folder = Path(where) if where else tmp
    folder.mkdir(parents=True, exist_ok=True)
    driver.save_screenshot(str(folder / f"console-{name}.png"))


def rows(driver: WebDriver, table: str) -> list[list[str]]:
    script = (
        "return [...document.querySelectorAll(`${arguments[0]} tbody tr`)]"
        ".map((tr) => [...tr.querySelectorAll('td')].map((td) => td.textContent));"
    )
    found: list[list[str]] = driver.execute_script(script, table)
    return found


def click(driver: WebDriver, css: str, view: ViewProcess) -> None:
    """Click the element ``css`` names, found again when the page re-rendered its table
    between the find and the click (the live tables refresh every few seconds)."""

    def clicked(d: WebDriver) -> bool:
        try:
            d.find_element(By.CSS_SELECTOR, css).click()
        except (StaleElementReferenceException, NoSuchElementException):
            return False
        return True

    until(driver, f"a click on {css}", clicked, view)


def tab(driver: WebDriver, name: str) -> None:
    driver.find_element(By.CSS_SELECTOR, f'button.tab[data-tab="{name}"]').click()


def find(driver: WebDriver, *, state: str = "", task: str = "") -> None:
    choice = Select(driver.find_element(By.ID, "f-state"))
    if state:
        choice.select_by_visible_text(state)
    else:
        choice.select_by_value("")
    task_box = driver.find_element(By.ID, "f-task")
    task_box.clear()
    task_box.send_keys(task)
    driver.find_element(By.CSS_SELECTOR, "#search button[type=submit]").click()


def printed_console_url(view: ViewProcess) -> tuple[str, str]:
    found = wait_for("the console URL printed", lambda: CONSOLE_URL.search(view.log()), 30)
    return found.group(1), found.group(2)


@pytest.mark.timeout(300)
def test_console_finds_opens_retries_pauses_and_redrives(
    pipeline: Pipeline,  # noqa: F811 (the fixture imported above)
    browser: WebDriver,  # noqa: F811
    tmp_path: Path,
) -> None:
    p = pipeline
    port, em_port = free_port(), free_port()
    started = p.start("view", "status-view", "--port", str(port), "--data-dir", str(tmp_path / "d"))
    view = ViewProcess(started.popen, port, started.log_path)
    p.emitter(em_port)
    p.worker(free_port())
    view.wait_ready()
    wait_for(
        "an active emitter",
        lambda: (s := scrape(em_port)) is not None and s.value("dueflow_emitter_leader") == 1,
    )
    marker = tmp_path / "bug-not-fixed"
    marker.write_text("")
    with Scheduler(p.settings, scheduled_outcomes=True) as s:
        broken = s.schedule("until_fixed", {"marker": str(marker)}, queue=QUEUE)
        doomed = [s.schedule("doomed", {"n": i}, queue=QUEUE) for i in range(2)]
        fine = s.schedule("ok", {"to": "console"}, queue=QUEUE)
    view.wait_job(broken.job_id, "dead", timeout_s=90)
    for d in doomed:
        view.wait_job(d.job_id, "dead", timeout_s=90)
    view.wait_job(fine.job_id, "succeeded", timeout_s=90)

    # Log in with the token in the URL's fragment: it leaves the address bar.
    url, token = printed_console_url(view)
    browser.get(url)
    until(browser, "logged in", lambda d: "operator" in d.find_element(By.ID, "who").text, view)
    assert "token" not in browser.current_url
    assert token not in browser.page_source

    # Find the failed job and open it: its timeline and its error, as text.
    find(browser, state="dead", task="until_fixed")
    until(
        browser,
        "the dead job found",
        lambda d: [r[0] for r in rows(d, "#jobs")] == [broken.job_id],
        view,
    )
    shoot(browser, "find", tmp_path)
    click(browser, f'#jobs tr[data-job-id="{broken.job_id}"] button', view)
    until(
        browser,
        "the job page",
        lambda d: d.find_element(By.ID, "job-id").text == broken.job_id,
        view,
    )
    timeline = rows(browser, "#timeline")
    assert [r[1] for r in timeline][-1] == "dead", timeline
    assert any("<script>window.__xss = 1</script>" in r[4] for r in timeline), timeline
    assert browser.execute_script("return window.__xss === undefined")
    attempts = rows(browser, "#attempts")
    assert attempts[0][0] == "1"
    assert attempts[0][4] == "dead"
    browser.find_element(By.ID, "load-dead").click()
    until(
        browser,
        "the dead letter",
        lambda d: "traceback" in d.find_element(By.ID, "dead").text,
        view,
    )
    dead_text = browser.find_element(By.ID, "dead").text
    assert "RuntimeError" in dead_text
    assert str(marker) in dead_text  # the payload, shown to operators
    shoot(browser, "job", tmp_path)

    # The bug is fixed: retry the job, twice (a double click acts once); it succeeds.
    marker.unlink()
    retry = browser.find_element(By.CSS_SELECTOR, '[data-act="retry"]')
    browser.execute_script("arguments[0].click(); arguments[0].click();", retry)
    until(browser, "the retry answered", lambda d: "redriven" in message(d), view)
    view.wait_job(broken.job_id, "succeeded", timeout_s=90)
    click(browser, f'#jobs tr[data-job-id="{broken.job_id}"] button', view)
    until(
        browser,
        "shown succeeded",
        lambda d: d.find_element(By.ID, "job-state").text == "succeeded",
        view,
    )

    # A doomed job's page: after its failed first attempt, when the second was due.
    find(browser, state="dead", task="doomed")
    until(browser, "the doomed jobs found", lambda d: len(rows(d, "#jobs")) == 2, view)
    first = doomed[0].job_id
    click(browser, f'#jobs tr[data-job-id="{first}"] button', view)
    until(browser, "its page", lambda d: d.find_element(By.ID, "job-id").text == first, view)
    timeline = rows(browser, "#timeline")
    events = [r[1] for r in timeline]
    assert events.index("retrying") < events.index("retry due") < events.index("dead"), timeline
    (due_row,) = [r for r in timeline if r[1] == "retry due"]
    assert due_row[2] == "2"
    assert due_row[4].startswith("attempt 2 not before this ("), due_row
    assert due_row[4].endswith(" ago)"), due_row  # the view's clock: it is past
    attempts = rows(browser, "#attempts")
    assert [(a[0], a[4], a[7]) for a in attempts] == [
        ("1", "retrying", due_row[0]),
        ("2", "dead", ""),
    ]

    # Pause the queue, see it paused (as `dueflow queue list` reads it), resume it.
    tab(browser, "queues")
    pause = f'#queues button.pause[data-queue="{QUEUE}"]'
    until(browser, "the queue row", lambda d: d.find_elements(By.CSS_SELECTOR, pause), view)
    click(browser, pause, view)
    until(browser, "paused", lambda d: f"queue {QUEUE} paused" in message(d), view)
    consumer = ops_consumer(p.settings)
    try:
        controls, _problems = read_queue_controls(p.settings, consumer)
    finally:
        consumer.close()
    assert controls[QUEUE].paused
    assert controls[QUEUE].by.startswith("anonymous (operator")
    until(
        browser,
        "the row says paused",
        lambda d: any(r[1] == "paused" for r in rows(d, "#queues")),
        view,
    )
    shoot(browser, "queues", tmp_path)
    click(browser, pause, view)
    until(browser, "resumed", lambda d: f"queue {QUEUE} resumed" in message(d), view)

    # Redrive the doomed jobs' dead letters by filter, after the preview's count.
    tab(browser, "dlq")
    browser.find_element(By.ID, "r-task").send_keys("doomed")
    browser.find_element(By.CSS_SELECTOR, "#redrive button[type=submit]").click()
    until(
        browser,
        "the preview",
        lambda d: (
            d.find_element(By.ID, "redrive-preview").text == "2 dead letters would be redriven"
        ),
        view,
    )
    shoot(browser, "redrive", tmp_path)
    browser.execute_script("window.confirm = () => true;")
    browser.find_element(By.ID, "redrive-go").click()
    until(browser, "redriven", lambda d: message(d).startswith("2 redriven, 0 not"), view)

    # The redriven jobs die again (doomed): 5 dead letters. Delete those written
    # before a minute from now, after the preview's count.
    def dlq_depth() -> int | None:
        status, doc = view.get("/queues")
        return doc["queues"][QUEUE]["dlq_depth"] if status == 200 else None

    wait_for("5 dead letters", lambda: dlq_depth() == 5, 90)
    purge_before = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() + 60))
    browser.find_element(By.ID, "p-before").send_keys(purge_before)
    browser.find_element(By.CSS_SELECTOR, "#purge button[type=submit]").click()
    until(
        browser,
        "the purge preview",
        lambda d: (
            d.find_element(By.ID, "purge-preview").text
            == f"5 dead letters of {QUEUE} would be deleted"
        ),
        view,
    )
    browser.find_element(By.ID, "purge-go").click()
    until(browser, "purged", lambda d: message(d) == f"5 dead letters of {QUEUE} deleted", view)
    wait_for("an empty DLQ", lambda: dlq_depth() == 0, 60)

    # Every action is in the log, with who did it.
    tab(browser, "actions")
    until(browser, "the action log", lambda d: len(rows(d, "#actions")) >= 7, view)
    log = rows(browser, "#actions")
    assert [r[2] for r in log] == [
        "purge",
        "purge preview",
        "redrive",
        "redrive preview",
        "resume queue",
        "pause queue",
        "retry",
    ]
    assert all("operator" in r[1] for r in log)
    assert "console.action" in view.log()  # the view's own log has them too

    # Hostile data from any writer: markup in a task name, a 20,000-character error.
    hostile_task = "<img src=x onerror=window.__xss=2>"
    long_error = "<b>" + "x" * 20_000 + "</b>"
    now = int(time.time() * 1000)
    write_outcomes(
        p.settings,
        [
            outcome("hostile-1", "scheduled", at_ms=now, queue=QUEUE, task=hostile_task),
            outcome(
                "hostile-1",
                "dead",
                at_ms=now + 1,
                queue=QUEUE,
                task=hostile_task,
                attempt=1,
                error_type="<svg onload=window.__xss=3>",
                error=long_error,
            ),
        ],
    )
    view.wait_job("hostile-1", "dead")
    tab(browser, "jobs")
    find(browser, task=hostile_task)
    until(
        browser,
        "the hostile job found",
        lambda d: rows(d, "#jobs")[:1] and rows(d, "#jobs")[0][0] == "hostile-1",
        view,
    )
    row = rows(browser, "#jobs")[0]
    assert row[2] == hostile_task
    # The view keeps an error message's first MESSAGE_MAX_CHARS characters.
    shown_error = long_error[: MESSAGE_MAX_CHARS - 3] + "..."
    assert row[7] == f"<svg onload=window.__xss=3>: {shown_error}"
    click(browser, '#jobs tr[data-job-id="hostile-1"] button', view)
    until(
        browser,
        "the hostile job page",
        lambda d: d.find_element(By.ID, "job-id").text == "hostile-1",
        view,
    )
    assert browser.execute_script("return window.__xss === undefined")
    width = browser.execute_script("return document.documentElement.scrollWidth")
    assert width <= 1400, f"a long error widened the page to {width} px"

    # Watch: the queue's last hour and the emitter's leader.
    tab(browser, "watch")
    until(
        browser,
        "the emitter shown",
        lambda d: "emitter: active" in d.find_element(By.ID, "emitter").text,
        view,
    )
    until(browser, "the watch row", lambda d: any(r[0] == QUEUE for r in rows(d, "#watch")), view)
    shoot(browser, "watch", tmp_path)

    # Without a session the API refuses the actions (no cookie, no token).
    req = urllib.request.Request(
        f"{view.url}/api/queues/{QUEUE}/pause",
        data=b"{}",
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req, timeout=5)
    assert refused.value.code == 401
    assert "token" in json.loads(refused.value.read())["error"]
