"""The Java, Go and Node clients carry copies of the Avro schemas they write
(a jar, a Go module and an npm package cannot reach schemas/ at run time):
each copy is the released file byte for byte, so a schema change that is not
copied fails here. Copy with ``make client-schemas``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SOURCE = ROOT / "schemas" / "dueflow" / "schemas"
COPIES = {
    "java": ROOT / "clients/java/src/main/resources/dev/dueflow/client/schemas",
    "go": ROOT / "clients/go/schemas",
    "node": ROOT / "clients/node/schemas",
}
# What the clients write: Job/1, IdempotencyRecord/1 and /3, Outcome/1 and /2,
# Command/1 (copy name -> released file). Their outcome.avsc is the released
# version 2: the version they name in their df-schema headers, whatever the
# current one is. They read Outcome/3 (a command's verdict): v3/outcome.avsc.
FILES = {
    "job.avsc": "job.avsc",
    "command.avsc": "command.avsc",
    "v3/outcome.avsc": "outcome.avsc",
    "idempotency_record.avsc": "idempotency_record.avsc",
    "outcome.avsc": "v2/outcome.avsc",
    "v1/idempotency_record.avsc": "v1/idempotency_record.avsc",
    "v1/outcome.avsc": "v1/outcome.avsc",
}


@pytest.mark.parametrize("client", sorted(COPIES))
def test_each_client_carries_the_released_schemas(client: str) -> None:
    for name, source in FILES.items():
        copy = COPIES[client] / name
        assert copy.exists(), f"{copy} missing: run `make client-schemas`"
        assert copy.read_bytes() == (SOURCE / source).read_bytes(), (
            f"{copy} differs from {SOURCE / source}: run `make client-schemas`"
        )


def test_the_versions_the_clients_write_are_released() -> None:
    from dueflow.records import codec

    # job.avsc is Job/1, idempotency_record.avsc IdempotencyRecord/3, outcome.avsc
    # Outcome/2: the versions the clients name in their df-schema headers
    assert codec.SCHEMAS["job"][2] == 1
    assert codec.SCHEMAS["idempotency"][2] == 3
    assert codec.schema_json("outcome", 2)["name"] == "Outcome"  # released in v2/
    assert codec.SCHEMAS["outcome"][2] >= 2
    # command.avsc is Command/1; v3/outcome.avsc the verdicts' Outcome/3 (when the
    # current outcome schema moves on, copy schemas/v3/outcome.avsc instead)
    assert codec.SCHEMAS["command"][2] == 1
    assert codec.SCHEMAS["outcome"][2] == 3
