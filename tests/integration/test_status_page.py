"""The status page in a real headless Chromium (Debian's chromium + chromedriver).

The page must show a job the test scheduled and follow its state to
``succeeded`` without a reload. Outcomes are written with a plain producer
for now; the full-pipeline variant comes when the emitter and worker land.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

from dueflow import headers as hdr
from dueflow.clients import make_producer
from dueflow.config import Settings
from dueflow.schemas import codec
from dueflow.topics import names
from tests.conftest import KafkaCluster
from tests.integration.status_support import (
    ViewProcess,
    ensure_topics,
    outcome,
    start_view,
    write_outcomes,
)
from tests.integration.test_status_view import free_port

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
def view(
    kafka: KafkaCluster, prefix: str, tmp_path: Path
) -> Iterator[tuple[Settings, ViewProcess]]:
    settings = kafka.settings(prefix, queues="default:3")
    ensure_topics(settings)
    proc = start_view(
        settings, port=free_port(), data_dir=tmp_path / "data", log_path=tmp_path / "view.log"
    )
    try:
        proc.wait_ready()
        yield settings, proc
    finally:
        proc.stop()


def _state_of(driver: WebDriver, job_id: str) -> str | None:
    rows = driver.find_elements(
        By.CSS_SELECTOR, f'#recent-jobs tr[data-job-id="{job_id}"] td.state'
    )
    return rows[0].text if rows else None


def _dead_letter(settings: Settings, job_id: str) -> None:
    now = int(time.time() * 1000)
    rec = {
        "job_id": job_id,
        "queue": "default",
        "task": "send_email",
        "idempotency_key": f"k-{job_id}",
        "reason": "exhausted",
        "error_type": "SMTPError",
        "error_message": "mailbox unavailable",
        "attempts": 4,
        "first_failure_ms": now - 5000,
        "last_failure_ms": now,
        "dead_ms": now,
        "original_topic": names(settings).exec("default"),
        "original_partition": 0,
        "original_offset": 7,
        "job_value": b"",
    }
    p = make_producer(settings)
    p.produce(
        names(settings).dlq("default"),
        key=f"k-{job_id}".encode(),
        value=codec.encode("dead_letter", rec),
        partition=0,
        headers=[(hdr.SCHEMA, codec.schema_header("dead_letter"))],
    )
    assert p.flush(10) == 0


@pytest.mark.timeout(180)
def test_page_follows_a_job_to_succeeded_without_reloading(
    view: tuple[Settings, ViewProcess], browser: WebDriver, tmp_path: Path
) -> None:
    settings, proc = view
    job_id = f"page-job-{int(time.time())}"
    t = int(time.time() * 1000)
    write_outcomes(settings, [outcome(job_id, "scheduled", at_ms=t, due_ms=t + 2000)])

    browser.get(proc.url + "/")
    assert browser.title == "dueflow status"
    wait = WebDriverWait(browser, 30, poll_frequency=0.2)
    wait.until(lambda d: _state_of(d, job_id) == "scheduled")
    browser.execute_script("window.__sameDocument = 'yes';")
    row = browser.find_element(By.CSS_SELECTOR, '#queues tr[data-queue="default"]')
    assert row.find_elements(By.TAG_NAME, "td")[1].text == "1"  # scheduled column

    write_outcomes(settings, [outcome(job_id, "fired", at_ms=t + 2001)])
    wait.until(lambda d: _state_of(d, job_id) == "fired")
    write_outcomes(
        settings,
        [
            outcome(job_id, "started", at_ms=t + 2002, attempt=1),
            outcome(job_id, "succeeded", at_ms=t + 2010, attempt=1, duration_ms=8.0),
        ],
    )
    wait.until(lambda d: _state_of(d, job_id) == "succeeded")
    assert browser.execute_script("return window.__sameDocument") == "yes", "page was reloaded"
    cells = browser.find_element(By.CSS_SELECTOR, '#queues tr[data-queue="default"]')
    texts = [td.text for td in cells.find_elements(By.TAG_NAME, "td")]
    assert texts[0] == "default"
    assert texts[1] == "0"  # scheduled
    assert texts[5] == "1"  # succeeded

    # A dead letter shows in the DLQ table; the redrive button reaches the view.
    _dead_letter(settings, "dead-1")
    wait.until(lambda d: bool(d.find_elements(By.CSS_SELECTOR, '#dlq tr[data-job-id="dead-1"]')))
    button = browser.find_element(By.CSS_SELECTOR, 'button.redrive[data-queue="default"]')
    wait.until(lambda d: button.is_enabled())
    button.click()
    wait.until(lambda d: "not wired yet" in d.find_element(By.ID, "message").text)
    assert "501" in browser.find_element(By.ID, "message").text
    browser.save_screenshot(str(tmp_path / "status-page.png"))
