"""The status view's topics: the outcomes topic it reads (checked) and the faust
app's own (its table's changelog and its leader topic), created before faust starts.

faust would create its changelog topics itself, but on a first start its consumer
joins the group before it sees them, and the tables then fail with a partition-count
mismatch until the next rebalance.
"""

from __future__ import annotations

from dueflow.config import Settings
from dueflow.errors import TopicMismatch
from dueflow.kafka.clients import cluster_id_of, make_admin
from dueflow.kafka.topic_admin import TopicAdmin
from dueflow.kafka.topics import TopicSpec, topic_layout


def internal_topics(settings: Settings, *, app_id: str, changelog_topic: str) -> list[TopicSpec]:
    """The faust app's own topics: table changelogs (compacted) and its leader topic."""
    s = settings
    isr = {"min.insync.replicas": str(s.min_insync_replicas)}
    compact = {"cleanup.policy": "compact", **isr}
    return [
        TopicSpec(changelog_topic, "status", s.outcomes_partitions, compact),
        TopicSpec(
            f"{app_id}-__assignor-__leader",
            "status",
            1,
            {"cleanup.policy": "delete", **isr},
        ),
    ]


def prepare_topics(settings: Settings, internal: list[TopicSpec]) -> str | None:
    """Check the outcomes topic and create the ``internal`` topics; return the
    cluster's id."""
    s = settings
    raw_admin = make_admin(s)
    admin = TopicAdmin(raw_admin, replication_factor=s.replication_factor)
    cluster_id = cluster_id_of(raw_admin)
    (outcomes,) = [t for t in topic_layout(s) if t.role == "outcomes"]
    (found,) = admin.describe([outcomes])
    if found.partitions is None:
        raise TopicMismatch(
            f"topic {outcomes.name} does not exist: run `dueflow topics ensure` first"
        )
    if found.partitions != outcomes.partitions:
        raise TopicMismatch(
            f"topic {outcomes.name} has {found.partitions} partitions but the settings say "
            f"outcomes_partitions = {outcomes.partitions}: the status view's tables must "
            "match the topic; fix the setting"
        )
    report = admin.ensure(internal)
    if not report.ok:
        raise TopicMismatch("; ".join(str(d) for d in report.differences))
    # Wait until the new topics show in metadata with leaders: faust's consumer
    # must see them when it joins, or its tables fail until the next rebalance.
    for state_ in admin.describe(internal, must_exist=True):
        if state_.partitions is None:
            raise TopicMismatch(f"topic {state_.name} did not appear in the cluster metadata")
    return cluster_id
