"""Hypothesis strategies of what the Avro schemas hold, for the tests that check the
hand-written codecs against fastavro (test_fast_codec, test_job_binary)."""

from __future__ import annotations

from typing import Any

from hypothesis import strategies as st

from dueflow.model import Backoff, BackoffKind, Job

TEXTS = st.text(max_size=40)
LONGS = st.integers(min_value=-(2**63), max_value=2**63 - 1)
INTS = st.integers(min_value=-(2**31), max_value=2**31 - 1)
DOUBLES = st.floats(allow_nan=False)
STRING_MAPS = st.dictionaries(TEXTS, TEXTS, max_size=4)

BACKOFFS = st.builds(
    Backoff,
    kind=st.sampled_from(list(BackoffKind)),
    base_ms=LONGS,
    max_ms=LONGS,
    multiplier=DOUBLES,
    jitter=st.booleans(),
)


def avro_jobs(*, max_payload: int, plain: bool = False) -> st.SearchStrategy[Job]:
    """Jobs with any value the ``job`` schema holds, payloads up to ``max_payload``
    bytes. ``plain``: only what a plain request sets (task, payload, due time,
    ids, attempts) and a content hash; the other fields at their defaults."""
    drawn: dict[str, Any] = {
        "job_id": TEXTS,
        "queue": TEXTS,
        "task": TEXTS,
        "payload": st.binary(max_size=max_payload),
        "due_ms": LONGS,
        "idempotency_key": TEXTS,
        "created_ms": LONGS,
        "max_attempts": INTS,
    }
    if plain:
        return st.builds(Job, **drawn, content_hash=TEXTS)
    return st.builds(
        Job,
        **drawn,
        content_type=TEXTS,
        backoff=st.none() | BACKOFFS,
        timeout_ms=st.none() | LONGS,
        jitter_ms=LONGS,
        trace=STRING_MAPS,
        schedule_id=st.none() | TEXTS,
        schedule_version=st.none() | LONGS,
        content_hash=st.none() | TEXTS,
        labels=STRING_MAPS,
    )
