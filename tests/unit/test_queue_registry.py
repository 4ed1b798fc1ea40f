"""The queue registry's records and the merge of static and registered queues (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from dueflow import headers as hdr
from dueflow.config import QueueSpec
from dueflow.errors import UndecodableRecord, UnknownQueue
from dueflow.records import codec
from dueflow.records.queue_registry import (
    QueueCatalog,
    QueueConflict,
    decode_queue,
    encode_queue,
    merge_queues,
)

NOW = 1_800_000_000_000
SCHEMA = [(hdr.SCHEMA, b"dueflow.Queue/1")]


@pytest.mark.parametrize(
    "spec",
    [
        QueueSpec("default"),
        QueueSpec("billing", 12, (500, 5_000, 3_600_000), 86_400_000, 50.0),
        QueueSpec("slow_reports-2", 1, (60_000,), rate_limit_per_s=0.5),
        QueueSpec("q", 3, rate_limit_per_s=7),  # an int rate comes back as the same number
    ],
)
def test_every_spec_field_survives_the_record(spec: QueueSpec) -> None:
    key, value, headers = encode_queue(spec, created_ms=NOW, created_by="ada@ops")
    assert key == spec.name.encode()
    assert headers == SCHEMA
    name, queue = decode_queue(key, value, headers, offset=4)
    assert name == spec.name
    assert queue is not None
    assert queue.spec == spec
    assert (queue.created_ms, queue.created_by, queue.offset) == (NOW, "ada@ops", 4)


def test_a_tombstone_deletes() -> None:
    assert decode_queue(b"billing", None, None) == ("billing", None)


def _value(**changes: Any) -> bytes:
    record = {
        "name": "billing",
        "partitions": 3,
        "retry_tiers_ms": [1000],
        "idempotency_retention_ms": 1000,
        "rate_limit_per_s": None,
        "created_ms": NOW,
        "created_by": "",
    }
    record.update(changes)
    return codec.encode("queue", record)


@pytest.mark.parametrize(
    ("key", "value", "headers", "fragment"),
    [
        (None, _value(), SCHEMA, "without a key"),
        (b"", _value(), SCHEMA, "without a key"),
        (b"\xff\xfe", _value(), SCHEMA, "not UTF-8"),
        (b"billing", b"\x00\x01garbage", SCHEMA, "not a valid dueflow.Queue"),
        (b"billing", _value()[:-3], SCHEMA, "not a valid dueflow.Queue"),
        (b"billing", _value(), [(hdr.SCHEMA, b"dueflow.Job/1")], "expected dueflow.Queue"),
        (b"other", _value(), SCHEMA, "names 'billing', its key 'other'"),
        (b"billing", _value(partitions=0), SCHEMA, "partitions"),
        (b"billing", _value(retry_tiers_ms=[]), SCHEMA, "retry_tiers_ms"),
        (b"billing", _value(retry_tiers_ms=[10, 5]), SCHEMA, "increasing"),
        (b"billing", _value(rate_limit_per_s=-1.0), SCHEMA, "rate_limit_per_s"),
        (b"bad/name", _value(name="bad/name"), SCHEMA, "A-Za-z0-9_-"),
    ],
)
def test_a_record_that_is_no_queue_says_why(
    key: bytes | None, value: bytes, headers: list[tuple[str, bytes]], fragment: str
) -> None:
    with pytest.raises(UndecodableRecord) as info:
        decode_queue(key, value, headers)
    assert fragment in str(info.value)


def test_a_record_without_a_schema_header_is_read_as_the_current_version() -> None:
    _, queue = decode_queue(b"billing", _value(), None)
    assert queue is not None
    assert queue.spec.partitions == 3


# ------------------------------------------------------------------ merge rule

STATIC_DEFAULT = QueueSpec("default")
BILLING_6 = QueueSpec("billing", 6)
BILLING_12 = QueueSpec("billing", 12, (500, 5_000))


@pytest.mark.parametrize(
    ("static", "registered", "specs", "sources", "conflicts"),
    [
        # nothing registered: the static queues, as configured
        ([STATIC_DEFAULT], {}, [STATIC_DEFAULT], {"default": "static"}, []),
        # registered only: added after the static ones
        (
            [STATIC_DEFAULT],
            {"billing": BILLING_12},
            [STATIC_DEFAULT, BILLING_12],
            {"default": "static", "billing": "registry"},
            [],
        ),
        # in both, the same: no conflict
        ([BILLING_12], {"billing": BILLING_12}, [BILLING_12], {"billing": "both"}, []),
        # in both, different: the registry wins, each differing field is a conflict
        (
            [BILLING_6, STATIC_DEFAULT],
            {"billing": BILLING_12},
            [BILLING_12, STATIC_DEFAULT],
            {"billing": "both", "default": "static"},
            [
                QueueConflict("billing", "partitions", 6, 12),
                QueueConflict("billing", "retry_tiers_ms", (1_000, 10_000, 60_000), (500, 5_000)),
            ],
        ),
        # registry-only queues come by name
        (
            [],
            {"zeta": QueueSpec("zeta"), "alpha": QueueSpec("alpha")},
            [QueueSpec("alpha"), QueueSpec("zeta")],
            {"alpha": "registry", "zeta": "registry"},
            [],
        ),
    ],
)
def test_merge_rule_the_registry_wins_and_differences_are_conflicts(
    static: list[QueueSpec],
    registered: dict[str, QueueSpec],
    specs: list[QueueSpec],
    sources: dict[str, str],
    conflicts: list[QueueConflict],
) -> None:
    view = merge_queues(static, registered)
    assert list(view.specs.values()) == specs
    assert dict(view.sources) == sources
    assert list(view.conflicts) == conflicts


def test_a_conflict_says_which_value_is_used_and_what_to_fix() -> None:
    text = str(QueueConflict("billing", "partitions", 6, 12))
    assert "partitions is 12 in the queue registry but 6 in the static config" in text
    assert "the registry's is used" in text


# ------------------------------------------------------------------ catalog


def _rec(spec: QueueSpec) -> tuple[bytes, bytes, list[tuple[str, bytes]]]:
    return encode_queue(spec, created_ms=NOW, created_by="t")


def test_catalog_folds_the_log_changes_only_on_news() -> None:
    catalog = QueueCatalog([STATIC_DEFAULT])
    assert catalog.view.names == {"default"}
    assert catalog.apply(*_rec(BILLING_6)) == "billing"
    assert catalog.apply(*_rec(BILLING_6)) is None  # the same spec again: no news
    assert catalog.view.get("billing") == BILLING_6
    assert catalog.apply(*_rec(BILLING_12)) == "billing"  # a newer record wins
    assert catalog.view.get("billing") == BILLING_12
    assert catalog.apply(b"nobody", None, None) is None  # a tombstone of nothing
    assert catalog.apply(b"billing", None, None) == "billing"
    assert catalog.view.names == {"default"}


def test_catalog_keeps_its_state_on_a_bad_record() -> None:
    catalog = QueueCatalog([])
    catalog.apply(*_rec(BILLING_6))
    with pytest.raises(UndecodableRecord):
        catalog.apply(b"billing", b"junk", SCHEMA)
    assert catalog.view.get("billing") == BILLING_6


def test_a_tombstone_of_a_static_queue_leaves_the_static_spec() -> None:
    catalog = QueueCatalog([BILLING_6])
    catalog.apply(*_rec(BILLING_12))
    assert catalog.view.get("billing") == BILLING_12
    catalog.apply(b"billing", None, None)
    assert catalog.view.get("billing") == BILLING_6
    assert catalog.view.sources["billing"] == "static"


def test_unknown_queue_names_the_queue_and_how_to_create_it() -> None:
    err = UnknownQueue("billing", {"default"})
    text = str(err)
    assert "got 'billing'" in text
    assert "one of the queues ['default']" in text
    assert "dueflow queue create billing --partitions N" in text
    assert err.field == "queue"
    assert err.queue == "billing"
