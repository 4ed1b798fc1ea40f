"""The status view's hand-written Outcome decoder gives what the codec (fastavro,
resolving older writers against the current schema) gives, for every released
version, and the codec's error for bytes it cannot read."""

from __future__ import annotations

import random
from typing import Any

import pytest

from dueflow.errors import UndecodableRecord
from dueflow.records import codec
from dueflow.records.outcome_decoder import decode_outcome
from dueflow.records.worker_codec import JOB_STATES, encode_outcome, encode_outcome_v3

_SYMBOLS = {1: 9, 2: 12, 3: len(JOB_STATES)}


def _text(rng: random.Random, size: int) -> str:
    return "".join(rng.choice("abcé漢z-0") for _ in range(size))


def _record(rng: random.Random, version: int) -> dict[str, Any]:
    def maybe(value: Any) -> Any:
        return value if rng.random() < 0.5 else None

    rec: dict[str, Any] = {
        "job_id": _text(rng, rng.randrange(1, 40)),
        "queue": _text(rng, rng.randrange(1, 10)),
        "task": _text(rng, rng.randrange(1, 10)),
        "idempotency_key": _text(rng, rng.randrange(0, 200)),
        "state": JOB_STATES[rng.randrange(_SYMBOLS[version])],
        "attempt": rng.randrange(0, 1 << 20),
        "at_ms": rng.randrange(-(1 << 45), 1 << 45),
        "due_ms": maybe(rng.randrange(0, 1 << 50)),
        "duration_ms": maybe(rng.random() * 1e6),
        "error_type": maybe(_text(rng, 5)),
        "error": maybe(_text(rng, rng.randrange(0, 300))),
        "worker": maybe(_text(rng, 8)),
        "trace_id": maybe(_text(rng, 32)),
        "schedule_id": maybe(_text(rng, 12)),
    }
    if version == 3:
        rec.update(
            result=maybe(rng.randbytes(rng.randrange(0, 200))),
            result_error=maybe(_text(rng, 20)),
            progress=maybe(rng.random()),
            progress_detail=maybe(rng.randbytes(10)),
            exec_partition=maybe(rng.randrange(0, 1 << 30)),
            version=maybe(_text(rng, 3)),
            command_id=maybe(_text(rng, 30)),
            first_job_id=maybe(_text(rng, 30)),
            group_id=maybe(_text(rng, 30)),
        )
    return rec


@pytest.mark.parametrize("version", [1, 2, 3])
def test_decode_outcome_gives_what_the_codec_gives(version: int) -> None:
    rng = random.Random(version)
    for _ in range(400):
        rec = _record(rng, version)
        data = codec.encode("outcome", rec, version=version)
        assert decode_outcome(data, version) == codec.decode(
            "outcome", data, writer_version=version
        )


def test_the_fast_encoders_bytes_decode_the_same() -> None:
    fields: dict[str, Any] = dict(
        job_id="j1",
        queue="default",
        task="t",
        idempotency_key="k",
        state="succeeded",
        attempt=2,
        at_ms=1_700_000_000_000,
        duration_ms=12.5,
        worker="w",
    )
    for version, data in ((1, encode_outcome(**fields)), (3, encode_outcome_v3(**fields))):
        got = decode_outcome(data, version)
        assert got == codec.decode("outcome", data, writer_version=version)
        assert got["state"] == "succeeded"
        assert got["result"] is None
    assert decode_outcome(encode_outcome_v3(**fields), None)["worker"] == "w"


def _scheduled(state: str = "scheduled") -> bytes:
    return encode_outcome(
        job_id="j", queue="q", task="t", idempotency_key="k", state=state, attempt=0, at_ms=1
    )


@pytest.mark.parametrize(
    ("data", "version"),
    [
        (b"\xff\xff", 1),
        (b"", 3),
        (_scheduled() + b"\x00", 1),  # trailing bytes
        (_scheduled("skipped"), 1),  # a symbol version 1 does not have
        (_scheduled(), 3),  # a version 1 value under a version 3 header: too short
    ],
)
def test_bytes_it_cannot_read_get_the_codecs_error(data: bytes, version: int) -> None:
    with pytest.raises(UndecodableRecord) as fast:
        decode_outcome(data, version)
    with pytest.raises(UndecodableRecord) as slow:
        codec.decode("outcome", data, writer_version=version)
    assert str(fast.value) == str(slow.value)
