"""``dueflow cron add|update|list|pause|resume|delete``: cron schedules from the shell.

::

    dueflow cron add nightly --cron "0 3 * * *" --tz Europe/Paris --task build_report
    dueflow cron list --json
    dueflow cron pause nightly

Definitions are checked before connecting; bad input exits 2 with the
message on stderr and writes nothing.
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
from dueflow.apps.cli.schedule_cmd import PAYLOAD_HELP, read_payload
from dueflow.control_chars import escape_text
from dueflow.producers.schedule_client import schedule_fields
from dueflow.producers.scheduler import Scheduler
from dueflow.records.job_request import check_name
from dueflow.rules.cron import (
    CronSchedule,
    MisfirePolicy,
    OverlapPolicy,
    next_occurrence,
    parse_cron,
)
from dueflow.timeutil import format_utc, show_utc
from dueflow.wall_clock import wall_ms

MISFIRE_HELP = "after downtime: " + ", ".join(p.value for p in MisfirePolicy) + " (fire_once)"


def register(sub: Any) -> None:
    p = sub.add_parser("cron", help="add, change, list, pause, resume, delete cron schedules")
    csub = p.add_subparsers(dest="cron_command", metavar="ACTION")
    csub.required = True

    add = csub.add_parser("add", help="add a schedule")
    add.add_argument("schedule_id", help="schedule id")
    add.add_argument("--cron", required=True, help='expression, e.g. "0 3 * * *" or @hourly')
    add.add_argument("--tz", required=True, help="IANA time zone, e.g. Europe/Paris or UTC")
    add.add_argument("--task", required=True, help="task name")
    add.add_argument("--queue", help="queue (default: the task's route, see `dueflow schedule`)")
    add.add_argument("--paused", action="store_true", help="add it paused")
    _definition_options(add)
    add.set_defaults(func=_add)

    update = csub.add_parser("update", help="change fields of a schedule (others are kept)")
    update.add_argument("schedule_id", help="schedule id")
    update.add_argument("--cron", help="expression")
    update.add_argument("--tz", help="IANA time zone")
    update.add_argument("--task", help="task name")
    update.add_argument("--queue", help="queue")
    _definition_options(update)
    update.set_defaults(func=_update)

    lst = csub.add_parser("list", help="every schedule, with its next occurrence")
    lst.set_defaults(func=_list)
    add_global_options(lst)
    lst.add_argument("--json", action="store_true", help="machine-readable output")

    for name, func, help_ in (
        ("pause", _pause, "stop firing a schedule (it stays)"),
        ("resume", _resume, "fire a paused schedule again"),
        ("delete", _delete, "delete a schedule"),
    ):
        sp = csub.add_parser(name, help=help_)
        sp.add_argument("schedule_id", help="schedule id")
        add_global_options(sp)
        sp.add_argument("--json", action="store_true", help="machine-readable output")
        sp.set_defaults(func=func)


def _definition_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--payload", help=PAYLOAD_HELP)
    p.add_argument("--misfire", help=MISFIRE_HELP)
    p.add_argument(
        "--overlap",
        help="while the previous occurrence still runs: allow (run anyway; default), skip, "
        "buffer_one (wait for it; at most one waits)",
    )
    p.add_argument("--jitter", help="spread each occurrence over [0, JITTER], e.g. 1m")
    p.add_argument("--start", help="first instant it may fire, ISO-8601 with an offset")
    p.add_argument("--end", help="last instant it may fire, ISO-8601 with an offset")
    p.add_argument("--max-attempts", type=int, help="attempts per occurrence")
    p.add_argument("--backoff", help="exponential|fixed|none[:BASE[:MAX]]")
    p.add_argument("--timeout", help="run time limit of one attempt, e.g. 10m")
    add_global_options(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")


def schedule_json(s: CronSchedule, *, now_ms: int) -> dict[str, Any]:
    nxt = None if s.paused else next_occurrence(s, after_ms=now_ms)
    return {
        "schedule_id": s.schedule_id,
        "cron": s.cron,
        "timezone": s.timezone,
        "queue": s.queue,
        "task": s.task,
        "payload": s.payload.decode("utf-8", "replace"),
        "content_type": s.content_type,
        "misfire": s.misfire.value,
        "overlap": s.overlap.value,
        "jitter_ms": s.jitter_ms,
        "start": None if s.start_ms is None else show_utc(s.start_ms),
        "end": None if s.end_ms is None else show_utc(s.end_ms),
        "paused": s.paused,
        "version": s.version,
        "max_attempts": s.max_attempts,
        "timeout_ms": s.timeout_ms,
        "next": None if nxt is None else format_utc(nxt),
    }


def _show(args: argparse.Namespace, s: CronSchedule, verb: str) -> int:
    if args.json:
        print_json(schedule_json(s, now_ms=wall_ms()))
    else:
        state = " (paused)" if s.paused else ""
        print_text(
            f"{verb} schedule {escape_text(s.schedule_id)}: {s.cron!r} in "
            f"{escape_text(s.timezone)} -> {escape_text(s.task)} on {escape_text(s.queue)}"
            f"{state}, version {s.version}"
        )
    return 0


def _schedule_flags(args: argparse.Namespace) -> dict[str, Any]:
    """What the flags of ``cron add`` and ``cron update`` both set (None: not given)."""
    return {
        "cron": args.cron,
        "timezone": args.tz,
        "task": args.task,
        "queue": args.queue,
        "misfire": args.misfire,
        "overlap": args.overlap,
        "jitter": args.jitter,
        "start": args.start,
        "end": args.end,
        "max_attempts": args.max_attempts,
        "backoff": args.backoff,
        "timeout": args.timeout,
    }


def _add(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    definition: dict[str, Any] = {
        **_schedule_flags(args),
        "payload": read_payload(args.payload),
        "misfire": args.misfire or MisfirePolicy.FIRE_ONCE,
        "overlap": args.overlap or OverlapPolicy.ALLOW,
        "labels": None,
        "paused": args.paused,
    }
    # Checked before connecting (whether the queue exists: by the scheduler).
    schedule_fields(
        settings, schedule_id=args.schedule_id, check_queue=lambda _q: None, **definition
    )
    with Scheduler(settings) as scheduler:
        s = scheduler.add_schedule(args.schedule_id, **definition)
    return _show(args, s, "added")


def _update(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    changes = _schedule_flags(args)
    check_name("schedule_id", args.schedule_id)
    if args.cron is not None:
        parse_cron(args.cron)  # before connecting; the rest is checked against the stored one
    if args.payload is not None:
        changes["payload"] = read_payload(args.payload)
    with Scheduler(settings) as scheduler:
        s = scheduler.update_schedule(args.schedule_id, **changes)
    return _show(args, s, "updated")


def _list(args: argparse.Namespace) -> int:
    with Scheduler(settings_from_args(args)) as scheduler:
        schedules = scheduler.list_schedules()
    now = wall_ms()
    rows = [schedule_json(s, now_ms=now) for s in schedules]
    if args.json:
        print_json(rows)
        return 0
    print_text(
        format_table(
            ["id", "cron", "timezone", "queue", "task", "paused", "next (UTC)", "version"],
            [
                [
                    r["schedule_id"],
                    r["cron"],
                    r["timezone"],
                    r["queue"],
                    r["task"],
                    "yes" if r["paused"] else "",
                    r["next"] or "-",
                    r["version"],
                ]
                for r in rows
            ],
        )
    )
    return 0


def _pause(args: argparse.Namespace) -> int:
    with Scheduler(settings_from_args(args)) as scheduler:
        s = scheduler.pause_schedule(args.schedule_id)
    return _show(args, s, "paused")


def _resume(args: argparse.Namespace) -> int:
    with Scheduler(settings_from_args(args)) as scheduler:
        s = scheduler.resume_schedule(args.schedule_id)
    return _show(args, s, "resumed")


def _delete(args: argparse.Namespace) -> int:
    with Scheduler(settings_from_args(args)) as scheduler:
        deleted = scheduler.delete_schedule(args.schedule_id)
    if args.json:
        print_json({"schedule_id": args.schedule_id, "deleted": deleted})
    else:
        shown = escape_text(args.schedule_id)
        print_text(f"deleted schedule {shown}" if deleted else f"no schedule {shown}")
    return 0 if deleted else 1
