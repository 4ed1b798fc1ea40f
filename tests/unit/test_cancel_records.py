from __future__ import annotations

import pytest

from dueflow import headers as hdr
from dueflow.errors import InvalidInput
from dueflow.producers.cancel import cancel_records
from dueflow.schemas import codec
from dueflow.topics import TopicNames


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
    assert codec.decode("idempotency", idem.value or b"") == {
        "idempotency_key": "invoice:1",
        "job_id": "j-1",
        "state": "cancelled",
        "at_ms": 123,
        "attempts": 0,
        "content_hash": "h",
    }
    assert codec.parse_schema_header(hdr.header(idem.headers, hdr.SCHEMA), expected="idempotency")
    assert (outcome.topic, outcome.key) == ("df.outcomes", b"j-1")
    got = codec.decode("outcome", outcome.value or b"")
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
