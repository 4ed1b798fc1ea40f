"""Liveness and readiness of a long-running dueflow process (``/livez``, ``/readyz``).

**Live**: the process's main loop turned recently. Each loop (the emitter's
turn, the worker's and the status view's event loop) calls
:meth:`Health.beat` as it goes round; when no beat came for
``observability.liveness_timeout_s`` the loop is wedged and ``/livez`` says
so (an orchestrator restarts the process). Until the loop runs (start-up:
the topic checks, reading the schedules, the status view's table recovery)
the process counts as live: a start-up that hangs is the start-up probe's to
catch (``/readyz`` stays false).

**Ready**: started, connected to the broker, and holding its group
membership (for the emitter: standby or active). Each component registers a
check that returns ``None`` when it is fine or the reason it is not
(:meth:`Health.add_check`). Group membership and broker connection come from
librdkafka's own statistics (:class:`ClientStats`, fed by ``stats_cb``): the
group coordinator connected (``cgrp.state == "up"``) and the membership
settled (``cgrp.join_state == "steady"``).

Everything here is thread-safe: beats and checks run on the process's
loops, the HTTP listener asks from its own thread.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

import orjson
from prometheus_client import Gauge

# librdkafka sends statistics this often (statistics.interval.ms); a check
# whose statistics are older than STATS_STALE_S has not heard from its client.
STATS_INTERVAL_MS = 1_000
STATS_STALE_S = 5.0

Check = Callable[[], str | None]


@dataclass(frozen=True, slots=True)
class Verdict:
    """The answer of ``/livez`` or ``/readyz``: ``ok`` and why (each check's reason)."""

    ok: bool
    reasons: dict[str, str] = field(default_factory=dict)
    detail: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "reasons": dict(self.reasons), **self.detail}


def group_readiness(stats: Mapping[str, Any]) -> str | None:
    """Whether librdkafka's statistics show a member of its group (pure).

    ``None`` when the group coordinator is connected (``cgrp.state`` is
    ``up``) and the membership is settled (``cgrp.join_state`` is ``steady``:
    joined, with an assignment, possibly empty); otherwise why not. While the
    broker is down the state leaves ``up`` within a second (``query-coord``);
    after it is back the member rejoins and reaches ``steady`` again.
    """
    cgrp = stats.get("cgrp")
    if not isinstance(cgrp, Mapping):
        return "no consumer group in the client's statistics"
    state = cgrp.get("state")
    if state != "up":
        return f"group coordinator not connected (state {state})"
    join = cgrp.get("join_state")
    if join != "steady":
        return f"group membership not settled (join state {join})"
    return None


class ClientStats:
    """The last readiness a consumer's statistics showed (its ``stats_cb``).

    ``callback`` goes into the client's configuration together with
    ``statistics.interval.ms`` (:meth:`client_config`); librdkafka calls it
    from the thread that polls the client.
    """

    def __init__(
        self,
        *,
        judge: Callable[[Mapping[str, Any]], str | None] = group_readiness,
        clock: Callable[[], float] = time.monotonic,
        stale_s: float = STATS_STALE_S,
    ) -> None:
        self._judge = judge
        self._clock = clock
        self._stale_s = stale_s
        self._reason: str | None = "no statistics from the client yet"
        self._at: float | None = None

    def client_config(self) -> dict[str, Any]:
        """The settings that make a confluent-kafka client report here."""
        return {"statistics.interval.ms": STATS_INTERVAL_MS, "stats_cb": self.callback}

    def callback(self, text: str) -> None:
        try:
            doc = orjson.loads(text)
        except orjson.JSONDecodeError:
            return
        if isinstance(doc, Mapping):
            self._reason = self._judge(doc)
            self._at = self._clock()

    def reason(self) -> str | None:
        """``None`` when the last statistics (recent enough) showed a member."""
        at = self._at
        if at is None:
            return self._reason
        age = self._clock() - at
        if age > self._stale_s:
            return f"no statistics from the client for {age:.1f} s"
        return self._reason


