"""``dueflow dlq list|show|redrive|purge``: the dead-letter queues from the shell.

::

    dueflow dlq list --queue billing --reason exhausted --since 2h
    dueflow dlq show 3:120 --queue billing
    dueflow dlq redrive --queue billing --task send-invoice --since 2h --rate 50 --dry-run
    dueflow dlq redrive --queue billing --ref 3:120 --ref 4:7
    dueflow dlq purge --queue billing --before 2030-01-01T00:00:00Z --yes

Filters: ``--task``, ``--reason``, ``--error-type``, ``--job-id`` (each may be
repeated), ``--since``/``--until`` (dead time: an ISO-8601 time or a
duration ago such as ``2h``), ``--partition``. A record is named by
``PARTITION:OFFSET`` (the ``ref`` column of ``list``).
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
from dueflow.apps.ops.bounds import parse_time
from dueflow.apps.ops.dlq import DlqFilter, latest_per_key, parse_ref, read_dead_letters
from dueflow.apps.ops.purge import plan_purge, purge
from dueflow.apps.ops.redrive import WOULD_REDRIVE, Redriver, dead_letter_state
from dueflow.config import Settings
from dueflow.control_chars import escape_text
from dueflow.errors import InvalidInput, UnknownQueue
from dueflow.kafka.pausing import operator_name
from dueflow.kafka.queue_reader import with_registered_queues
from dueflow.kafka.reading import ops_consumer
from dueflow.reasons import DEAD_LETTER_REASONS
from dueflow.timeutil import show_utc
from dueflow.wall_clock import wall_ms

REASONS = DEAD_LETTER_REASONS


def register(sub: Any) -> None:
    p = sub.add_parser("dlq", help="list, show, redrive and purge dead letters")
    dsub = p.add_subparsers(dest="dlq_command", metavar="ACTION")
    dsub.required = True

    lst = dsub.add_parser("list", help="dead letters of a queue, filtered")
    _queue_option(lst)
    _filters(lst)
    lst.add_argument("--limit", type=int, default=100, help="newest N (default 100; 0: all)")
    _common(lst)
    lst.set_defaults(func=_list)

    show = dsub.add_parser("show", help="one dead letter in full (error, traceback, job)")
    show.add_argument("ref", help="PARTITION:OFFSET (the ref column of `dlq list`)")
    _queue_option(show)
    _common(show)
    show.set_defaults(func=_show)

    red = dsub.add_parser(
        "redrive",
        help="send dead jobs back to their exec topic with a fresh attempt budget",
        description="Each chosen record runs again once, however often it is redriven: "
        "only a key whose state is still this death is redriven.",
    )
    _queue_option(red)
    _filters(red)
    red.add_argument("--ref", action="append", default=[], help="PARTITION:OFFSET (repeatable)")
    red.add_argument("--all", action="store_true", help="every record of the queue's DLQ")
    red.add_argument("--limit", type=int, help="at most N records, oldest first")
    red.add_argument("--rate", type=float, default=100.0, help="records per second (100)")
    red.add_argument("--by", help="who, recorded in the headers (default: user@host)")
    red.add_argument("--dry-run", action="store_true", help="say what would be redriven")
    _common(red)
    red.set_defaults(func=_redrive)

    pur = dsub.add_parser(
        "purge",
        help="delete dead letters below an offset (a prefix of each partition)",
        description="Kafka deletes only a prefix of a partition, so a purge is chosen by "
        "time, by PARTITION:OFFSET or --all; filters by task or reason cannot apply.",
    )
    _queue_option(pur)
    way = pur.add_mutually_exclusive_group(required=True)
    way.add_argument("--before", help="records written before this time (ISO-8601 or 2h ago)")
    way.add_argument("--through", help="PARTITION:OFFSET: that record and all before it")
    way.add_argument("--all", action="store_true", help="everything")
    pur.add_argument("--yes", action="store_true", help="really delete (else: show what would)")
    _common(pur)
    pur.set_defaults(func=_purge)


def _queue_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--queue", default="default", help="queue (default: default)")


def _filters(p: argparse.ArgumentParser) -> None:
    p.add_argument("--task", action="append", default=[], help="task name (repeatable)")
    p.add_argument(
        "--reason", action="append", default=[], help=f"one of {', '.join(REASONS)} (repeatable)"
    )
    p.add_argument("--error-type", action="append", default=[], help="exception type name")
    p.add_argument("--job-id", action="append", default=[], help="job id (repeatable)")
    p.add_argument("--since", help="dead at or after: ISO-8601 time, or a duration ago (2h)")
    p.add_argument("--until", help="dead before: ISO-8601 time, or a duration ago")
    p.add_argument("--partition", type=int, action="append", default=[], help="partition")


def _common(p: argparse.ArgumentParser) -> None:
    add_global_options(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")


def _queue_settings(args: argparse.Namespace) -> Settings:
    """Settings whose queues include the registered ones; ``--queue`` must be one."""
    settings = with_registered_queues(settings_from_args(args))
    if args.queue not in settings.queue_names:
        raise UnknownQueue(args.queue, settings.queue_names)
    return settings


def build_filter(args: argparse.Namespace, *, now_ms: int) -> DlqFilter:
    for reason in args.reason:
        if reason not in REASONS:
            raise InvalidInput("reason", reason, f"one of {', '.join(REASONS)}")
    return DlqFilter(
        tasks=frozenset(args.task),
        reasons=frozenset(args.reason),
        error_types=frozenset(args.error_type),
        job_ids=frozenset(args.job_id),
        since_ms=parse_time(args.since, field="since", now_ms=now_ms) if args.since else None,
        until_ms=parse_time(args.until, field="until", now_ms=now_ms) if args.until else None,
        partitions=frozenset(args.partition),
        refs=frozenset(parse_ref(r) for r in getattr(args, "ref", []) or []),
    )


def _list(args: argparse.Namespace) -> int:
    where = build_filter(args, now_ms=wall_ms())  # input first: before connecting
    settings = _queue_settings(args)
    consumer = ops_consumer(settings)
    try:
        entries = read_dead_letters(settings, consumer, args.queue, where=where)
        total = len(entries)
        latest = latest_per_key(entries)
        entries.sort(key=lambda e: (e.dead_ms, e.partition, e.offset))
        if args.limit:
            entries = entries[-args.limit :]
        # What became of each since: redriven (and how that went) or still dead.
        states = Redriver(settings, by="").key_states(consumer, args.queue, entries)
    finally:
        consumer.close()
    now = {
        e.ref: dead_letter_state(
            e,
            states.get((e.partition, e.idempotency_key or "")),
            latest=latest.get((e.partition, e.idempotency_key or ""), e) is e,
        )
        for e in entries
    }
    if args.json:
        summaries = [{**e.summary(), "state": now[e.ref]} for e in entries]
        print_json({"queue": args.queue, "matched": total, "entries": summaries})
        return 0
    rows = [
        [
            e.ref,
            show_utc(e.dead_ms),
            e.job_id,
            e.task,
            e.reason,
            _short(f"{e.error_type}: {e.summary()['error_message']}"),
            e.attempts,
            now[e.ref],
        ]
        for e in entries
    ]
    print_text(
        format_table(["ref", "dead at", "job", "task", "reason", "error", "attempts", "now"], rows)
    )
    shown = f"{len(entries)} shown of " if len(entries) < total else ""
    print_text(f"{shown}{total} dead letter(s) in queue {args.queue}")
    return 0


def _show(args: argparse.Namespace) -> int:
    partition, offset = parse_ref(args.ref)
    settings = _queue_settings(args)
    consumer = ops_consumer(settings)
    try:
        found = read_dead_letters(
            settings,
            consumer,
            args.queue,
            where=DlqFilter(refs=frozenset({(partition, offset)})),
        )
    finally:
        consumer.close()
    if not found:
        raise InvalidInput("ref", args.ref, f"a record of the DLQ of queue {args.queue}")
    details = found[0].details()
    if args.json:
        print_json(details)
        return 0
    for key in (
        "ref",
        "job_id",
        "task",
        "idempotency_key",
        "reason",
        "error_type",
        "error_message",
        "attempts",
        "dead_at",
        "original",
        "trace_id",
        "value_ref",
        "problem",
    ):
        if details.get(key) is not None:
            print_text(f"{key:<16} {escape_text(details[key])}")
    if details.get("job"):
        print_text(f"{'job':<16} {escape_text(details['job'])}")
    if details.get("traceback"):  # its own lines kept, each escaped
        print_text("traceback:\n" + escape_text(details["traceback"], keep="\n"))
    return 0


def _redrive(args: argparse.Namespace) -> int:
    where = build_filter(args, now_ms=wall_ms())
    if where == type(where)() and not args.all:
        raise InvalidInput(
            "redrive", "no filter", "a filter (--task, --reason, --since, --ref, ...) or --all"
        )
    settings = _queue_settings(args)
    redriver = Redriver(settings, by=args.by or operator_name(), rate_per_s=args.rate)
    with progress_bar(f"redriving {args.queue}", enabled=not args.json) as update:
        report = redriver.run(
            args.queue, where, dry_run=args.dry_run, limit=args.limit, on_progress=update
        )
    if args.json:
        print_json(report.to_json())
    else:
        for item in report.items:
            if item.why == WOULD_REDRIVE:
                state = "would be redriven"
            else:
                state = "redriven" if item.redriven else f"skipped: {item.why}"
            job = escape_text(item.entry.job_id)
            print_text(f"{item.entry.ref:<10} {job:<34} {escape_text(state)}")
        if args.dry_run:
            would = report.would_redrive
            print_text(
                f"dry run, nothing written: {would} would be redriven, "
                f"{len(report.items) - would} would be skipped, in queue {args.queue}"
            )
        else:
            print_text(
                f"{report.redriven} redriven, {report.skipped} skipped, in queue {args.queue}"
                f" (by {escape_text(report.by)})"
            )
        if report.error:
            print_text(f"stopped early: {escape_text(report.error)}")
    return 1 if report.error else 0


def _purge(args: argparse.Namespace) -> int:
    before = parse_time(args.before, field="before", now_ms=wall_ms()) if args.before else None
    through = parse_ref(args.through) if args.through else None
    settings = _queue_settings(args)
    consumer = ops_consumer(settings)
    try:
        cuts = plan_purge(
            settings, consumer, args.queue, before_ms=before, through=through, everything=args.all
        )
    finally:
        consumer.close()
    total = sum(c.records for c in cuts)
    deleted = purge(settings, args.queue, cuts) if args.yes else {}
    if args.json:
        print_json(
            {
                "queue": args.queue,
                "deleted": args.yes,
                "records": total,
                "partitions": [
                    {"partition": c.partition, "from": c.low, "before": c.before} for c in cuts
                ],
                "low_watermarks": {str(p): low for p, low in deleted.items()},
            }
        )
    else:
        for c in cuts:
            print(f"partition {c.partition}: offsets {c.low}..{c.before - 1} ({c.records})")
        if args.yes:
            print(f"deleted {total} dead letter(s) of queue {args.queue}")
        else:
            print(f"{total} dead letter(s) would be deleted; nothing deleted: add --yes")
    return 0 if args.yes or not cuts else 1


def _short(text: str, width: int = 60) -> str:
    text = escape_text(text)
    return text if len(text) <= width else text[: width - 1] + "…"
