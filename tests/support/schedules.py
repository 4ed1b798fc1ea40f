"""Write cron schedules as any client may, and make test time zones with DST right now."""

from __future__ import annotations

import contextlib
import struct
import uuid
import zoneinfo
from collections.abc import Iterator, Sequence
from pathlib import Path

from confluent_kafka import Producer

from dueflow import headers as hdr
from dueflow.config import Settings
from dueflow.kafka.topics import names
from dueflow.records import codec
from dueflow.rules import cron_time
from dueflow.rules.cron import CronSchedule


def put_schedule(producer: Producer, settings: Settings, schedule: CronSchedule) -> None:
    producer.produce(
        names(settings).schedules,
        codec.encode("schedule", schedule.to_record()),
        schedule.schedule_id.encode(),
        headers=[(hdr.SCHEMA, codec.schema_header("schedule"))],
    )
    producer.flush(30)


def delete_schedule(producer: Producer, settings: Settings, schedule_id: str) -> None:
    producer.produce(names(settings).schedules, None, schedule_id.encode())
    producer.flush(30)


def tzif_v1(
    initial: tuple[int, bool, str], transitions: Sequence[tuple[int, int, bool, str]]
) -> bytes:
    """A TZif version 1 file (RFC 8536): ``initial`` = (utc offset s, dst, abbreviation),
    then at each epoch second ``at`` the zone switches to (offset, dst, abbreviation)."""
    types: list[tuple[int, bool, str]] = [initial]
    index: list[int] = []
    for _, off, dst, abbr in transitions:
        if (off, dst, abbr) not in types:
            types.append((off, dst, abbr))
        index.append(types.index((off, dst, abbr)))
    chars = b""
    desig: list[int] = []
    for _, _, abbr in types:
        desig.append(len(chars))
        chars += abbr.encode() + b"\0"
    header = b"TZif" + b"\0" + b"\0" * 15
    header += struct.pack(">6l", 0, 0, 0, len(transitions), len(types), len(chars))
    body = b"".join(struct.pack(">l", at) for at, *_ in transitions)
    body += bytes(index)
    body += b"".join(
        struct.pack(">lBB", off, int(dst), d) for (off, dst, _), d in zip(types, desig, strict=True)
    )
    return header + body + chars


@contextlib.contextmanager
def installed_zones(tmp: Path, zones: dict[str, bytes]) -> Iterator[dict[str, str]]:
    """Install TZif ``zones`` (short name -> file) under unique IANA-style names for the
    duration; yields short name -> zone name. Restores the zone search path after."""
    tag = uuid.uuid4().hex[:8]
    root = tmp / "zoneinfo"
    made: dict[str, str] = {}
    for short, data in zones.items():
        name = f"Dueflow/T{tag}{short}"
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        made[short] = name
    saved = zoneinfo.TZPATH
    zoneinfo.reset_tzpath(to=[str(root), *saved])
    cron_time._known_zones.cache_clear()  # the zone list is read once per process
    try:
        yield made
    finally:
        zoneinfo.reset_tzpath(to=list(saved))
        cron_time._known_zones.cache_clear()
