"""Create and check dueflow's topics on a cluster (I/O edge of topics.py).

``ensure`` creates what is missing and compares what exists. It never deletes
or alters an existing topic, with one exception: the timer and lease topics
get partitions added when ``wheel.shards`` grew (whole wheels appended; see
:attr:`TopicSpec.grows_by`). Any other wrong partition count, or a critical
config that differs, is reported, and the caller exits non-zero.

The DLQ and quarantine topics are created last, with a ``max.message.bytes``
:data:`~dueflow.kafka.topics.SET_ASIDE_HEADROOM` larger than the largest of
the other topics ensured (what the broker gave them): a record set aside
wraps a record of another topic. An existing one with less is reported as a
note (:func:`with_headroom`).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import (
    AdminClient,
    ConfigResource,
    NewPartitions,
    NewTopic,
    ResourceType,
)

from dueflow.kafka.clients import kafka_error
from dueflow.kafka.topics import SET_ASIDE_HEADROOM, SET_ASIDE_ROLES, TopicSpec
from dueflow.records.size_budget import DEFAULT_MAX_MESSAGE_BYTES

MAX_MESSAGE_BYTES = "max.message.bytes"


@dataclass(frozen=True, slots=True)
class Difference:
    topic: str
    what: str
    expected: str
    actual: str
    critical: bool

    def __str__(self) -> str:
        level = "MISMATCH" if self.critical else "note"
        return (
            f"{level}: {self.topic}: {self.what} is {self.actual!r}, "
            f"dueflow needs {self.expected!r}"
        )


@dataclass(slots=True)
class EnsureReport:
    created: list[str] = field(default_factory=list)
    grown: list[str] = field(default_factory=list)  # partitions added (more shards)
    unchanged: list[str] = field(default_factory=list)
    differences: list[Difference] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not any(d.critical for d in self.differences)


@dataclass(frozen=True, slots=True)
class TopicState:
    """What the cluster has for one topic (``None`` fields: it does not exist)."""

    name: str
    partitions: int | None
    config: dict[str, str]


class TopicAdmin:
    """Thin collaborator around an :class:`AdminClient`."""

    def __init__(self, admin: AdminClient, *, replication_factor: int, timeout_s: float = 30.0):
        self._admin = admin
        self._rf = replication_factor
        self._timeout = timeout_s

    def describe(self, specs: Sequence[TopicSpec], *, must_exist: bool = False) -> list[TopicState]:
        """Current partition count and the configs dueflow cares about, per topic.

        With ``must_exist`` it waits (up to the timeout) for topics that the
        controller knows but this broker's metadata does not show yet.
        """
        wanted = {s.name for s in specs}
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                md = self._admin.list_topics(timeout=self._timeout)
            except KafkaException as exc:
                raise kafka_error("list topics", exc) from exc
            # A topic created a moment ago may still report "leader not available".
            settling = [
                t
                for t in wanted
                if (t in md.topics and md.topics[t].error is not None)
                or (must_exist and t not in md.topics)
            ]
            if not settling or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        present = {s.name: len(md.topics[s.name].partitions) for s in specs if s.name in md.topics}
        configs = self._configs([s for s in specs if s.name in present])
        return [TopicState(s.name, present.get(s.name), configs.get(s.name, {})) for s in specs]

    def ensure(self, specs: Sequence[TopicSpec]) -> EnsureReport:
        """Create missing topics; report differences of existing ones."""
        report = EnsureReport()
        states = {st.name: st for st in self.describe(specs)}
        missing = [s for s in specs if states[s.name].partitions is None]
        others = [s for s in missing if s.role not in SET_ASIDE_ROLES]
        raced = self._create(others, report)
        if any(s.role in SET_ASIDE_ROLES for s in specs):
            # The topics that set records aside get headroom over all the others.
            specs = with_headroom(specs, self._largest_limit(specs, states))
            missing = [s for s in specs if states[s.name].partitions is None]
            raced += self._create([s for s in missing if s.role in SET_ASIDE_ROLES], report)
        if raced:  # created by someone else meanwhile: compare what they made
            states.update({st.name: st for st in self.describe(raced, must_exist=True)})
        created = [s for s in missing if s.name in report.created]
        if created:  # return only once the broker serves them (metadata lags the controller)
            self.describe(created, must_exist=True)
        self._grow(specs, states, report)
        for spec in specs:
            state = states[spec.name]
            if spec.name in report.created:
                continue
            if state.partitions is None:
                report.differences.append(
                    Difference(spec.name, "existence", "a topic", "not visible", True)
                )
                continue
            diffs = compare(spec, state)
            report.differences.extend(diffs)
            if not diffs and spec.name not in report.grown:
                report.unchanged.append(spec.name)
        return report

    def _largest_limit(self, specs: Sequence[TopicSpec], states: dict[str, TopicState]) -> int:
        """The largest ``max.message.bytes`` of the topics of ``specs`` that set nothing
        aside (read again for those just created: the broker's default)."""
        others = [s for s in specs if s.role not in SET_ASIDE_ROLES]
        fresh = [s for s in others if MAX_MESSAGE_BYTES not in states[s.name].config]
        configs = self._configs(fresh) if fresh else {}
        found = []
        for s in others:
            raw = states[s.name].config.get(MAX_MESSAGE_BYTES) or configs.get(s.name, {}).get(
                MAX_MESSAGE_BYTES
            )
            if raw and raw.isdigit():
                found.append(int(raw))
        return max(found, default=DEFAULT_MAX_MESSAGE_BYTES)

    def _grow(
        self, specs: Sequence[TopicSpec], states: dict[str, TopicState], report: EnsureReport
    ) -> None:
        """Add partitions to topics that may grow (the timer and lease topics, for
        more shards) and have fewer than ``specs`` need; ``states`` is updated."""
        todo = {}
        for spec in specs:
            have = states[spec.name].partitions
            if have is not None and spec.growth_from(have) is not None:
                todo[spec.name] = NewPartitions(spec.name, spec.partitions)
        if not todo:
            return
        futures = self._admin.create_partitions(
            list(todo.values()), operation_timeout=self._timeout
        )
        for name, fut in futures.items():
            try:
                fut.result()
            except KafkaException as exc:
                raise kafka_error(f"add partitions to {name}", exc) from exc
            report.grown.append(name)
        grown = [s for s in specs if s.name in todo]
        deadline = time.monotonic() + self._timeout
        while True:  # metadata lags the controller: wait until the broker serves them
            fresh = {st.name: st for st in self.describe(grown)}
            if all(fresh[s.name].partitions == s.partitions for s in grown):
                break
            if time.monotonic() > deadline:
                break  # reported as a difference below
            time.sleep(0.2)
        states.update(fresh)

    def _create(self, specs: Sequence[TopicSpec], report: EnsureReport) -> list[TopicSpec]:
        """Create ``specs``; return those that turned out to exist already."""
        raced: list[TopicSpec] = []
        if not specs:
            return raced
        by_name = {s.name: s for s in specs}
        new = [NewTopic(s.name, s.partitions, self._rf, config=dict(s.config)) for s in specs]
        futures = self._admin.create_topics(new, operation_timeout=self._timeout)
        for name, fut in futures.items():
            try:
                fut.result()
                report.created.append(name)
            except KafkaException as exc:
                if exc.args and exc.args[0].code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    raced.append(by_name[name])
                    continue
                raise kafka_error(f"create topic {name}", exc) from exc
        return raced

    def _configs(self, specs: Sequence[TopicSpec]) -> dict[str, dict[str, str]]:
        """Configs per topic. On a cluster, a broker whose metadata has not caught up
        with a topic created a moment ago says it does not know it: asked again (up to
        the timeout)."""
        out: dict[str, dict[str, str]] = {}
        left = [s.name for s in specs]
        deadline = time.monotonic() + self._timeout
        while left:
            resources = [ConfigResource(ResourceType.TOPIC, name) for name in left]
            futures = self._admin.describe_configs(resources, request_timeout=self._timeout)
            unknown = []
            for res, fut in futures.items():
                try:
                    entries = fut.result()
                except KafkaException as exc:
                    lagging = exc.args and exc.args[0].code() == KafkaError.UNKNOWN_TOPIC_OR_PART
                    if lagging and time.monotonic() < deadline:
                        unknown.append(res.name)
                        continue
                    raise kafka_error(f"describe configs of {res.name}", exc) from exc
                out[res.name] = {k: str(v.value) for k, v in entries.items()}
            left = unknown
            if left:
                time.sleep(0.2)
        return out


def compare(spec: TopicSpec, state: TopicState) -> list[Difference]:
    """Differences between what dueflow needs and what the topic has (pure)."""
    diffs: list[Difference] = []
    if state.partitions != spec.partitions:
        diffs.append(
            Difference(spec.name, "partitions", str(spec.partitions), str(state.partitions), True)
        )
    for key, want in spec.config.items():
        have = state.config.get(key)
        if have is None or _same(key, want, have):
            continue
        diffs.append(Difference(spec.name, key, want, have, key in spec.critical))
    return diffs


def with_headroom(specs: Sequence[TopicSpec], largest: int) -> list[TopicSpec]:
    """``specs`` with the DLQ and quarantine topics' ``max.message.bytes`` at
    ``largest`` (the largest of the other topics) + :data:`SET_ASIDE_HEADROOM` (pure)."""
    want = str(largest + SET_ASIDE_HEADROOM)
    return [
        replace(s, config={**s.config, MAX_MESSAGE_BYTES: want}) if s.role in SET_ASIDE_ROLES else s
        for s in specs
    ]


def _same(key: str, want: str, have: str) -> bool:
    if key == MAX_MESSAGE_BYTES and want.isdigit() and have.isdigit():
        return int(have) >= int(want)  # more room is as good
    if key == "cleanup.policy":
        return set(want.split(",")) == {p.strip() for p in have.split(",")}
    return want == have
