"""The figures of ``benchmarks.e2e``: one run's, and what ``--runs N`` of them add up to.

Pure: :class:`Measured` holds what a run recorded (every handler run, the
raw baseline's latencies, CPU seconds by process); :func:`run_figures` and
:func:`combine` turn that into the JSON. Lateness is always over every job
(a job's first run): the headline ``lateness_ms`` is handler start - due,
what a ``read_committed`` consumer (the worker) saw: the emitter's write
once appended (firing without transactions) or once its transaction
committed; ``lateness_settled_ms`` leaves out the jobs due before the end of
``--settle-s`` and is labelled so. ``fired_lateness_ms`` (the emitter's
``df-fired`` stamp - due) is a breakdown, never a headline. Copies:
``duplicates`` counts runs beyond a job's first (must be 0),
``duplicates_skipped`` the committed ``duplicate`` outcomes (copies of a job
the workers did not run) and ``emitter_refires`` the emitter's
``dueflow_emitter_refires_total`` (fires after a takeover of timers it may
have fired before: an upper bound of the copies).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from benchmarks.spread import percentiles, spread

Run = tuple[str, int, int, int]  # (idempotency key, due ms, handler start ms, fired ms or -1)

LATENESS_MEASURE = (
    "handler start - due of every job (its first run): the worker, a read_committed "
    "consumer, sees a job once the emitter's write is appended (without transactions) "
    "or its transaction committed (emitter.transactional)"
)


@dataclass(frozen=True)
class Measured:
    """What one run recorded."""

    jobs: int
    runs: list[Run]
    started_s: float  # wall time of the first schedule
    done_s: float  # wall time the last job's outcomes were committed
    schedule_s: float
    load_s: float  # seconds of load asked for (steady: settle + duration)
    settled_from_ms: int | None  # steady: jobs due from here on are the settled ones
    raw_msgs_per_s: float | None
    raw_seconds: float
    raw_latencies: list[float]  # receive - produce, ms
    raw_cpu_s: dict[str, float]  # the raw baseline's processes
    cpu_s: dict[str, float | None]  # the pipeline's processes, during the run
    watcher_cpu_s: float
    broker_jit_cpu_s: float | None
    emitter_commit_ms: dict[str, Any]
    broker_state: str
    broker_load_before_s: float | None
    duplicates_skipped: int = 0  # committed "duplicate" outcomes: copies not run
    emitter_refires: float = 0.0  # dueflow_emitter_refires_total at the end
    extra: dict[str, Any] = field(default_factory=dict)


def first_runs(runs: Sequence[Run]) -> Iterator[Run]:
    """Each job's first run (by start time)."""
    seen: set[str] = set()
    for r in sorted(runs, key=lambda r: r[2]):
        if r[0] not in seen:
            seen.add(r[0])
            yield r


def cdf(values: Sequence[float]) -> list[float]:
    """Values at percentiles 0, 1, ..., 100 (for the report's distribution chart)."""
    if not values:
        return []
    v = sorted(values)
    return [v[min(len(v) - 1, int(q / 100 * len(v)))] for q in range(101)]


def per_job(total_s: Mapping[str, float | None], jobs: int) -> dict[str, float]:
    """Microseconds of CPU per job by process, and their total: what two cores can do at
    most, whatever else the host runs, is 2e6 / total."""
    out = {k: round(v * 1e6 / jobs, 1) for k, v in total_s.items() if v is not None and jobs}
    out["total"] = round(sum(out.values()), 1)
    return out


@dataclass(frozen=True)
class _Lateness:
    every: list[float]
    settled: list[float]
    fired: list[float]
    fired_to_start: list[float]
    executed: int
    duplicates: int


def _lateness(m: Measured) -> _Lateness:
    first = list(first_runs(m.runs))
    settled_from = m.settled_from_ms
    return _Lateness(
        every=[float(s - d) for _, d, s, _ in first],
        settled=[float(s - d) for _, d, s, _ in first if settled_from and d >= settled_from],
        fired=[float(f - d) for _, d, _, f in first if f >= 0],
        fired_to_start=[float(s - f) for _, _, s, f in first if f >= 0],
        executed=len(first),
        duplicates=len(m.runs) - len(first),
    )