class Health:
    """Heartbeat and readiness checks of one process."""

    def __init__(
        self,
        *,
        liveness_timeout_s: float = 30.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.liveness_timeout_s = liveness_timeout_s
        self._clock = clock
        self._lock = threading.Lock()
        self._beat_at: float | None = None  # None: the main loop has not started
        self._checks: dict[str, Check] = {}
        self._stopping = False

    def beat(self) -> None:
        """The main loop turned (call it every turn, or every fraction of a second)."""
        self._beat_at = self._clock()

    def add_check(self, name: str, check: Check) -> None:
        """A readiness condition: ``check()`` returns None when fine, else the reason."""
        with self._lock:
            self._checks[name] = check

    def remove_check(self, name: str) -> None:
        with self._lock:
            self._checks.pop(name, None)

    def stopping(self) -> None:
        """Shutting down: not ready any more (live until the process exits)."""
        self._stopping = True

    def live(self) -> Verdict:
        at = self._beat_at
        if at is None:
            return Verdict(True, detail={"loop": "starting"})
        age = self._clock() - at
        if age > self.liveness_timeout_s:
            return Verdict(
                False,
                {
                    "loop": f"the main loop has not turned for {age:.1f} s "
                    f"(liveness_timeout_s {self.liveness_timeout_s:g})"
                },
                {"loop_age_s": round(age, 3)},
            )
        return Verdict(True, detail={"loop_age_s": round(age, 3)})

    def ready(self) -> Verdict:
        reasons: dict[str, str] = {}
        if self._stopping:
            reasons["process"] = "shutting down"
        elif self._beat_at is None:
            reasons["process"] = "starting"
        with self._lock:
            checks = list(self._checks.items())
        for name, check in checks:
            try:
                why = check()
            except Exception as exc:  # a check must never break the endpoint
                why = f"check failed: {exc!r}"
            if why is not None:
                reasons[name] = why
        live = self.live()
        if not live.ok:
            reasons.update(live.reasons)
        return Verdict(not reasons, reasons, {"checks": sorted(n for n, _ in checks)})

    def publish(self, ready: Gauge, heartbeat: Gauge) -> None:
        """Set the ``dueflow_ready`` and heartbeat gauges (how a worker child tells its
        supervisor, and what a dashboard shows): call it every second or so."""
        ready.set(1 if self.ready().ok else 0)
        at = self._beat_at
        if at is not None:
            heartbeat.set(time.time() - (self._clock() - at))


# (name, labels, value) of one sample, as the merged multiprocess view gives it
Sample = tuple[str, Mapping[str, str], float]
READY_SAMPLE = "dueflow_ready"
HEARTBEAT_SAMPLE = "dueflow_loop_heartbeat_timestamp_seconds"


def judge_children(
    samples: Iterable[Sample],
    *,
    expected: int,
    now_wall: float,
    liveness_timeout_s: float,
    parent_pid: int | None = None,
) -> tuple[dict[str, str], dict[str, str]]:
    """Why the children of ``worker --processes N`` are not live, and not ready (pure).

    Each child publishes its readiness and its loop's last turn (wall time) as
    gauges with its pid; a child whose loop has not turned for
    ``liveness_timeout_s`` is not live, and the whole is ready when
    ``expected`` children say they are. The parent's own series
    (``parent_pid``) is not a child's.
    """
    beats: dict[str, float] = {}
    ready: dict[str, bool] = {}
    for name, labels, value in samples:
        pid = labels.get("pid", "?")
        if parent_pid is not None and pid == str(parent_pid):
            continue
        if name == HEARTBEAT_SAMPLE and value > 0:
            beats[pid] = value
        elif name == READY_SAMPLE:
            ready[pid] = value >= 1
    not_live = {
        f"pid {pid}": f"the main loop has not turned for {now_wall - at:.1f} s"
        for pid, at in sorted(beats.items())
        if now_wall - at > liveness_timeout_s
    }
    up = sum(1 for ok in ready.values() if ok)
    not_ready = {}
    if up < expected:
        not_ready["children"] = f"{up} of {expected} worker processes ready"
    return not_live, not_ready


class ChildrenHealth:
    """The supervisor's health: its own loop, and its children's published gauges."""

    def __init__(
        self,
        own: Health,
        *,
        expected: int,
        samples: Callable[[], Iterable[Sample]],
        wall: Callable[[], float] = time.time,
    ) -> None:
        self.own = own
        self._expected = expected
        self._samples = samples
        self._wall = wall
        self._pid = os.getpid()
        self._published_at = 0.0

    def _judge(self) -> tuple[dict[str, str], dict[str, str]]:
        return judge_children(
            self._samples(),
            expected=self._expected,
            now_wall=self._wall(),
            liveness_timeout_s=self.own.liveness_timeout_s,
            parent_pid=self._pid,
        )

    def publish(self, ready: Gauge, heartbeat: Gauge, *, every_s: float = 1.0) -> None:
        """The parent's own gauges: its loop's heartbeat, and ready when the whole is
        (at most every ``every_s``: judging reads every child's metrics file)."""
        now = time.monotonic()
        if now - self._published_at < every_s:
            return
        self._published_at = now
        ready.set(1 if self.ready().ok else 0)
        heartbeat.set(time.time())

    def live(self) -> Verdict:
        own = self.own.live()
        not_live, _ = self._judge()
        reasons = {**own.reasons, **not_live}
        return Verdict(not reasons, reasons, own.detail)

    def ready(self) -> Verdict:
        own = self.own.ready()
        not_live, not_ready = self._judge()
        reasons = {**own.reasons, **not_live, **not_ready}
        return Verdict(not reasons, reasons)
