"""``dueflow schedule``, ``reschedule``, ``update`` and ``cancel``: one job from the shell.

::

    dueflow schedule send_email --payload '{"to": "a@example.com"}' --delay 10m --json
    dueflow schedule report --payload @params.json --at 2030-01-01T09:00:00+01:00
    dueflow schedule reindex --payload '{"user": 42}' --unique-key reindex:42 --debounce 5s
    dueflow reschedule 0190f0c2a1b27c3d8e9f00112233aabb --delay 2h --wait 10s
    dueflow update 0190f0c2a1b27c3d8e9f00112233aabb --payload '{"to": "b@example.com"}'
    dueflow cancel 0190f0c2a1b27c3d8e9f00112233aabb --wait 10s

``--wait`` waits for the verdict of the worker that owns the job's partition
(a queue finalized with ``dueflow queue finalize``: its jobs are steered by
command, at any horizon).

Input is checked before connecting; bad input exits 2 with the message on
stderr and writes nothing.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import orjson

from dueflow.apps.cli.common import add_global_options, print_json, print_text, settings_from_args
from dueflow.apps.ops.cancel_schedule import cancel_schedule
from dueflow.control_chars import escape_text
from dueflow.errors import DuplicateJob, InvalidInput
from dueflow.kafka.reading import ops_consumer
from dueflow.producers.scheduler import Scheduler, declared_queues
from dueflow.producers.unique_calls import unique_options
from dueflow.records.job_request import (
    JobRequest,
    JobRules,
    check_name,
    deadline_of,
    due_of,
    prepare_job,
)
from dueflow.timeutil import format_utc, parse_duration, show_utc
from dueflow.wall_clock import wall_ms

PAYLOAD_HELP = "JSON text, or @PATH of a file holding JSON (default: null)"
WAIT_HELP = (
    "wait this long (e.g. 10s) for the verdict of the job's worker (a finalized queue; "
    "default: return once the command is written)"
)


def wait_of(text: str | None) -> float | None:
    """``--wait``: a duration (``10s``, ``1m``) as seconds, or None."""
    if text is None:
        return None
    return parse_duration(text, field="--wait") / 1000


def register(sub: Any) -> None:
    _register_schedule(sub)
    _register_cancel(sub)
    _register_reschedule(sub)
    _register_update(sub)


def _register_schedule(sub: Any) -> None:
    p = sub.add_parser("schedule", help="schedule one job (at a time, after a delay, or now)")
    _add_job_arguments(p)
    _add_run_rules(p)
    _add_unique_options(p)
    _add_output_options(p, _schedule)


def _add_job_arguments(p: argparse.ArgumentParser) -> None:
    """What runs, when and where: the task, its payload, due time, queue and ids."""
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


def _add_run_rules(p: argparse.ArgumentParser) -> None:
    """How the job runs: attempts, backoff, time limit, jitter and deadlines."""
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


def _add_unique_options(p: argparse.ArgumentParser) -> None:
    """Unique and debounced jobs: the key, how long it is held, what a duplicate does."""
    p.add_argument(
        "--unique-key",
        help="at most one job holds this key at a time (a finalized queue; "
        "docs/scheduling.md, Unique and debounced jobs)",
    )
    p.add_argument(
        "--unique-for",
        help="hold the key this long from the admission (e.g. 10m), whatever the job does "
        "(default: until the job ends, or starts with --unique-until start)",
    )
    p.add_argument(
        "--unique-until", choices=("end", "start"), help="without --unique-for: held until then"
    )
    p.add_argument(
        "--on-duplicate",
        choices=("return", "refuse", "replace"),
        help="while the key is held: print the holder's id (return, the default; exit 0), "
        "refuse (exit 1), or replace the holder's payload and due time if it has not started",
    )
    p.add_argument(
        "--debounce",
        help="due this long after the call (e.g. 5s); each call with the key before it "
        "starts replaces it",
    )
    p.add_argument(
        "--admission-wait",
        default="30s",
        help="wait this long for the key's worker to admit the job (default: 30s)",
    )


def _add_output_options(p: argparse.ArgumentParser, func: Any) -> None:
    """The options every command here ends with (connection, --json) and its handler."""
    add_global_options(p)
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=func)


def _register_cancel(sub: Any) -> None:
    c = sub.add_parser(
        "cancel",
        help="cancel a job (workers skip it if it has not run) or a cron schedule",
        description="`cancel JOB_ID` cancels one job: it is looked up by its outcomes first, "
        "and the cancellation goes to the queue and key they name, at any horizon on a queue "
        "finalized with `dueflow queue finalize` (--wait: wait for the verdict of the job's "
        "worker); exit 1 when the job has finished already, or was not found and --queue "
        "wrote it blind, or its worker refused it; `cancel --schedule ID` "
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
    c.add_argument("--wait", help=WAIT_HELP)
    _add_output_options(c, _cancel)


def _register_reschedule(sub: Any) -> None:
    r = sub.add_parser(
        "reschedule",
        help="move a pending job to another time (it never runs at the old one)",
        description="`reschedule JOB_ID --at T | --delay D` moves a job that has not started, "
        "at any horizon on a queue finalized with `dueflow queue finalize` (a command its "
        "worker applies; --wait: wait for its verdict), else with a new timer and a record "
        "that makes workers skip the old one (jobs due within the queue's idempotency "
        "retention). Exit 1 when it was not rescheduled (not found, started or finished, a "
        "cron occurrence, refused); the reason is printed.",
    )
    r.add_argument("job_id", help="the job id")
    rwhen = r.add_mutually_exclusive_group(required=True)
    rwhen.add_argument("--at", help="the new due time, ISO-8601 with an offset")
    rwhen.add_argument("--delay", help="the new due time from now: 30s, 5m, 1h30m, 2d")
    r.add_argument(
        "--queue", help="the job's queue (default: the one its outcomes name; as for cancel)"
    )
    r.add_argument("--wait", help=WAIT_HELP)
    _add_output_options(r, _reschedule)


def _register_update(sub: Any) -> None:
    u = sub.add_parser(
        "update",
        help="replace the payload of a pending job (it runs with the new one)",
        description="`update JOB_ID --payload JSON` replaces the payload of a job that has "
        "not started, at any horizon (--at/--delay: and moves it later). Only on a queue "
        "finalized with `dueflow queue finalize`. Exit 1 when it was not updated (not found, "
        "started or finished, a cron occurrence, refused by its worker); the reason is printed.",
    )
    u.add_argument("job_id", help="the job id")
    u.add_argument("--payload", required=True, help=PAYLOAD_HELP)
    uwhen = u.add_mutually_exclusive_group()
    uwhen.add_argument("--at", help="also move it to this due time (not earlier than it is)")
    uwhen.add_argument("--delay", help="also move it to this long from now")
    u.add_argument("--queue", help="the job's queue (default: the one its outcomes name)")
    u.add_argument("--wait", help=WAIT_HELP)
    _add_output_options(u, _update)


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
    unique = unique_options(
        unique_key=args.unique_key,
        unique_for=args.unique_for,
        unique_until=args.unique_until,
        on_duplicate=args.on_duplicate,
        debounce=args.debounce,
        timed=args.at is not None or args.delay is not None,
    )
    admission_wait = parse_duration(args.admission_wait, field="--admission-wait") / 1000
    if unique is not None and unique.delay_ms is not None:
        args.delay = f"{unique.delay_ms}ms"
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
    declared = declared_queues(app)
    rules = JobRules.from_settings(settings, declared=declared, known_tasks=declared or None)
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
    # Each call is a new process: a --job-id is looked up in the cluster, so that
    # one already scheduled with other content is refused (exit 2), not skipped.
    with Scheduler(settings, app=app, check_existing_ids=True) as scheduler:
        if unique is None:
            result = scheduler.schedule_request(req)
        else:
            try:
                result = scheduler.schedule_unique(req, unique.spec, wait=admission_wait)
            except DuplicateJob as exc:
                if args.json:
                    print_json({"scheduled": False, "first_job_id": exc.first_job_id})
                else:
                    print_text(f"not scheduled: {escape_text(str(exc))}")
                return 1
    if args.json:
        print_json(result.to_json())
    else:
        state = "already scheduled" if result.duplicate else "scheduled"
        if result.pending_admission:
            state = "sent for admission (no verdict yet):"
        elif unique is not None and result.duplicate:
            state = f"unique key {escape_text(unique.spec.key)} held by"
        expires = "" if result.expires_ms is None else f", expires {format_utc(result.expires_ms)}"
        due = show_utc(result.due_ms) if result.due_ms else "unknown"
        print_text(
            f"{state} job {escape_text(result.job_id)} due {due} "
            f"(queue {escape_text(result.queue)}, task {escape_text(result.task)}{expires})"
        )
    return 0


def _cancel(args: argparse.Namespace) -> int:
    if (args.job_id is None) == (args.schedule is None):
        raise InvalidInput("cancel", args.job_id or args.schedule, "a JOB_ID or --schedule ID")
    if args.schedule is not None:
        return _cancel_schedule(args)
    if args.delete:
        raise InvalidInput("delete", True, "only with --schedule")
    check_name("job_id", args.job_id)  # before connecting
    if args.idempotency_key is not None:
        check_name("idempotency_key", args.idempotency_key)
    settings = settings_from_args(args)
    queue = args.queue  # None: the one the job's outcomes name
    wait = wait_of(args.wait)
    with Scheduler(settings) as scheduler:  # it refuses a queue that does not exist
        result = scheduler.cancel(
            args.job_id, queue=queue, idempotency_key=args.idempotency_key, wait=wait
        )
    if args.json:
        print_json(result.to_json())
    else:
        print_text(escape_text(result.message))
    return 0 if result.cancelled and result.found else 1


def _reschedule(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    check_name("job_id", args.job_id)  # bad input before connecting
    due_of(args.at, args.delay, now_ms=wall_ms(), required=True)
    wait = wait_of(args.wait)
    with Scheduler(settings) as scheduler:
        result = scheduler.reschedule(
            args.job_id, run_at=args.at, delay=args.delay, queue=args.queue, wait=wait
        )
    if args.json:
        print_json(result.to_json())
    else:
        print_text(escape_text(result.message))
    return 0 if result.rescheduled else 1


def _update(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    check_name("job_id", args.job_id)  # bad input before connecting
    payload = read_payload(args.payload)
    if args.at is not None or args.delay is not None:
        due_of(args.at, args.delay, now_ms=wall_ms(), required=True)
    wait = wait_of(args.wait)
    with Scheduler(settings) as scheduler:
        result = scheduler.update(
            args.job_id,
            payload=payload,
            run_at=args.at,
            delay=args.delay,
            queue=args.queue,
            wait=wait,
        )
    if args.json:
        print_json(result.to_json())
    else:
        print_text(escape_text(result.message))
    return 0 if result.updated else 1


def _cancel_schedule(args: argparse.Namespace) -> int:
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
            f"; cancelled its pending occurrence {escape_text(result.occurrence_job_id)}"
            if result.occurrence_job_id
            else "; no occurrence was pending"
        )
        print_text(f"schedule {escape_text(result.schedule_id)} {result.action}{pending}")
    return 0
