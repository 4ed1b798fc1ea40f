"""The reasons of dead letters and quarantined records are a stable set: the lists in
docs/wire-format.md are the code's (``dueflow/reasons.py``), every reason is used,
and no quarantine call site makes up a reason of its own."""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from dueflow import reasons
from dueflow.rules.drain import classify_timer

ROOT = Path(__file__).resolve().parents[2]
WIRE_FORMAT = ROOT / "docs" / "wire-format.md"
SOURCES = ["dueflow", "consumers", "producers", "streams", "schemas"]
# Calls that take a quarantine reason, and where the reason is: (position, keyword).
REASON_ARGS = {"put": (1, "reason"), "put_raw": (None, "reason"), "_remember": (2, "reason")}


def _documented(heading: str) -> list[str]:
    """The first column of the first table after the bold ``heading`` on the page."""
    text = WIRE_FORMAT.read_text()
    after = text[text.index(f"**{heading}**") :]
    table = after[after.index("| reason |") :].split("\n\n", 1)[0]
    return re.findall(r"^\| `([^`]+)` \|", table, flags=re.M)


def _package_files() -> list[Path]:
    out = []
    for folder in SOURCES:
        out += [p for p in (ROOT / folder).rglob("*.py") if p.name != "reasons.py"]
    return out


def test_the_documented_dead_letter_reasons_are_the_code_s_and_the_schema_s() -> None:
    assert _documented("Dead letters.") == list(reasons.DEAD_LETTER_REASONS)
    schema = json.loads((ROOT / "schemas" / "dueflow" / "schemas" / "dead_letter.avsc").read_text())
    (field,) = [f for f in schema["fields"] if f["name"] == "reason"]
    assert field["type"]["symbols"] == list(reasons.DEAD_LETTER_REASONS)


def test_the_documented_quarantine_reasons_are_the_code_s() -> None:
    documented = _documented("Quarantine.")
    assert documented == list(reasons.QUARANTINE_REASONS)
    assert len(set(documented)) == len(documented)
    for reason in documented:
        assert ": " not in reason, "the part before ': ' is the reason"


def test_every_reason_is_used_by_the_code() -> None:
    source = "\n".join(p.read_text() for p in _package_files())
    names = {
        name
        for name, value in vars(reasons).items()
        if name.isupper()
        and isinstance(value, str)
        and value in (*reasons.QUARANTINE_REASONS, *reasons.DEAD_LETTER_REASONS)
    }
    unused = {
        n for n in names if not re.search(rf"\b(reasons\.)?{n}\b", source) and n != "CONFLICT"
    }
    assert unused == set()


def test_no_quarantine_call_site_writes_a_reason_of_its_own() -> None:
    """A literal string (or an f-string starting with one) as the reason would be a
    reason outside the stable set: call sites take ``reasons.X`` or ``with_detail``."""
    literal: list[str] = []
    for path in _package_files():
        for node in ast.walk(ast.parse(path.read_text())):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Attribute):
                continue
            where = REASON_ARGS.get(node.func.attr)
            if where is None:
                continue
            position, keyword = where
            args = [k.value for k in node.keywords if k.arg == keyword]
            if position is not None and len(node.args) > position:
                args.append(node.args[position])
            for arg in args:
                is_text = isinstance(arg, ast.Constant) and isinstance(arg.value, str)
                starts_text = isinstance(arg, ast.JoinedStr) and isinstance(
                    arg.values[0], ast.Constant
                )
                if is_text or starts_text:
                    literal.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert literal == []


@pytest.mark.parametrize(
    ("headers", "key"),
    [
        (None, b"k"),
        ([("df-due", b"soon"), ("df-queue", b"default")], b"k"),
        ([("df-due", b"1")], b"k"),
        ([("df-due", b"1"), ("df-queue", b"nope")], b"k"),
        ([("df-due", b"1"), ("df-queue", b"default")], None),
        ([("df-due", b"1"), ("df-queue", b"default"), ("df-kind", b"x")], b"k"),
    ],
)
def test_the_emitter_s_timer_reasons_are_in_the_set(
    headers: list[tuple[str, bytes]] | None, key: bytes | None
) -> None:
    found = classify_timer(headers, key, {b"default": "p.exec.default"})
    assert isinstance(found, str)
    assert reasons.reason_label(found) in reasons.QUARANTINE_REASONS


def test_reason_label_is_the_part_before_the_detail() -> None:
    text = reasons.with_detail(reasons.UNDECODABLE_OUTCOME, "bad: avro")
    assert text == "undecodable outcome: bad: avro"
    assert reasons.reason_label(text) == reasons.UNDECODABLE_OUTCOME
    assert reasons.reason_label(reasons.MISSING_TIMER_KEY) == reasons.MISSING_TIMER_KEY
    assert reasons.reason_label("") == "unknown"
