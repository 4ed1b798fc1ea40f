"""Operator output shows control characters escaped, never raw, and never raises.

One escaping function (:func:`dueflow.control_chars.escape_text`) for text, one
JSON writer (:func:`~dueflow.control_chars.json_text`) that stays valid JSON;
the CLI's tables, job and status views, and the text and JSON log lines use
them. (The same against the real broker, command by command:
``tests/integration/test_hostile_output.py``.)
"""

from __future__ import annotations

import json
import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dueflow.apps.cli.common import format_table, print_json, print_text
from dueflow.apps.cli.status_render import render_job, render_status
from dueflow.control_chars import escape_text, json_text
from dueflow.observability.logs import JsonFormatter, TextFormatter
from dueflow.timeutil import show_utc
from tests.unit.test_name_doors import RAW

ESC = "\x1b[31mred\x1b[0m"


def raw_in(text: str, keep: str = "") -> set[str]:
    return (set(text) & RAW) - set(keep)


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("plain id", "plain id"),
        ("a\x1b[31mb", "a\\x1b[31mb"),
        ("nul\x00", "nul\\x00"),
        ("cr\rlf\ntab\t", "cr\\rlf\\ntab\\t"),
        ("del\x7f", "del\\x7f"),
        ("csi\x9b31m nel\x85", "csi\\x9b31m nel\\x85"),
        ("rlo\u202eevil", "rlo\\u202eevil"),
        ("lri\u2066 pdi\u2069 alm\u061c lrm\u200e", "lri\\u2066 pdi\\u2069 alm\\u061c lrm\\u200e"),
        ("ls\u2028 ps\u2029", "ls\\u2028 ps\\u2029"),
        ("é 日本 👍 zwj\u200d", "é 日本 👍 zwj\u200d"),  # other characters stay
        ("lone\udcff", "lone\\udcff"),  # from surrogateescape decoding
        (b"\xff\xfebytes\x1b", "\\xff\\xfebytes\\x1b"),  # not UTF-8: each byte escaped
        (b"caf\xc3\xa9", "café"),
        (None, "None"),
        (42, "42"),
    ],
)
def test_escape_text(value: object, shown: str) -> None:
    assert escape_text(value) == shown


def test_escape_text_keeps_only_what_it_is_told_to() -> None:
    assert escape_text("a\nb\x1b\r", keep="\n") == "a\nb\\x1b\\r"


def test_escape_text_never_raises_even_on_a_hostile_str() -> None:
    class Hostile:
        def __str__(self) -> str:
            raise RuntimeError("no")

    assert escape_text(Hostile()) == "<Hostile: str() raised RuntimeError>"


@given(st.text() | st.binary())
def test_escaped_text_has_no_control_character(value: str | bytes) -> None:
    assert not raw_in(escape_text(value))


@given(
    st.recursive(
        st.text() | st.integers(-(2**63), 2**64 - 1) | st.none(),
        lambda c: st.lists(c) | st.dictionaries(st.text(), c),
    )
)
def test_json_text_is_the_same_value_without_raw_control_characters(value: object) -> None:
    text = json_text(value, indent=True)
    assert not raw_in(text, keep="\n")
    assert json.loads(text) == json.loads(json.dumps(value))


def test_json_text_writes_what_orjson_refuses_as_text() -> None:
    text = json_text({"key\udcff": ["v\udcfe", 2**70, -(2**64)]})
    assert json.loads(text) == {"key\\udcff": ["v\\udcfe", str(2**70), str(-(2**64))]}


def test_tables_and_lines_escape_every_cell(capsys: pytest.CaptureFixture[str]) -> None:
    table = format_table(["job", "error"], [["id\n" + ESC, "e\u202e\x00"], [None, 3]])
    lines = table.splitlines()
    assert len(lines) == 4  # header, rule, two rows: no forged line
    assert "id\\n\\x1b[31mred\\x1b[0m" in lines[2]
    assert not raw_in(table, keep="\n")
    print_text(table)
    print_json({"job": "id\n" + ESC, "e": "\x9b\u202e\u2028"})
    out = capsys.readouterr().out
    assert not raw_in(out, keep="\n")
    assert '"job": "id\\n\\u001b[31mred\\u001b[0m"' in out


def test_the_job_view_escapes_job_data_and_takes_any_number() -> None:
    view = {
        "job_id": "id\n" + ESC,
        "queue": "q\x9b",
        "task": "t\u202e",
        "state": "dead\r",
        "attempts": 1,
        "due_ms": 2**70,  # another writer's: not a date
        "history": [["dead", 1, -(2**63)]],
        "last_error": {"type": "E\x1b[1m", "message": "boom\n\x00" + "x" * 10_000},
        "trace_id": "t\x07",
    }
    text = render_job(view, now_ms=0)
    assert not raw_in(text, keep="\n")
    assert len(text.splitlines()) == 14  # one line per field, whatever the data
    assert "ms (not a date)" in text


def test_the_status_view_escapes_cluster_data() -> None:
    doc = {
        "source": "kafka",
        "queues": {"jobs": {"counts": None, "lag": 1, "dlq_depth": 2, "paused": {"by": ESC}}},
        "timers_pending": {"near\x1b": 1},
        "active_emitter": {"client_id": "c\x9b", "host": "h\n"},
        "emitter_members": 1,
        "emitter_shards": {"0": "x\x1b", "1": None, "bad\x1b": "y"},
        "dlq_tail": [
            {
                "queue": "jobs",
                "job_id": "id" + ESC,
                "task": "t",
                "reason": "exhausted",
                "error_type": "E",
                "error_message": "m\u202e\n",
                "attempts": 4,
                "dead_ms": 10**20,
            }
        ],
        "errors": ["e\x1b[2J"],
    }
    text = render_status(doc)
    assert not raw_in(text, keep="\n")
    assert "id\\x1b[31mred" in text


@pytest.mark.parametrize("formatter", [TextFormatter(), JsonFormatter()])
def test_log_lines_escape_job_data(formatter: logging.Formatter) -> None:
    record = logging.LogRecord("dueflow.worker", logging.INFO, __file__, 1, "job.dead", None, None)
    record.job_id = "id\n" + ESC
    record.error = "boom\u202e\x9b\x00"
    record.attempt = 2**70  # orjson cannot write it: text instead of an exception
    line = formatter.format(record)
    assert "\n" not in line
    assert not raw_in(line)
    if isinstance(formatter, JsonFormatter):
        assert json.loads(line)["job_id"] == "id\n" + ESC


@pytest.mark.parametrize(
    ("ms", "shown"),
    [
        (0, "1970-01-01T00:00:00.000Z"),
        (2**70, f"{2**70} ms (not a date)"),
        ("x", "'x' ms (not a date)"),
    ],
)
def test_show_utc_never_raises(ms: object, shown: str) -> None:
    assert show_utc(ms) == shown
