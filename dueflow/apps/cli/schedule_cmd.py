"""``dueflow schedule``, ``dueflow reschedule`` and ``dueflow cancel``: one job from the shell.

::

    dueflow schedule send_email --payload '{"to": "a@example.com"}' --delay 10m --json
    dueflow schedule report --payload @params.json --at 2030-01-01T09:00:00+01:00
    dueflow reschedule 0190f0c2a1b27c3d8e9f00112233aabb --delay 2h
    dueflow cancel 0190f0c2a1b27c3d8e9f00112233aabb

Input is checked before connecting; bad input exits 2 with the message on
stderr and writes nothing.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import orjson

from dueflow.apps.cli.common import add_global_options, print_json, settings_from_args
from dueflow.errors import InvalidInput
from dueflow.producers.scheduler import Scheduler, declared_queues
from dueflow.records.job_request import JobRequest, JobRules, deadline_of, due_of, prepare_job
from dueflow.timeutil import format_utc
from dueflow.wall_clock import wall_ms

PAYLOAD_HELP = "JSON text, or @PATH of a file holding JSON (default: null)"


def register(sub: Any) -> None:
    p = sub.add_parser("schedule", help="schedule one job (at a time, after a delay, or now)")
    p.add_argument("task", help="task name (the registered handler)")
    p.add_argument("--payload", help=PAYLOAD_HELP)
    when = p.add_mutually_exclusive_group()
    when.add_argument("--at", help="due time, ISO-8601 with an offset (2030-01-01T09:00:00Z)")
    when.add_argument("--delay", help="due after this long: 30s, 5m, 1h30m, 2d")
    p.add_argument(
        "--queue", help="queue (default: the task's route: [routes], then @task of --app, default)"
    )
    p.add_argument(
        "--app",
        action="append",
        help="module(s) whose @task declarations route the task, e.g. mypkg.tasks "
        "(env DUEFLOW_APP; repeatable, comma-separated)",
    )
    p.add_argument("--job-id", help="job id (default: a new UUIDv7)")
    p.add_argument("--idempotency-key", help="key for dedup and side effects (default: job id)")
    p.add_argument("--max-attempts", type=int, help="attempts before the DLQ (default: settings)")
    p.add_argument("--backoff", help="exponential|fixed|none[:BASE[:MAX]], e.g. fixed:1s:1m")
    p.add_argument("--timeout", help="run time limit of one attempt, e.g. 30s")
    p.add_argument("--jitter", help="spread the due time over [0, JITTER], e.g. 10s")
    p.add_argument(
        "--expires", help="not started by this instant (ISO-8601 with an offset): not run"
    )
    p.add_argument(
        "--max-lateness", help="not started this long after its due time (e.g. 5m): not run"
    )
    add_global_options(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_schedule)

    c = sub.add_parser(
        "cancel",
        help="cancel a job (workers skip it if it has not run) or a cron schedule",
        description="`cancel JOB_ID` cancels one job: it is looked up by its outcomes first, "
        "and the cancellation goes to the queue and key they name (exit 1 when the job has "
        "finished already, or was not found and --queue wrote it blind); `cancel --schedule ID` "
        "pauses the schedule (--delete: deletes it) and cancels its occurrence already in the "
        "wheel.",
    )
    c.add_argument("job_id", nargs="?", help="the job id")
    c.add_argument("--schedule", help="a cron schedule id: stop it, cancel its next occurrence")
    c.add_argument("--delete", action="store_true", help="with --schedule: delete, not pause")
    c.add_argument(
        "--queue",
        help="the job's queue (default: the one its outcomes name; needed when the job is "
        "not found, or its id is known in more than one queue)",
    )
    c.add_argument(
        "--idempotency-key", help="the job's idempotency key (default: the one it was given)"
    )
    add_global_options(c)
    c.add_argument("--json", action="store_true", help="machine-readable output")
    c.set_defaults(func=_cancel)

    r = sub.add_parser(
        "reschedule",
        help="move a pending job to another time (it never runs at the old one)",
        description="`reschedule JOB_ID --at T | --delay D` moves a job that has not started: "
        "a new timer at the new time, and a record that makes workers skip the old one. Exit 1 "
        "when it was not rescheduled (not found, started or finished, a cron occurrence); "
        "the reason is printed.",
    )
    r.add_argument("job_id", help="the job id")
    rwhen = r.add_mutually_exclusive_group(required=True)
    rwhen.add_argument("--at", help="the new due time, ISO-8601 with an offset")
    rwhen.add_argument("--delay", help="the new due time from now: 30s, 5m, 1h30m, 2d")
    r.add_argument(
        "--queue", help="the job's queue (default: the one its outcomes name; as for cancel)"
    )
    add_global_options(r)
    r.add_argument("--json", action="store_true", help="machine-readable output")
    r.set_defaults(func=_reschedule)


def read_payload(text: str | None) -> Any:
    """The JSON value of ``--payload`` (text or ``@path``)."""
    if text is None:
        return None
    source = text
    if text.startswith("@"):
        path = Path(text[1:])
        try:
            source = path.read_text()
        except OSError as exc:
            raise InvalidInput("payload", text, f"@PATH of a readable file ({exc})") from None
    try:
        return orjson.loads(source)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput("payload", text, f"{PAYLOAD_HELP} ({exc})") from None


def _schedule(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    req = JobRequest(
        args.task,
        read_payload(args.payload),
        run_at=args.at,
        delay=args.delay,
        queue=args.queue,
        job_id=args.job_id,
        idempotency_key=args.idempotency_key,
        max_attempts=args.max_attempts,
        backoff=args.backoff,
        timeout=args.timeout,
        jitter=args.jitter,
        expires=args.expires,
        max_lateness=args.max_lateness,
    )
    app = args.app if args.app else settings.app
    rules = JobRules.from_settings(settings, declared=declared_queues(app))
    # Everything that needs no broker is checked before connecting; whether the
    # queue exists is checked by the scheduler, which reads the queue registry.
    queue = rules.queue_of(req)
    checked = prepare_job(
        req,
        now_ms=wall_ms(),
        rules=rules.with_queues({*rules.queues, queue}) if isinstance(queue, str) else rules,
        new_job_id=lambda now_ms: "not-written",
    )
    deadline_of(req, checked.due_ms)
    with Scheduler(settings, app=app) as scheduler:
        result = scheduler.schedule_request(req)
    if args.json:
        print_json(result.to_json())
    else:
        state = "already scheduled" if result.duplicate else "scheduled"
        expires = "" if result.expires_ms is None else f", expires {format_utc(result.expires_ms)}"
        print(
            f"{state} job {result.job_id} due {format_utc(result.due_ms)} "
            f"(queue {result.queue}, task {result.task}{expires})"
        )
    return 0


def _cancel(args: argparse.Namespace) -> int:
    if (args.job_id is None) == (args.schedule is None):
        raise InvalidInput("cancel", args.job_id or args.schedule, "a JOB_ID or --schedule ID")
    if args.schedule is not None:
        return _cancel_schedule(args)
    if args.delete:
        raise InvalidInput("delete", True, "only with --schedule")
    settings = settings_from_args(args)
    queue = args.queue  # None: the one the job's outcomes name
    with Scheduler(settings) as scheduler:  # it refuses a queue that does not exist
        result = scheduler.cancel(args.job_id, queue=queue, idempotency_key=args.idempotency_key)
    if args.json:
        print_json(result.to_json())
    else:
        print(result.message)
    return 0 if result.cancelled and result.found else 1


def _reschedule(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    due_of(args.at, args.delay, now_ms=wall_ms(), required=True)  # bad input before connecting
    with Scheduler(settings) as scheduler:
        result = scheduler.reschedule(
            args.job_id, run_at=args.at, delay=args.delay, queue=args.queue
        )
    if args.json:
        print_json(result.to_json())
    else:
        print(result.message)
    return 0 if result.rescheduled else 1


def _cancel_schedule(args: argparse.Namespace) -> int:
    from dueflow.apps.ops.cancel_schedule import cancel_schedule
    from dueflow.kafka.reading import ops_consumer

    settings = settings_from_args(args)
    consumer = ops_consumer(settings)
    try:
        with Scheduler(settings) as scheduler:
            result = cancel_schedule(
                settings, scheduler, consumer, args.schedule, delete=args.delete, now_ms=wall_ms()
            )
    finally:
        consumer.close()
    if args.json:
        print_json(result.to_json())
    else:
        pending = (
            f"; cancelled its pending occurrence {result.occurrence_job_id}"
            if result.occurrence_job_id
            else "; no occurrence was pending"
        )
        print(f"schedule {result.schedule_id} {result.action}{pending}")
    return 0
