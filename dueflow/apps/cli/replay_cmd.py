"""``dueflow replay``: produce an exec or retry topic range again, so workers run what
is not done yet.

::

    dueflow replay --topic dueflow.exec.billing --from 2h --dry-run
    dueflow replay --topic dueflow.exec.billing --from 2030-01-01T08:00:00Z \\
        --to 2030-01-01T09:00:00Z --partition 3 --rate 500
    dueflow replay --topic dueflow.retry.billing.10s --from 1200 --to 1300 --partition 0

``--from``/``--to`` are offsets (digits), ISO-8601 times or durations ago;
the range is ``[from, to)``, ``--to`` defaults to the end. Records keep their
partition, key, value and headers (retry records their ``df-due``) and get
``df-replayed-from``/``-by``/``-at``. Workers skip jobs already done, dead or
cancelled, so a replay only runs what never finished.
"""

from __future__ import annotations

import argparse
from typing import Any

from dueflow.apps.cli.common import (
    add_global_options,
    format_table,
    print_json,
    print_text,
    settings_from_args,
)
from dueflow.apps.cli.progress_bar import progress_bar
from dueflow.apps.ops.bounds import parse_bound
from dueflow.apps.ops.replay import Replayer, plan_spans
from dueflow.control_chars import escape_text
from dueflow.kafka.pausing import operator_name
from dueflow.kafka.reading import ops_consumer
from dueflow.timeutil import show_utc
from dueflow.wall_clock import wall_ms

SHOWN = 50


def register(sub: Any) -> None:
    p = sub.add_parser(
        "replay", help="produce exec or retry records of a range again (workers skip done jobs)"
    )
    p.add_argument("--topic", required=True, help="an exec or retry topic, e.g. dueflow.exec.q")
    p.add_argument("--from", dest="start", required=True, help="offset, ISO-8601 time or 2h ago")
    p.add_argument("--to", dest="end", help="offset, ISO-8601 time or 30m ago (default: the end)")
    p.add_argument("--partition", type=int, action="append", default=[], help="(repeatable)")
    p.add_argument("--rate", type=float, default=1000.0, help="records per second (1000)")
    p.add_argument("--by", help="who, recorded in the headers (default: user@host)")
    p.add_argument("--dry-run", action="store_true", help="list what would be replayed")
    add_global_options(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_replay)


def _replay(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    now = wall_ms()
    start = parse_bound(args.start, field="from", now_ms=now)
    end = parse_bound(args.end, field="to", now_ms=now) if args.end else None
    consumer = ops_consumer(settings)
    try:
        spans = plan_spans(
            settings, consumer, args.topic, start=start, end=end, partitions=args.partition
        )
        replayer = Replayer(settings, by=args.by or operator_name(), rate_per_s=args.rate)
        with progress_bar(f"replaying {args.topic}", enabled=not args.json) as update:
            report = replayer.run(
                consumer, args.topic, spans, dry_run=args.dry_run, on_progress=update
            )
    finally:
        consumer.close()
    if args.json:
        print_json(report.to_json())
        return 1 if report.refused else 0
    for s in spans:
        print(f"partition {s.partition}: offsets [{s.start}, {s.end})")
    if args.dry_run:
        rows = [
            [
                f"{r.partition}:{r.offset}",
                r.job_id or "?",
                r.key or "",
                r.attempt,
                show_utc(r.due_ms) if r.due_ms else "?",
            ]
            for r in report.records[:SHOWN]
        ]
        if rows:
            print_text(format_table(["record", "job", "key", "attempt", "due"], rows))
        more = len(report.records) - SHOWN
        if more > 0:
            print(f"... and {more} more")
        print(f"{len(report.records)} record(s) would be replayed to {args.topic}")
    else:
        for r, why in report.refused[:SHOWN]:
            job = escape_text(r.job_id or "?")
            print_text(f"not replayed {r.partition}:{r.offset} ({job}): {escape_text(why)}")
        if len(report.refused) > SHOWN:
            print_text(f"... and {len(report.refused) - SHOWN} more not replayed")
        by = escape_text(report.by)
        print_text(f"replayed {report.replayed} record(s) to {args.topic} (by {by})")
    if report.commands_skipped:
        print(
            f"{report.commands_skipped} command(s) (cancel, move, update) not replayed: "
            "they were applied when first read"
        )
    return 1 if report.refused else 0
