"""What Kafka shows of the demo: fires, outcomes and dead letters.

:class:`Tally` folds records (pure, testable); :class:`Observer` feeds it
from one ``read_committed`` consumer on a thread, reading the exec, outcomes
and DLQ topics of the run from their beginning, as any worker would see them.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from confluent_kafka import OFFSET_BEGINNING, Consumer, Message, TopicPartition

from dueflow import headers as hdr
from dueflow.config import Settings
from dueflow.errors import DueflowError
from dueflow.kafka.topics import names
from dueflow.records import codec

T = TypeVar("T")


@dataclass
class Tally:
    """Counts by job key: fired (exec records), outcomes, dead letters."""

    fired: dict[str, int] = field(default_factory=dict)
    fire_lateness_ms: list[int] = field(default_factory=list)  # fired - due, first fire
    succeeded: set[str] = field(default_factory=set)
    retrying: set[str] = field(default_factory=set)
    retries: int = 0
    dead: set[str] = field(default_factory=set)

    def on_exec(self, key: str, *, due_ms: int | None, fired_ms: int | None) -> None:
        n = self.fired.get(key, 0)
        self.fired[key] = n + 1
        if n == 0 and due_ms is not None and fired_ms is not None:
            self.fire_lateness_ms.append(fired_ms - due_ms)

    def on_outcome(self, key: str, state: str) -> None:
        if state == "succeeded":
            self.succeeded.add(key)
        elif state == "retrying":
            self.retrying.add(key)
            self.retries += 1

    def on_dead_letter(self, key: str) -> None:
        self.dead.add(key)


class Observer:
    """A consumer thread that keeps a :class:`Tally` of one run's topics."""

    def __init__(self, settings: Settings, queues: Sequence[str]) -> None:
        self.settings = settings
        self.queues = list(queues)
        self.tally = Tally()
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._thread = threading.Thread(target=self._main, name="demo-observer", daemon=True)

    def start(self) -> Observer:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def read(self, fn: Callable[[Tally], T]) -> T:
        """``fn(tally)`` while no batch is being applied (the sets do not change under it)."""
        with self._lock:
            return fn(self.tally)

    def _topics(self) -> dict[str, str]:
        n = names(self.settings)
        kinds = {n.outcomes: "outcome"}
        for q in self.queues:
            kinds[n.exec(q)] = "exec"
            kinds[n.dlq(q)] = "dlq"
        return kinds

    def _main(self) -> None:
        kinds = self._topics()
        consumer = Consumer(
            self.settings.client_config(
                **{
                    "group.id": f"demo-observer-{uuid.uuid4().hex}",
                    "isolation.level": "read_committed",
                    "enable.auto.commit": False,
                    "auto.offset.reset": "earliest",
                }
            )
        )
        try:
            meta = consumer.list_topics(timeout=30).topics
            consumer.assign(
                [
                    TopicPartition(t, p, OFFSET_BEGINNING)
                    for t in kinds
                    for p in sorted(meta[t].partitions)
                ]
            )
            while not self._stop.is_set():
                batch = consumer.consume(5_000, 0.1)
                with self._lock:
                    self._apply(batch, kinds)
        except BaseException as exc:  # surfaced by the demo's summary
            self.error = exc
        finally:
            consumer.close()

    def _apply(self, batch: list[Message], kinds: dict[str, str]) -> None:
        tally = self.tally
        for m in batch:
            if m.error() is not None or m.key() is None:
                continue
            kind = kinds.get(str(m.topic()))
            key = (m.key() or b"").decode("utf-8", "replace")
            if kind == "exec":
                h = m.headers() or []
                if hdr.is_command(h):
                    continue  # a command to the partition's owner, not a fired job
                tally.on_exec(
                    key,
                    due_ms=hdr.header_int(h, hdr.DUE),  # type: ignore[arg-type]
                    fired_ms=hdr.header_int(h, hdr.FIRED),  # type: ignore[arg-type]
                )
            elif kind == "dlq":
                tally.on_dead_letter(key)
            elif kind == "outcome" and m.value():
                try:
                    version = codec.parse_schema_header(
                        hdr.header(m.headers() or [], hdr.SCHEMA),  # type: ignore[arg-type]
                        expected="outcome",
                    )
                    out = codec.decode("outcome", m.value() or b"", writer_version=version)
                except DueflowError:  # not the demo's to judge: skip it
                    continue
                tally.on_outcome(str(out["idempotency_key"]), str(out["state"]))
