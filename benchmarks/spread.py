"""Lateness figures of one run and their spread over repeated runs (``--runs N``).

One run on a shared two-core machine is one sample: the p99 of two runs of the
same code can differ several times over. So the steady benchmarks repeat the
measurement, report each run's percentiles and the min / median / max of the
p99 over the runs, and say what the broker had behind it (a broker started
for the run compiles its request paths during its first minute under load).
"""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

QUANTILES = (("p50", 0.50), ("p95", 0.95), ("p99", 0.99))


def percentiles(values: Iterable[float]) -> dict[str, float | None]:
    """p50, p95, p99 (nearest rank) and max, rounded to 0.01; all None when empty
    (an empty run has no lateness, not a lateness of 0)."""
    v = sorted(values)
    if not v:
        return {"p50": None, "p95": None, "p99": None, "max": None}
    out: dict[str, float | None] = {
        name: round(float(v[min(len(v) - 1, int(q * len(v)))]), 2) for name, q in QUANTILES
    }
    out["max"] = round(float(v[-1]), 2)
    return out


def spread(runs: Sequence[Mapping[str, Any]], key: str = "p99") -> dict[str, float | None]:
    """min, median and max of ``key`` over the runs' percentiles (runs without it left
    out; all None when none has it)."""
    values = sorted(float(r[key]) for r in runs if r.get(key) is not None)
    if not values:
        return {"min": None, "median": None, "max": None}
    return {
        "min": values[0],
        "median": round(statistics.median(values), 2),
        "max": values[-1],
    }


def broker_state(*, started_here: bool, load_before_s: float) -> str:
    """``cold``: started by this invocation, no load before the run; ``warmed``: started
    by it, and it carried load (a warm-up, earlier runs, baselines) before the run;
    ``external``: a broker given with ``--bootstrap``, whose past this run cannot see."""
    if not started_here:
        return "external"
    return "warmed" if load_before_s > 0 else "cold"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:g}"


def describe(p: Mapping[str, float | None]) -> str:
    """``p50 13 / p95 30 / p99 50 / max 152 ms``."""
    return " / ".join(f"{k} {_ms(p.get(k))}" for k in ("p50", "p95", "p99", "max")) + " ms"


def spread_rows(
    runs: Sequence[Mapping[str, Any]], *, key: str = "lateness_ms", count: str = "jobs"
) -> dict[str, str]:
    """Table rows for the printed summary: one per run (its ``key`` percentiles, how
    many ``count``, load seconds and broker state), then (two runs or more) the spread
    of the p99."""
    rows = {
        f"run {i + 1}": f"{describe(r[key])}; {r[count]:,} {count}, "
        f"{r['load_s']:g} s of load, broker {r['broker_state']}"
        for i, r in enumerate(runs)
    }
    if len(runs) < 2:
        return rows
    s = spread([r[key] for r in runs])
    rows[f"p99 over {len(runs)} runs"] = (
        f"min {_ms(s['min'])} / median {_ms(s['median'])} / max {_ms(s['max'])} ms"
    )
    return rows
