"""One table of job states: the outcome schema's `state` symbols (dueflow.rules.job_state)."""

from __future__ import annotations

from typing import Any

import pytest

from dueflow.records import codec
from dueflow.records import worker_codec as fast
from dueflow.rules import job_state


def _symbols(version: int) -> tuple[str, ...]:
    schema: dict[str, Any] = codec.schema_json("outcome", version)
    (state,) = [f for f in schema["fields"] if f["name"] == "state"]
    return tuple(state["type"]["symbols"])


@pytest.mark.parametrize(
    ("version", "table"),
    [
        (1, job_state.OUTCOME_STATES_V1),
        (2, job_state.OUTCOME_STATES_V2),
        (3, job_state.OUTCOME_STATES),
    ],
)
def test_the_table_is_the_schema_enum(version: int, table: tuple[str, ...]) -> None:
    assert table == _symbols(version)


def test_the_fast_codec_encodes_by_the_same_table() -> None:
    assert fast.JOB_STATES is job_state.OUTCOME_STATES
    assert set(_symbols(2)) - set(_symbols(1)) == fast.V2_STATES
    assert set(_symbols(3)) - set(_symbols(2)) == fast.V3_STATES


def test_a_view_takes_every_state_but_unknown_and_refused() -> None:
    assert set(job_state.STATES) == set(_symbols(3)) - {"unknown", "refused"}
