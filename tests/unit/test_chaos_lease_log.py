"""The chaos cluster reads who holds the emitter lease from an emitter's own log when
the broker does not answer."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.chaos.cluster import LEASE_ACQUIRED, LEASE_ENDS, last_lease_event

ACQUIRED = b'{"ts":"t","event":"emitter lease acquired","lease":"l","shard":0}'
LOST = b'{"ts":"t","event":"emitter lease lost","lease":"l","shard":0}'
RELEASED = b'{"ts":"t","event":"emitter lease released","lease":"l","shard":0}'
OTHER_SHARD = b'{"ts":"t","event":"emitter lease acquired","lease":"l","shard":1}'
NOISE = b"%3|1796161075.183|FAIL|rdkafka#producer-6| Connect failed"


@pytest.mark.parametrize(
    ("lines", "last"),
    [
        ([ACQUIRED, NOISE], LEASE_ACQUIRED),
        ([ACQUIRED, LOST], LEASE_ENDS[0]),
        ([ACQUIRED, RELEASED, NOISE], LEASE_ENDS[1]),
        ([LOST, ACQUIRED], LEASE_ACQUIRED),
        ([LOST, OTHER_SHARD], LEASE_ENDS[0]),  # shard 1 is not the lease that counts
        ([NOISE], None),
    ],
)
def test_the_last_lease_event_of_shard_0_counts(
    tmp_path: Path, lines: list[bytes], last: bytes | None
) -> None:
    log = tmp_path / "emitter-1.log"
    log.write_bytes(b"\n".join(lines) + b"\n")
    assert last_lease_event(log) == last


def test_a_missing_log_says_nothing(tmp_path: Path) -> None:
    assert last_lease_event(tmp_path / "none.log") is None
