from __future__ import annotations

import pytest

from dueflow import headers as hdr
from dueflow.errors import InvalidInput
from dueflow.kafka.topics import TopicNames
from dueflow.producers.cancel import cancel_records
from dueflow.records import codec


def test_cancel_writes_idempotency_state_and_outcome() -> None:
    idem, outcome = cancel_records(
        names=TopicNames("df"),
        job_id="j-1",
        queue="billing",
        idempotency_key="invoice:1",
        at_ms=123,
        task="charge",
        due_ms=456,
        content_hash="h",
    )
    assert (idem.topic, idem.key, idem.partition) == ("df.idempotency.billing", b"invoice:1", None)
    assert hdr.header(idem.headers, hdr.SCHEMA) == b"dueflow.IdempotencyRecord/1"  # every worker
    assert codec.decode("idempotency", idem.value or b"", writer_version=1) == {
        "idempotency_key": "invoice:1",
        "job_id": "j-1",
        "state": "cancelled",
        "at_ms": 123,
        "attempts": 0,
        "content_hash": "h",
        "run_only_due_ms": None,  # read as the current version: the default
    }
    assert codec.parse_schema_header(hdr.header(idem.headers, hdr.SCHEMA), expected="idempotency")
    assert (outcome.topic, outcome.key) == ("df.outcomes", b"j-1")
    version = codec.parse_schema_header(hdr.header(outcome.headers, hdr.SCHEMA), expected="outcome")
    got = codec.decode("outcome", outcome.value or b"", writer_version=version)
    assert (got["state"], got["task"], got["due_ms"], got["at_ms"]) == (
        "cancelled",
        "charge",
        456,
        123,
    )


@pytest.mark.parametrize(
    ("job_id", "key", "field"), [("", "k", "job_id"), ("j", "", "idempotency_key")]
)
def test_cancel_rejects_empty_ids(job_id: str, key: str, field: str) -> None:
    with pytest.raises(InvalidInput) as info:
        cancel_records(
            names=TopicNames("df"), job_id=job_id, queue="q", idempotency_key=key, at_ms=0
        )
    assert info.value.field == field


def test_with_the_partition_count_an_occurrence_goes_to_its_schedules_partition_too() -> None:
    from dueflow.rules.partitioning import partition_for_key

    plain = cancel_records(
        names=TopicNames("df"), job_id="j", queue="q", idempotency_key="k", at_ms=0, partitions=8
    )
    assert [r.partition for r in plain] == [partition_for_key(b"k", 8), None]
    key = "nightly@1900000000000"
    occurrence = cancel_records(
        names=TopicNames("df"),
        job_id=key,
        queue="q",
        idempotency_key=key,
        at_ms=0,
        schedule_id="nightly",
        partitions=8,
    )
    assert partition_for_key(key.encode(), 8) != partition_for_key(b"nightly", 8)
    assert [(r.topic, r.partition) for r in occurrence] == [
        ("df.idempotency.q", partition_for_key(key.encode(), 8)),
        ("df.idempotency.q", partition_for_key(b"nightly", 8)),
        ("df.outcomes", None),
    ]
    assert occurrence[0].value == occurrence[1].value
