"""GroupProbe survives a child that aborts or hangs (no broker: fake children)."""

from __future__ import annotations

import sys
from pathlib import Path

from dueflow.kafka.group_probe import GroupProbe, Member

# A child that answers the first question, then aborts (as librdkafka does) on the next.
ANSWERS_THEN_ABORTS = """
import json, os, sys
sys.stdin.readline()  # the client's configuration
line = sys.stdin.readline().strip()
m = {"client_id": "c-" + line, "assignment": [["t", 0], ["t", 3]]}
print(json.dumps({"ok": True, "members": [m]}), flush=True)
sys.stdin.readline()
os.abort()
"""
HANGS = "import sys, time; sys.stdin.readline(); sys.stdin.readline(); time.sleep(60)"
SAYS_NO = """
import json, sys
sys.stdin.readline()
for _ in sys.stdin:
    print(json.dumps({"ok": False, "error": "timed out"}), flush=True)
"""


def _probe(code: str) -> GroupProbe:
    return GroupProbe(
        {"bootstrap.servers": "unused:1"}, cwd=Path.cwd(), command=[sys.executable, "-c", code]
    )


def test_answers_and_a_new_child_after_one_aborted() -> None:
    probe = _probe(ANSWERS_THEN_ABORTS)
    try:
        assert probe.members("g") == [Member("c-g", (("t", 0), ("t", 3)))]
        first = probe._proc
        assert probe.members("g") is None  # the child aborted: no answer, no exception
        assert probe.restarts == 1
        assert probe.members("h") == [Member("c-h", (("t", 0), ("t", 3)))]
        assert probe._proc is not first
    finally:
        probe.close()


def test_a_hung_child_is_killed_after_the_timeout() -> None:
    probe = _probe(HANGS)
    try:
        child = probe._child()
        assert child is not None
        assert probe.members("g", timeout_s=0.5) is None
        assert probe.restarts == 1
        assert probe._proc is None
        assert child.poll() is not None  # killed by pid and reaped
    finally:
        probe.close()


def test_an_error_answer_is_none_and_keeps_the_child() -> None:
    probe = _probe(SAYS_NO)
    try:
        assert probe.members("g") is None
        child = probe._proc
        assert probe.members("g") is None
        assert probe._proc is child
        assert probe.restarts == 0
    finally:
        probe.close()
