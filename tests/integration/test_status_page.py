"""The status page in a real headless Chromium (Debian's chromium + chromedriver),
over a real pipeline: the SDK schedules jobs (with ``scheduled`` outcomes on),
``dueflow emitter``, ``dueflow worker`` and ``dueflow status-view`` run as
processes. The page must show the job, follow its state from ``scheduled`` to
``succeeded`` without a reload, show a dead-lettered job in the DLQ table,
and say "unknown / pending" for a job id it has no outcome for.

The redrive button needs the view's token (none is configured: the view makes
one and prints the page URL with it): without it the API refuses and the page
says why; with the token typed into the page, or from the printed URL, the
redrive runs and the dead job runs again.
"""

from __future__ import annotations

import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from selenium import webdriver
from selenium.common.exceptions import (
    NoSuchElementException,
    StaleElementReferenceException,
    TimeoutException,
)
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from dueflow.broker.ports import free_port
from dueflow.producers.scheduler import Scheduler
from tests.conftest import KafkaCluster
from tests.integration.pipeline_support import QUEUE, Pipeline, scrape, wait_for
from tests.integration.status_support import ViewProcess, outcome, write_outcomes

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[WebDriver]:
    for path in (CHROMIUM, CHROMEDRIVER):
        if not Path(path).exists():
            pytest.fail(f"{path} is missing: run `make browser-deps` (Debian chromium)")
    profile = tempfile.mkdtemp(prefix="chromium-", dir=tmp_path)
    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in (
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--window-size=1280,1000",
        f"--user-data-dir={profile}",
    ):
        opts.add_argument(arg)
    # An explicit driver path: selenium never looks for or downloads a driver.
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    try:
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


@pytest.fixture
def pipeline(kafka: KafkaCluster, prefix: str, tmp_path: Path) -> Iterator[Pipeline]:
    p = Pipeline(kafka.bootstrap, prefix, tmp_path)
    try:
        yield p
    finally:
        p.stop_all()


# The page rewrites its tables every second: read them with one script call
# each, so no element reference goes stale between finding and reading it.


def _state_of(driver: WebDriver, job_id: str) -> str | None:
    script = (
        "const td = document.querySelector("
        "`#recent-jobs tr[data-job-id='${arguments[0]}'] td.state`);"
        "return td ? td.textContent : null;"
    )
    state: str | None = driver.execute_script(script, job_id)
    return state


def _queue_row(driver: WebDriver) -> list[str]:
    script = (
        "const tr = document.querySelector(`#queues tr[data-queue='${arguments[0]}']`);"
        "return tr ? [...tr.querySelectorAll('td')].map((td) => td.textContent) : [];"
    )
    row: list[str] = driver.execute_script(script, QUEUE)
    return row


def _progress_of(driver: WebDriver, job_id: str) -> tuple[float, str] | None:
    """The value of the job's progress bar and its cell's text, when it has one."""
    script = (
        "const td = document.querySelector("
        "`#recent-jobs tr[data-job-id='${arguments[0]}'] td.progress`);"
        "const bar = td ? td.querySelector('progress') : null;"
        "return bar ? [bar.value, td.textContent] : null;"
    )
    got: list[Any] | None = driver.execute_script(script, job_id)
    return None if got is None else (float(got[0]), str(got[1]))


def _click_redrive(driver: WebDriver) -> bool:
    """Click the queue's redrive button once it is enabled (found afresh each try)."""
    try:
        button = driver.find_element(By.CSS_SELECTOR, f'button.redrive[data-queue="{QUEUE}"]')
        if not button.is_enabled():
            return False
        button.click()
    except (NoSuchElementException, StaleElementReferenceException):
        return False
    return True


