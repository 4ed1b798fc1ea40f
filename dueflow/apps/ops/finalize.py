"""``dueflow queue finalize``: switch a queue's clients to commands, once every worker can
apply them (the I/O edge; the version rule is pure).

Commands (:mod:`dueflow.records.command`) go to a queue's exec topic; a worker
of the release before dead-letters them (under a key no job has: the job is
untouched, but the cancel or move is lost). So clients keep writing the old
records until the operator finalizes the queue: :func:`finalize_queue`
describes the queue's worker group (``<prefix>.worker.<queue>``) and refuses
while a member's client id is not that of a worker that applies commands
(:func:`steering_capable`: ``dueflow-worker/<version>/<host>``, which workers
set from this release on), naming them; then it writes the queue's features
record to the control topic. Like Kafka's ``metadata.version`` it is one-way:
do not start older workers for a finalized queue afterwards. Only members
alive now are seen: a stopped old worker started again later is not caught
(its commands dead-letter; jobs stay safe).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

from dueflow.config import Settings
from dueflow.errors import DueflowError
from dueflow.kafka.clients import kafka_error, make_admin
from dueflow.kafka.features import read_queue_features, write_queue_features
from dueflow.kafka.reading import ops_consumer
from dueflow.kafka.topics import names
from dueflow.records.features import STEERING, QueueFeatures, steering_capable


class FinalizeRefused(DueflowError):
    """A queue cannot be finalized now: ``members`` are workers that do not apply
    commands (``client id @ host``)."""

    def __init__(self, queue: str, members: list[str]) -> None:
        super().__init__(
            f"queue {queue!r} not finalized: {len(members)} member(s) of its worker group do "
            f"not apply commands (client id, host): {', '.join(members)}; upgrade them "
            "(a rolling restart of the new release), then finalize again"
        )
        self.queue = queue
        self.members = members


@dataclass(slots=True)
class Finalized:
    """What ``queue finalize`` did for one queue."""

    queue: str
    written: bool  # False: it was finalized already
    workers: list[str] = field(default_factory=list)  # the members checked

    def to_json(self) -> dict[str, object]:
        return {"queue": self.queue, "written": self.written, "workers": self.workers}


def group_members(admin: AdminClient, group: str, timeout_s: float) -> list[tuple[str, str]]:
    """``(client id, host)`` of the live members of ``group`` (none when it does not
    exist)."""
    futures = admin.describe_consumer_groups([group], request_timeout=timeout_s)
    try:
        desc = futures[group].result()
    except KafkaException as exc:
        err = exc.args[0] if exc.args else None
        if isinstance(err, KafkaError) and err.code() == KafkaError.GROUP_ID_NOT_FOUND:
            return []
        raise kafka_error(f"describing worker group {group}", exc) from exc
    return [(str(m.client_id), str(m.host)) for m in desc.members]


def finalize_queue(
    settings: Settings,
    queue: str,
    *,
    by: str,
    now_ms: int,
    admin: AdminClient | None = None,
    timeout_s: float = 30.0,
) -> Finalized:
    """Check the workers of ``queue`` and write its features record (see the module doc).

    Raises :class:`FinalizeRefused` naming the members that do not apply commands.
    """
    consumer = ops_consumer(settings)
    try:
        known, _problems = read_queue_features(settings, consumer, timeout_s)
    finally:
        consumer.close()
    group = names(settings).worker_group(queue)
    members = group_members(admin or make_admin(settings), group, timeout_s)
    old = [f"{cid} @ {host}" for cid, host in members if not steering_capable(cid)]
    if old:
        raise FinalizeRefused(queue, old)
    seen = [f"{cid} @ {host}" for cid, host in members]
    before = known.get(queue)
    if before is not None and before.steerable:
        return Finalized(queue, written=False, workers=seen)
    write_queue_features(
        settings, QueueFeatures(queue, steering=STEERING, by=by, at_ms=now_ms), timeout_s
    )
    return Finalized(queue, written=True, workers=seen)
