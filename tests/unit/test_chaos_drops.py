"""The chaos evidence reads a worker's log for the moments it dropped uncommitted work."""

from __future__ import annotations

from pathlib import Path

from tests.chaos.evidence import read_drops
from tests.chaos.facts import Dropped

LOG = b"""\
{"ts":"2026-12-01T21:37:31.183Z","level":"info","event":"worker started","worker":"vm:7"}
%3|1796161075.183|FAIL|rdkafka#producer-6| Connect failed: Connection refused
{"ts":"2026-12-01T21:37:47.278Z","level":"warning","event":"partitions lost","queue":"chaos"}
{"ts":"2026-12-01T21:38:29.507Z","level":"warning","event":"worker restarting queue",\
"queue":"chaos","reason":"transactional producer wedged: commit did not return within 30 s",\
"in_doubt_since_ms":1796161079507}
{"ts":"2026-12-01T21:38:29.600Z","level":"info","event":"job.started","job_id":"x"}
{"ts": broken json
"""


def test_drops_are_the_lost_partitions_and_queue_restarts_of_the_log(tmp_path: Path) -> None:
    log = tmp_path / "worker-1.log"
    log.write_bytes(LOG)
    assert read_drops(7, log) == [
        Dropped(7, 1_796_161_067_278, "partitions lost"),
        Dropped(
            7,
            1_796_161_109_507,
            "worker restarting queue: transactional producer wedged",
            1_796_161_079_507,
        ),
    ]
    assert read_drops(7, tmp_path / "none.log") == []
