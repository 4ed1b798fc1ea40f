"""A process started as the chaos suite starts a skewed one: its wall clock is off by the
skew, and its waits (Python locks, sleeps, asyncio, librdkafka) last as long as asked.

Needs Debian's libfaketime and a C compiler (``make faketime-deps``); without them
this fails, as the chaos run does.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.chaos.skew import ClockSkewer

PROBE = r"""
import asyncio, json, queue, threading, time
from confluent_kafka import Consumer

def took(f):
    a = time.monotonic(); f(); return round(time.monotonic() - a, 3)

def qget():
    try:
        queue.Queue().get(timeout=0.3)
    except queue.Empty:
        pass

consumer = Consumer({"bootstrap.servers": "127.0.0.1:1", "group.id": "g", "log_level": 0})
out = {
    "wall_ms": time.time_ns() // 1_000_000,
    "sleep": took(lambda: time.sleep(0.3)),
    "event": took(lambda: threading.Event().wait(0.3)),
    "queue": took(qget),
    "asyncio": took(lambda: asyncio.run(asyncio.sleep(0.3))),
    "rdkafka_poll": took(lambda: consumer.poll(0.3)),
}
consumer.close()
print(json.dumps(out))
"""


@pytest.mark.chaos
@pytest.mark.timeout(60)
@pytest.mark.parametrize("skew_ms", [2000, -2000])
def test_a_skewed_process_has_its_clock_off_and_its_waits_right(
    tmp_path: Path, skew_ms: int
) -> None:
    env = ClockSkewer(tmp_path).env(dict(os.environ), skew_ms)
    began = time.monotonic()
    before = time.time_ns() // 1_000_000
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=30
    )
    after = time.time_ns() // 1_000_000
    elapsed = time.monotonic() - began
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert before + skew_ms - 50 <= out["wall_ms"] <= after + skew_ms + 50
    for wait in ("sleep", "event", "queue", "asyncio", "rdkafka_poll"):
        assert 0.28 <= out[wait] <= 0.8, (wait, out)
    assert elapsed < 15, out  # no wait took the skew (or decades) longer, seen from outside
