"""The demo's verdict, computed from what its handlers recorded (pure).

- scheduled: one-shot jobs the broker acknowledged;
- executed: of those, jobs whose effect the ledger holds;
- retried: of those, jobs that needed more than one attempt;
- dead: of those, jobs in a DLQ topic;
- duplicates: effects applied more than once (any job, cron runs too);
- lost: scheduled jobs neither executed nor dead;
- cron: occurrences due within the schedules' windows, and how many ran;
- lateness: first attempt's start minus due (from the ledger), also
  without the jobs due within a second of the takeover (kill to firing
  again), and the emitter's fire time minus due (from the exec records).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from demo.ledger import LedgerView


def percentiles(values: Iterable[float]) -> dict[str, float]:
    """p50, p95, p99 and max (nearest rank); NaN-free: empty gives zeros."""
    v = sorted(values)
    if not v:
        return {"p50": 0.0, "p95": 0.0, "p99": 0.0, "max": 0.0}

    def pick(q: float) -> float:
        return float(v[min(len(v) - 1, int(q * len(v)))])

    return {"p50": pick(0.50), "p95": pick(0.95), "p99": pick(0.99), "max": float(v[-1])}


@dataclass(frozen=True, slots=True)
class Failover:
    """The kill -9 of the active emitter and what followed (wall-clock ms)."""

    killed: str
    killed_ms: int
    lease_moved_ms: int | None = None
    firing_again_ms: int | None = None

    @property
    def takeover_s(self) -> float | None:
        """Kill to the standby's first fire."""
        if self.firing_again_ms is None:
            return None
        return (self.firing_again_ms - self.killed_ms) / 1000

    @property
    def lease_moved_s(self) -> float | None:
        if self.lease_moved_ms is None:
            return None
        return (self.lease_moved_ms - self.killed_ms) / 1000


@dataclass(frozen=True, slots=True)
class DemoSummary:
    scheduled: int
    executed: int
    retried: int
    dead: int
    duplicates: int
    lost: int
    cron_expected: int
    cron_ran: int
    cron_lost: int
    start_lateness_ms: dict[str, float]
    start_lateness_outside_takeover_ms: dict[str, float]
    fire_lateness_ms: dict[str, float]
    failover: Failover | None
    elapsed_s: float
    endpoints: Mapping[str, str] = field(default_factory=dict)
    lost_keys: tuple[str, ...] = ()
    duplicate_keys: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.lost == 0 and self.duplicates == 0 and self.cron_lost == 0

    def to_json(self) -> dict[str, Any]:
        doc = asdict(self)
        doc["failover"] = (
            None
            if self.failover is None
            else {
                **asdict(self.failover),
                "takeover_s": self.failover.takeover_s,
                "lease_moved_s": self.failover.lease_moved_s,
            }
        )
        doc["endpoints"] = dict(self.endpoints)
        doc["lost_keys"] = list(self.lost_keys[:20])
        doc["duplicate_keys"] = list(self.duplicate_keys[:20])
        doc["ok"] = self.ok
        return doc

    def rows(self) -> list[tuple[str, str]]:
        """(what, value) lines of the summary table."""

        def ms(p: Mapping[str, float]) -> str:
            return f"p50 {p['p50']:.0f} ms   p99 {p['p99']:.0f} ms   max {p['max']:.0f} ms"

        fo = self.failover
        rows = [
            ("scheduled", f"{self.scheduled:,} one-shot jobs"),
            ("executed", f"{self.executed:,}"),
            ("retried", f"{self.retried:,} jobs needed more than one attempt"),
            ("dead", f"{self.dead:,} in the DLQ"),
            ("duplicates", f"{self.duplicates:,} effects applied twice"),
            ("lost", f"{self.lost:,}"),
            ("cron runs", f"{self.cron_ran:,} of {self.cron_expected:,} occurrences due"),
            ("written - due", ms(self.fire_lateness_ms)),
            ("start lateness", ms(self.start_lateness_ms)),
            ("  outside the takeover", ms(self.start_lateness_outside_takeover_ms)),
        ]
        if fo is not None:
            lease = f"{fo.lease_moved_s:.2f} s" if fo.lease_moved_s is not None else "never"
            again = f"{fo.takeover_s:.2f} s" if fo.takeover_s is not None else "never"
            rows.append(("takeover", f"firing again {again} after kill -9 (lease moved {lease})"))
            rows.append(("killed", fo.killed))
        rows.extend((name, url) for name, url in self.endpoints.items())
        rows.append(("elapsed", f"{self.elapsed_s:.1f} s"))
        return rows


def summarize(
    *,
    scheduled: Sequence[str],
    cron_expected: Sequence[str],
    ledger: LedgerView,
    dead: set[str],
    fire_lateness_ms: Sequence[float],
    failover: Failover | None,
    elapsed_s: float,
    endpoints: Mapping[str, str] | None = None,
    takeover_margin_ms: int = 1_000,
) -> DemoSummary:
    """The summary of one run; see the module docstring for each number."""
    wanted = set(scheduled)
    done = {k for k, n in ledger.effects.items() if n > 0}
    executed = wanted & done
    dead_jobs = wanted & dead
    lost = sorted(wanted - done - dead)
    duplicates = {k: n - 1 for k, n in ledger.effects.items() if n > 1}
    cron_ran = set(cron_expected) & done
    starts = {k: v for k, v in ledger.first_starts().items() if k in wanted}
    lateness = [float(started - due) for due, started in starts.values()]
    if failover is not None and failover.firing_again_ms is not None:
        lo = failover.killed_ms - takeover_margin_ms
        hi = failover.firing_again_ms + takeover_margin_ms
        outside = [float(s - d) for d, s in starts.values() if not lo <= d <= hi]
    else:
        outside = lateness
    return DemoSummary(
        scheduled=len(wanted),
        executed=len(executed),
        retried=len(ledger.retried() & wanted),
        dead=len(dead_jobs),
        duplicates=sum(duplicates.values()),
        lost=len(lost),
        cron_expected=len(set(cron_expected)),
        cron_ran=len(cron_ran),
        cron_lost=len(set(cron_expected) - done),
        start_lateness_ms=percentiles(lateness),
        start_lateness_outside_takeover_ms=percentiles(outside),
        fire_lateness_ms=percentiles(fire_lateness_ms),
        failover=failover,
        elapsed_s=elapsed_s,
        endpoints=dict(endpoints or {}),
        lost_keys=tuple(lost),
        duplicate_keys=tuple(sorted(duplicates)),
    )