@pytest.mark.timeout(240)
def test_page_follows_a_real_job_to_succeeded_without_reloading(
    pipeline: Pipeline, browser: WebDriver, tmp_path: Path
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

    browser.get(view.url + "/")
    assert browser.title == "dueflow status"
    browser.execute_script("window.__sameDocument = 'yes';")

    # A job id nobody wrote an outcome for: unknown / pending.
    browser.find_element(By.ID, "lookup-id").send_keys("not-scheduled-yet")
    browser.find_element(By.CSS_SELECTOR, "#lookup button").click()
    until(
        browser,
        "the lookup answered",
        lambda d: d.find_element(By.ID, "lookup-result").get_attribute("data-state"),
        view,
    )
    result = browser.find_element(By.ID, "lookup-result")
    assert result.get_attribute("data-state") == "unknown"
    assert "unknown / pending" in result.text

    # Due in 10 s: the page shows it scheduled first, then succeeded.
    with Scheduler(p.settings, scheduled_outcomes=True) as s:
        job = s.schedule("ok", {"to": "page"}, queue=QUEUE, delay=10)
        doomed = s.schedule("doomed", {}, queue=QUEUE)
    until(
        browser, "the job shown scheduled", lambda d: _state_of(d, job.job_id) == "scheduled", view
    )
    # The scheduled column: both jobs, until the doomed one (due now) moves on.
    until(
        browser, "one job scheduled in the queue row", lambda d: _queue_row(d)[1:2] == ["1"], view
    )
    until(browser, "the job succeeded", lambda d: _state_of(d, job.job_id) == "succeeded", view)
    assert browser.execute_script("return window.__sameDocument") == "yes", "page was reloaded"

    # A running job's progress (a worker's started outcome with ctx.progress): a bar.
    now = int(time.time() * 1000)
    write_outcomes(
        p.settings,
        [
            outcome("running-job", "started", at_ms=now, queue=QUEUE, attempt=1),
            outcome(
                "running-job",
                "started",
                at_ms=now + 1,
                queue=QUEUE,
                attempt=1,
                progress=0.4,
                progress_detail=b'{"rows":40}',
            ),
        ],
    )
    until(browser, "a progress bar at 40%", lambda d: _progress_of(d, "running-job"), view)
    shown = _progress_of(browser, "running-job")
    assert shown is not None
    bar, text = shown
    assert bar == 0.4
    assert text.startswith("40%")
    assert '{"rows":40}' in text
    until(browser, "the doomed job dead", lambda d: _state_of(d, doomed.job_id) == "dead", view)
    texts = _queue_row(browser)
    assert texts[0] == QUEUE
    assert texts[1] == "0"  # scheduled
    assert texts[5] == "1"  # succeeded
    assert texts[6] == "1"  # dead

    # The dead letter shows in the DLQ table; the redrive button reaches the view.
    dead_row = f'#dlq tr[data-job-id="{doomed.job_id}"]'
    until(
        browser,
        "the dead letter in the DLQ table",
        lambda d: bool(d.find_elements(By.CSS_SELECTOR, dead_row)),
        view,
    )
    # Counted records, not offsets (commit markers take offsets too): the idle
    # queue has no lag, one dead letter, and no timer is pending.
    until(browser, "no lag and one dead letter", lambda d: _queue_row(d)[8:10] == ["0", "1"], view)
    timers = "return [...document.querySelectorAll('#timers td.num')].map((td) => td.textContent)"
    until(
        browser,
        "no pending timers",
        lambda d: d.execute_script(timers) == ["0", "0", "0", "0"],
        view,
    )
    printed, token = view.printed_url()

    # Without the token: the API refuses, the page says why and asks for it.
    until(browser, "the redrive button clicked", _click_redrive, view)
    until(browser, "a refused redrive", lambda d: "refused (401)" in _message(d), view)
    assert "token" in _message(browser), _message(browser)
    assert browser.find_element(By.ID, "token-form").is_displayed()
    assert _queue_row(browser)[9] == "1", "nothing was redriven"

    # The token typed into the page: the redrive runs; the job runs again and,
    # doomed, is dead-lettered a second time.
    browser.find_element(By.ID, "token-input").send_keys(token)
    browser.find_element(By.CSS_SELECTOR, "#token-form button").click()
    until(browser, "the token kept", lambda d: _message(d).startswith("token kept"), view)
    assert not browser.find_element(By.ID, "token-form").is_displayed()
    until(browser, "the redrive button clicked", _click_redrive, view)
    redriven = f"redrive of {QUEUE}: 1 redriven, 0 not redriven"
    until(browser, "one dead letter redriven", lambda d: _message(d) == redriven, view)
    until(browser, "the job dead again", lambda d: _queue_row(d)[9] == "2", view)
    assert browser.execute_script("return window.__sameDocument") == "yes", "page was reloaded"

    # A new tab's way: the URL the view printed. The page keeps the token for the tab,
    # takes it out of the address bar, and the button works at once.
    browser.execute_script("sessionStorage.clear()")
    browser.get(printed)
    assert "token=" not in browser.current_url
    stored = browser.execute_script("return sessionStorage.getItem('dueflow-status-token')")
    assert stored == token
    until(browser, "the redrive button clicked", _click_redrive, view)
    # (The first dead letter was redriven already: the report counts it as not redriven.)
    answered = re.compile(rf"redrive of {QUEUE}: \d+ redriven, \d+ not redriven")
    until(browser, "the redrive answered", lambda d: answered.match(_message(d)), view)
    assert not browser.find_element(By.ID, "token-form").is_displayed()
    browser.save_screenshot(str(tmp_path / "status-page.png"))


def until(driver: WebDriver, what: str, check: Any, view: ViewProcess) -> None:
    """Wait up to 60 s for ``check``; on a timeout, say what the page and the view said."""
    try:
        WebDriverWait(driver, 60, poll_frequency=0.2).until(check)
    except TimeoutException:
        raise AssertionError(
            f"{what}: not within 60 s; message {_message(driver)!r}, queue row "
            f"{_queue_row(driver)}\n{view.log()}"
        ) from None


def _message(driver: WebDriver) -> str:
    text: str = driver.execute_script("return document.getElementById('message').textContent")
    return text
