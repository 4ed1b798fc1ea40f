"""How fast is ``dueflow.rules.cron.next_fire``?

    python -m benchmarks.cron_next_fire [--number N] [--json PATH]

For each case (expression, zone, start instant) it times ``next_fire`` and
two baselines measured in the same run:

- ``tz lookup``: one ``datetime.fromtimestamp(t, zone)``, the cheapest thing
  any zone-aware computation must do; the ratio says how many such lookups
  ``next_fire`` costs.
- ``minute walk``: the naive way (step the wall clock minute by minute until
  the expression matches), only for the cases where it finishes quickly.
- ``croniter``: ``croniter(expr, start).get_next()``, when croniter is
  installed (it is not a dependency of dueflow).

Prints a table and writes JSON. Numbers are microseconds per call.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import json
import timeit
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from dueflow.rules.cron import next_fire, parse_cron

CASES = [
    ("0 9 * * MON-FRI", "America/New_York", "2024-11-01T12:00"),
    ("*/15 * * * *", "Europe/London", "2024-06-01T12:07"),
    ("*/15 * * * *", "Europe/London", "2024-10-27T00:50"),  # next to a fall back
    ("30 1 * * *", "Europe/London", "2024-03-31T01:10"),  # inside a gap's shadow
    ("0 0 1 1 *", "UTC", "2024-01-02T00:00"),  # a year ahead
    ("0 0 29 2 *", "UTC", "2097-03-01T00:00"),  # 7 years ahead (2100 is no leap year)
    ("*/10 * * * * *", "Australia/Lord_Howe", "2024-10-05T15:29:55"),
]
WALKABLE_MINUTES = 60 * 24 * 7  # the minute walk only runs for answers within a week


def _ms(text: str) -> int:
    return int(datetime.fromisoformat(text).replace(tzinfo=UTC).timestamp() * 1000)


def _minute_walk(expr: str, tz: ZoneInfo, after_ms: int) -> int | None:
    parsed = parse_cron(expr)
    wall = datetime.fromtimestamp(after_ms // 1000, tz).replace(tzinfo=None, second=0)
    for _ in range(WALKABLE_MINUTES):
        wall += timedelta(minutes=1)
        if parsed.matches(wall):
            return int(wall.replace(tzinfo=tz).timestamp() * 1000)
    return None


def _time(fn: Any, number: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=5)) / number * 1e6


def _measure(expr: str, tz_name: str, start: str, number: int, croniter: Any) -> dict[str, Any]:
    parsed, tz, after = parse_cron(expr), ZoneInfo(tz_name), _ms(start)
    fire_us = _time(lambda: next_fire(parsed, after_ms=after, tz=tz), number)
    lookup_us = _time(lambda: datetime.fromtimestamp(after // 1000, tz), number)
    row: dict[str, Any] = {
        "expr": expr,
        "zone": tz_name,
        "after": start,
        "next_fire_us": round(fire_us, 2),
        "tz_lookup_us": round(lookup_us, 3),
        "ratio_to_lookup": round(fire_us / lookup_us, 1),
        "minute_walk_us": None,
        "croniter_us": None,
    }
    nxt = next_fire(parsed, after_ms=after, tz=tz)
    if nxt is not None and nxt - after <= WALKABLE_MINUTES * 60_000 and parsed.seconds == 1:
        walk_us = _time(lambda: _minute_walk(expr, tz, after), max(1, number // 100))
        row["minute_walk_us"] = round(walk_us, 1)
    if croniter is not None:
        start_dt = datetime.fromtimestamp(after / 1000, tz)
        croniter_us = _time(lambda: croniter(expr, start_dt).get_next(datetime), number // 4)
        row["croniter_us"] = round(croniter_us, 1)
    return row


def run(number: int) -> list[dict[str, Any]]:
    croniter: Any = None
    with contextlib.suppress(ImportError):  # optional baseline, not a dependency of dueflow
        croniter = importlib.import_module("croniter").croniter
    return [_measure(expr, tz_name, start, number, croniter) for expr, tz_name, start in CASES]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--number", type=int, default=2_000, help="calls per timing")
    parser.add_argument("--json", metavar="PATH", help="write the results here")
    args = parser.parse_args(argv)
    rows = run(args.number)
    header = f"{'expression':<18} {'zone':<20} {'after (UTC)':<17} {'next_fire':>9} "
    header += f"{'tz lookup':>9} {'ratio':>6} {'min walk':>9} {'croniter':>9}"
    print(header)
    for r in rows:
        walk = "-" if r["minute_walk_us"] is None else f"{r['minute_walk_us']:.0f}"
        cron = "-" if r["croniter_us"] is None else f"{r['croniter_us']:.1f}"
        print(
            f"{r['expr']:<18} {r['zone']:<20} {r['after']:<17} {r['next_fire_us']:>9.1f} "
            f"{r['tz_lookup_us']:>9.2f} {r['ratio_to_lookup']:>6.1f} {walk:>9} {cron:>9}"
        )
    print("(microseconds per call)")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump({"unit": "us_per_call", "rows": rows}, fh, indent=2)


if __name__ == "__main__":
    main()
