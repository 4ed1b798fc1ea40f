"""A handler's result and progress values as the outcome carries them (pure)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest

from dueflow.config import load_settings
from dueflow.consumers.registry import TaskSpec
from dueflow.errors import ConfigError, InvalidInput
from dueflow.records.job_result import (
    PROGRESS_DETAIL_MAX_BYTES,
    JobResult,
    Progress,
    check_progress,
    decode_result,
    encode_result,
    limit_result,
    to_json,
)


@dataclasses.dataclass
class Point:
    x: int
    y: float


@pytest.mark.parametrize(
    ("value", "json"),
    [
        ({"sum": 6}, b'{"sum":6}'),
        ([1, "a", None], b'[1,"a",null]'),
        ("text", b'"text"'),
        (0, b"0"),
        (False, b"false"),
        (Point(1, 2.5), b'{"x":1,"y":2.5}'),
    ],
)
def test_a_json_value_is_kept_as_its_json(value: Any, json: bytes) -> None:
    assert encode_result(value, max_bytes=1_000) == JobResult(json)
    assert decode_result(json) == orjson_value(value)


def orjson_value(value: Any) -> Any:
    return dataclasses.asdict(value) if isinstance(value, Point) else value


def test_none_is_no_result() -> None:
    assert encode_result(None, max_bytes=10) is None
    assert decode_result(None) is None


@pytest.mark.parametrize(
    ("value", "says"),
    [
        ({1, 2}, "result is not JSON: set value"),
        (b"raw", "result is not JSON: bytes value"),
        ({"a": [1.0, math.nan]}, "result['a'][1] is nan (JSON has no NaN or Infinity)"),
        (math.inf, "result is inf"),
        ({1: "x"}, "result is not JSON: dict value"),
    ],
)
def test_a_value_json_cannot_hold_gives_an_error_naming_it(value: Any, says: str) -> None:
    result = encode_result(value, max_bytes=1_000)
    assert result is not None
    assert result.json is None
    assert result.error is not None
    assert says in result.error


def test_a_result_over_the_cap_gives_an_error_with_both_sizes() -> None:
    value = "x" * 81_232  # 81,234 bytes of JSON with the quotes
    result = encode_result(value, max_bytes=65_536)
    assert result == JobResult(
        None,
        "result of 81,234 bytes exceeds worker.result_max_bytes = 65,536 "
        "(a task's own: @task(result_max_bytes=...))",
    )
    assert encode_result(value, max_bytes=81_234) == JobResult(b'"' + value.encode() + b'"')


def test_a_child_process_encodes_without_the_cap_and_the_worker_applies_it() -> None:
    encoded = to_json(list(range(100)))
    assert to_json(encoded) is encoded  # already encoded: as is
    assert limit_result(encoded, max_bytes=10).error is not None
    assert limit_result(encoded, max_bytes=10_000) is encoded


@pytest.mark.parametrize(
    ("fraction", "detail", "expected"),
    [
        (0.5, None, Progress(0.5, None)),
        (0, None, Progress(0.0, None)),
        (1, {"rows": 3}, Progress(1.0, b'{"rows":3}')),
        (None, "loading", Progress(None, b'"loading"')),
        (None, "x" * (PROGRESS_DETAIL_MAX_BYTES - 2), Progress(None, b'"' + b"x" * 1022 + b'"')),
    ],
)
def test_progress_is_a_fraction_and_or_a_small_json_detail(
    fraction: Any, detail: Any, expected: Progress
) -> None:
    assert check_progress(fraction, detail) == expected


@pytest.mark.parametrize(
    ("fraction", "detail", "field", "accepted"),
    [
        (1.5, None, "fraction", "a number from 0 to 1"),
        (-0.1, None, "fraction", "a number from 0 to 1"),
        (math.nan, None, "fraction", "a number from 0 to 1"),
        (True, None, "fraction", "a number from 0 to 1"),
        ("half", None, "fraction", "a number from 0 to 1"),
        (None, None, "fraction", "a detail (both None)"),
        (0.5, {1, 2}, "detail", "a JSON value"),
        (0.5, "x" * PROGRESS_DETAIL_MAX_BYTES, "detail", "at most 1,024 bytes of JSON"),
    ],
)
def test_bad_progress_names_the_field_and_what_is_accepted(
    fraction: Any, detail: Any, field: str, accepted: str
) -> None:
    with pytest.raises(InvalidInput) as err:
        check_progress(fraction, detail)
    assert err.value.field == field
    assert accepted in str(err.value)


@pytest.mark.parametrize("cap", [0, -1, 262_145, True, 1.5, "64k"])
def test_the_result_cap_setting_is_checked(cap: Any) -> None:
    with pytest.raises(ConfigError, match=r"worker\.result_max_bytes"):
        load_settings(env={}, overrides={"worker": {"result_max_bytes": cap}})
    with pytest.raises(InvalidInput, match=r"task\.result_max_bytes"):
        TaskSpec("t", result_max_bytes=cap).validate()


@pytest.mark.parametrize(
    ("setting", "value"),
    [
        ("progress_interval_ms", 0),
        ("progress_max_per_s", 0),
        ("report_running_after_ms", -1),
    ],
)
def test_the_progress_settings_are_checked(setting: str, value: int) -> None:
    with pytest.raises(ConfigError, match=f"worker.{setting}"):
        load_settings(env={}, overrides={"worker": {setting: value}})


def test_the_defaults() -> None:
    ws = load_settings(env={}).worker
    assert (
        ws.result_max_bytes,
        ws.progress_interval_ms,
        ws.progress_max_per_s,
        ws.report_running_after_ms,
    ) == (65_536, 1_000, 500, 1_000)


def test_a_result_the_cap_allows_is_one_the_status_view_keeps() -> None:
    from dueflow.config import RESULT_MAX_BYTES_LIMIT
    from dueflow.rules.job_state import JSON_FIELD_MAX_BYTES

    assert RESULT_MAX_BYTES_LIMIT <= JSON_FIELD_MAX_BYTES
    load_settings(env={}, overrides={"worker": {"result_max_bytes": RESULT_MAX_BYTES_LIMIT}})
