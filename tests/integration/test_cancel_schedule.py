"""``dueflow cancel --schedule``: the schedule stops and its pending occurrence never runs."""

from __future__ import annotations

import time
from pathlib import Path

import orjson
import pytest

from dueflow.apps.cli.main import main
from dueflow.kafka.topics import names
from dueflow.producers.scheduler import Scheduler
from tests.conftest import KafkaCluster
from tests.integration.worker_support import (
    FAST_WORKER,
    Ledger,
    WorkerThread,
    ledger_registry,
    outcomes_of,
    read_topic,
    wait_for,
)
from tests.support.emitters import FAST_EMITTER, SMALL_WHEEL, ensure_topics, threaded_emitter

QUEUE = "default"


@pytest.mark.timeout(180)
def test_cancel_by_schedule_pauses_it_and_cancels_the_occurrence_in_the_wheel(
    kafka: KafkaCluster, prefix: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    s = kafka.settings(
        prefix,
        queues=f"{QUEUE}:2",
        wheel=SMALL_WHEEL,
        emitter=FAST_EMITTER,
        worker=FAST_WORKER,
    )
    ensure_topics(s)
    ledger = Ledger(tmp_path / "ledger.db")

    def ran() -> list[int]:
        return sorted(int(k.rsplit("@", 1)[1]) for k in ledger.effects())

    with (
        threaded_emitter(s) as em,
        WorkerThread(s, ledger_registry(ledger, name="tick", queue=QUEUE), queues=[QUEUE]),
    ):
        em.wait_active()
        with Scheduler(s) as scheduler:
            scheduler.add_schedule("every5", cron="*/5 * * * * *", timezone="UTC", task="tick")
        wait_for("two occurrences", lambda: len(ran()) >= 2, 60)
        # Right after an occurrence ran, the next one is seconds away: the
        # cancellation lands before it is due.
        wait_for("a fresh occurrence", lambda: time.time() * 1000 - max(ran()) < 1500, 30)
        capsys.readouterr()
        config = tmp_path / "dueflow.toml"
        config.write_text(
            "[wheel]\n"
            + "".join(f"{k} = {v!r}\n" for k, v in SMALL_WHEEL.items()).replace("'", '"')
        )
        code = main(
            [
                "cancel",
                "--config",
                str(config),
                "--schedule",
                "every5",
                "--json",
                *kafka.cli_options(prefix),
                "--queues",
                f"{QUEUE}:2",
            ]
        )
        assert code == 0
        result = orjson.loads(capsys.readouterr().out)
        assert result["action"] == "paused"
        pending = result["occurrence_ms"]
        assert result["cancelled_occurrence"] == f"every5@{pending}"
        before = ran()
        assert pending > max(before)
        # Watch past the cancelled occurrence and the next one.
        while time.time() * 1000 < pending + 6_000:
            time.sleep(0.2)
        assert [o for o in ran() if o >= pending] == []
        with Scheduler(s) as scheduler:
            paused = scheduler.get_schedule("every5")
        assert paused is not None
        assert paused.paused

    outs = outcomes_of(read_topic(s, names(s).outcomes))
    cancelled = [o for o in outs if o["job_id"] == f"every5@{pending}"]
    assert cancelled
    assert cancelled[0]["state"] == "cancelled"
    assert cancelled[0]["schedule_id"] == "every5"
    assert all(o["state"] != "succeeded" for o in cancelled)