def per_second(runs: Sequence[Run]) -> list[dict[str, Any]]:
    """Each job's first run grouped by the second of its due time (``second``:
    seconds after the earliest due time): jobs, start - due p50 / p99 / max,
    and the p99 of the emitter's stamp - due and of start - stamp. Says whether
    the tail comes in episodes or everywhere, and which half of the path holds it
    (``--per-second``)."""
    first = list(first_runs(runs))
    if not first:
        return []
    t0 = min(d for _, d, _, _ in first) // 1000
    by_second: dict[int, list[Run]] = {}
    for r in first:
        by_second.setdefault(r[1] // 1000 - t0, []).append(r)
    rows: list[dict[str, Any]] = []
    for second in sorted(by_second):
        group = by_second[second]
        late = percentiles(float(s - d) for _, d, s, _ in group)
        rows.append(
            {
                "second": second,
                "jobs": len(group),
                "lateness_p50_ms": late["p50"],
                "lateness_p99_ms": late["p99"],
                "lateness_max_ms": late["max"],
                "fired_lateness_p99_ms": percentiles(
                    float(f - d) for _, d, _, f in group if f >= 0
                )["p99"],
                "fired_to_start_p99_ms": percentiles(
                    float(s - f) for _, _, s, f in group if f >= 0
                )["p99"],
            }
        )
    return rows


def host_cpu_share(before: Sequence[int], after: Sequence[int]) -> dict[str, float | None]:
    """Busy and steal shares of the host's CPU time between two readings of the
    ``cpu`` line of ``/proc/stat`` (user nice system idle iowait irq softirq steal;
    busy includes steal, time the hypervisor gave to other guests):
    a run whose host was busy near 1.0 measured queueing for a core, not the
    pipeline's own delays. None when no time passed."""
    delta = [b - a for a, b in zip(before[:8], after[:8], strict=True)]
    total = sum(delta)
    if total <= 0:
        return {"busy": None, "steal": None}
    idle = delta[3] + delta[4]
    return {"busy": round(1 - idle / total, 3), "steal": round(delta[7] / total, 3)}


def _sum_by_key(dicts: Sequence[Mapping[str, float | None]]) -> dict[str, float | None]:
    """Per key, the sum over ``dicts`` (None if any of them has None there)."""
    out: dict[str, float | None] = {}
    for d in dicts:
        for k, v in d.items():
            prev = out.get(k, 0.0)
            out[k] = None if v is None or prev is None else prev + v
    return out


def run_figures(m: Measured, *, steady: bool) -> dict[str, Any]:
    """One run's figures (an entry of ``per_run``)."""
    lat = _lateness(m)
    seconds = m.done_s - m.started_s
    out: dict[str, Any] = {
        "jobs": m.jobs,
        "executed": lat.executed,
        "lost": m.jobs - lat.executed,
        "duplicates": lat.duplicates,
        "duplicates_skipped": m.duplicates_skipped,
        "emitter_refires": m.emitter_refires,
        "lateness_ms": percentiles(lat.every),
    }
    if steady:
        out["lateness_settled_ms"] = percentiles(lat.settled)
        out["settled_jobs"] = len(lat.settled)
        out["raw_latency_ms"] = percentiles(m.raw_latencies)
        out["throughput_jobs_per_s"] = round(m.jobs / m.schedule_s) if m.schedule_s else None
    else:
        throughput = m.jobs / seconds if seconds > 0 else None
        out["throughput_jobs_per_s"] = round(throughput) if throughput else None
        out["raw_roundtrip_msgs_per_s"] = m.raw_msgs_per_s
        out["ratio"] = (
            round(throughput / m.raw_msgs_per_s, 3) if throughput and m.raw_msgs_per_s else None
        )
    out.update(
        {
            "fired_lateness_ms": percentiles(lat.fired),
            "fired_to_start_ms": percentiles(lat.fired_to_start),
            "seconds": round(seconds, 2),
            "schedule_s": round(m.schedule_s, 2),
            "load_s": m.load_s,
            "broker_state": m.broker_state,
            "broker_load_before_s": m.broker_load_before_s,
            "cpu_s": {k: None if v is None else round(v, 2) for k, v in m.cpu_s.items()},
            "cpu_us_per_job": per_job(m.cpu_s, m.jobs),
            "raw_cpu_us_per_record": per_job(m.raw_cpu_s, m.jobs),
            "watcher_cpu_us_per_job": per_job({"watcher": m.watcher_cpu_s}, m.jobs)["watcher"]
            if m.jobs
            else None,
            "broker_jit_cpu_s": None
            if m.broker_jit_cpu_s is None
            else round(m.broker_jit_cpu_s, 2),
            "emitter_commit_ms": m.emitter_commit_ms,
            **m.extra,
        }
    )
    return out


def combine(measured: Sequence[Measured], *, steady: bool) -> dict[str, Any]:
    """The figures over every job of every run (the headlines), the spread of each run's
    p99 (``*_p99_spread_ms``: min / median / max) and ``per_run``."""
    if not measured:
        raise ValueError("combine: no runs")
    runs = [run_figures(m, steady=steady) for m in measured]
    lats = [_lateness(m) for m in measured]
    every = [x for lat in lats for x in lat.every]
    jobs = sum(m.jobs for m in measured)
    executed = sum(lat.executed for lat in lats)
    out: dict[str, Any] = {
        "runs": len(measured),
        "jobs": jobs,
        "executed": executed,
        "lost": jobs - executed,
        "duplicates": sum(lat.duplicates for lat in lats),
        "duplicates_skipped": sum(m.duplicates_skipped for m in measured),
        "emitter_refires": sum(m.emitter_refires for m in measured),
        "lateness_ms": percentiles(every),
        "lateness_measure": LATENESS_MEASURE,
        "lateness_p99_spread_ms": spread([r["lateness_ms"] for r in runs]),
        "lateness_cdf_ms": cdf(every),
    }
    if steady:
        settled = [x for lat in lats for x in lat.settled]
        raw = [x for m in measured for x in m.raw_latencies]
        schedule_s = sum(m.schedule_s for m in measured)
        out.update(
            {
                "lateness_settled_ms": percentiles(settled),
                "settled_jobs": len(settled),
                "lateness_settled_p99_spread_ms": spread([r["lateness_settled_ms"] for r in runs]),
                "raw_latency_ms": percentiles(raw),
                "raw_latency_p99_spread_ms": spread([r["raw_latency_ms"] for r in runs]),
                "throughput_jobs_per_s": round(jobs / schedule_s) if schedule_s else None,
                "ratio": None,  # the rate is given: a throughput ratio says nothing here
            }
        )
    else:
        seconds = sum(m.done_s - m.started_s for m in measured)
        raw_seconds = sum(m.raw_seconds for m in measured)
        throughput = jobs / seconds if seconds > 0 else None
        raw_rate = jobs / raw_seconds if raw_seconds > 0 else None
        out.update(
            {
                "throughput_jobs_per_s": round(throughput) if throughput else None,
                "throughput_spread_jobs_per_s": spread(
                    [{"x": r["throughput_jobs_per_s"]} for r in runs], key="x"
                ),
                "seconds": round(seconds, 2),
                "raw_roundtrip_msgs_per_s": round(raw_rate) if raw_rate else None,
                "ratio": round(throughput / raw_rate, 3) if throughput and raw_rate else None,
            }
        )
    out.update(
        {
            "fired_lateness_ms": percentiles([x for lat in lats for x in lat.fired]),
            "fired_to_start_ms": percentiles([x for lat in lats for x in lat.fired_to_start]),
            "cpu_us_per_job": per_job(_sum_by_key([m.cpu_s for m in measured]), jobs),
            "raw_cpu_us_per_record": per_job(_sum_by_key([m.raw_cpu_s for m in measured]), jobs),
            "per_run": runs,
        }
    )
    return out
