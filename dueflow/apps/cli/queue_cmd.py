"""``dueflow queue create|list|describe|pause|resume|finalize``: queues as data, and their state.

::

    dueflow queue create billing --partitions 12 --retry-tiers 1s,10s,60s --rate-limit 50
    dueflow queue list
    dueflow queue describe billing
    dueflow queue pause billing --reason "payment provider down"
    dueflow queue resume billing
    dueflow queue finalize billing          # or --all

``finalize`` switches clients to commands for cancelling, moving and updating
the queue's jobs at any horizon, once every live worker of the queue applies
them (:mod:`dueflow.apps.ops.finalize`; docs/operations.md, "Upgrading to
steerable jobs").

``create`` makes the queue's topics, then writes its spec to the queue
registry (``<prefix>.queues``); running producers, emitters and workers pick
it up without a restart (docs/queues.md). ``list`` and ``describe`` show the
static queues of the settings and the registered ones, merged (the registry
wins; a difference is shown as a conflict).

A paused queue's workers start no job of it (running ones finish); they stay
in their consumer group with the queue's partitions paused. The emitter
keeps firing into the queue, so the due work waits in its exec topic and
runs after ``resume``.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from typing import Any

from dueflow.apps.cli.common import (
    add_global_options,
    format_table,
    print_json,
    print_text,
    settings_from_args,
)
from dueflow.apps.ops.finalize import Finalized, FinalizeRefused, finalize_queue
from dueflow.apps.ops.queue_admin import create_queue, describe_topics
from dueflow.config import QueueSpec, Settings, validate_queue
from dueflow.control_chars import escape_text
from dueflow.errors import ConfigError, InvalidInput, TopicMismatch, UnknownQueue
from dueflow.kafka.features import read_queue_features
from dueflow.kafka.pausing import operator_name, read_queue_controls, write_queue_control
from dueflow.kafka.queue_reader import QueueRegistryReader, read_registry
from dueflow.kafka.reading import ops_consumer
from dueflow.kafka.topics import names, tier_label
from dueflow.records.features import QueueFeatures
from dueflow.records.pause_command import QueueControl
from dueflow.records.queue_registry import spec_json
from dueflow.timeutil import parse_duration, show_utc
from dueflow.wall_clock import wall_ms

# QueueSpec field -> the `queue create` option that sets it
_OPTIONS = {
    "name": "NAME",
    "partitions": "--partitions",
    "retry_tiers_ms": "--retry-tiers",
    "rate_limit_per_s": "--rate-limit",
    "idempotency_retention_ms": "--idempotency-retention",
}


def register(sub: Any) -> None:
    p = sub.add_parser(
        "queue", help="create, list and describe queues; pause and resume their workers"
    )
    qsub = p.add_subparsers(dest="queue_command", metavar="ACTION")
    qsub.required = True
    create = qsub.add_parser(
        "create",
        help="create a queue's topics, then register it (running processes pick it up)",
    )
    create.add_argument("name", help="queue name: 1-100 of [A-Za-z0-9_-]")
    create.add_argument(
        "--partitions",
        type=int,
        required=True,
        help="partitions of each of its topics: the most workers that share its work "
        "(it cannot change later)",
    )
    create.add_argument(
        "--retry-tiers", help="retry delays, increasing, e.g. 1s,10s,60s (default: 1s,10s,1m)"
    )
    create.add_argument("--rate-limit", type=float, help="jobs per second across its workers")
    create.add_argument(
        "--idempotency-retention", help="how long finished jobs are remembered (default: 7d)"
    )
    create.add_argument("--by", help="who (default: $DUEFLOW_OPERATOR or user@host)")
    add_global_options(create)
    create.add_argument("--json", action="store_true", help="machine-readable output")
    create.set_defaults(func=_create)
    describe = qsub.add_parser(
        "describe", help="a queue's spec, where it comes from, and its topics on the cluster"
    )
    describe.add_argument("name", help="queue name")
    add_global_options(describe)
    describe.add_argument("--json", action="store_true", help="machine-readable output")
    describe.set_defaults(func=_describe)
    for name, paused, help_ in (
        ("pause", True, "workers stop starting jobs of the queue (the emitter keeps firing)"),
        ("resume", False, "workers take work from the queue again"),
    ):
        sp = qsub.add_parser(name, help=help_)
        sp.add_argument("queue", help="queue name")
        sp.add_argument("--reason", default="", help="why (shown by `queue list` and the logs)")
        sp.add_argument("--by", help="who (default: $DUEFLOW_OPERATOR or user@host)")
        add_global_options(sp)
        sp.add_argument("--json", action="store_true", help="machine-readable output")
        sp.set_defaults(func=_control, paused=paused)
    fin = qsub.add_parser(
        "finalize",
        help="steer the queue's jobs with commands (any horizon) once every worker of it "
        "can; one-way",
    )
    fin.add_argument("queue", nargs="?", help="queue name (or --all)")
    fin.add_argument("--all", action="store_true", help="every queue (static and registered)")
    fin.add_argument("--by", help="who (default: $DUEFLOW_OPERATOR or user@host)")
    add_global_options(fin)
    fin.add_argument("--json", action="store_true", help="machine-readable output")
    fin.set_defaults(func=_finalize)
    lst = qsub.add_parser("list", help="the queues (static and registered) and which are paused")
    add_global_options(lst)
    lst.add_argument("--json", action="store_true", help="machine-readable output")
    lst.set_defaults(func=_list)


def _control(args: argparse.Namespace) -> int:
    settings = _merged(settings_from_args(args))[0]
    if args.queue not in settings.queue_names:
        raise UnknownQueue(args.queue, settings.queue_names)
    control = QueueControl(
        args.queue,
        paused=args.paused,
        by=args.by or operator_name(),
        at_ms=wall_ms(),
        reason=args.reason,
    )
    write_queue_control(settings, control)
    if args.json:
        print_json(control.to_json())
    else:
        state = "paused" if control.paused else "resumed"
        print_text(f"queue {control.queue} {state} by {escape_text(control.by)}")
    return 0


def _finalize(args: argparse.Namespace) -> int:
    if args.all == (args.queue is not None):  # bad input before connecting
        raise InvalidInput("queue", args.queue, "a queue name, or --all (not both)")
    settings = _merged(settings_from_args(args))[0]
    queues = settings.queue_names if args.all else [args.queue]
    for q in queues:
        if q not in settings.queue_names:
            raise UnknownQueue(q, settings.queue_names)
    by = args.by or operator_name()
    done: list[Finalized] = []
    refused: list[FinalizeRefused] = []
    for q in queues:
        try:
            done.append(finalize_queue(settings, q, by=by, now_ms=wall_ms()))
        except FinalizeRefused as exc:
            refused.append(exc)
    if args.json:
        print_json(
            {
                "finalized": [f.to_json() for f in done],
                "refused": [{"queue": r.queue, "members": r.members} for r in refused],
            }
        )
    else:
        for f in done:
            what = "finalized" if f.written else "was finalized already"
            workers = f"{len(f.workers)} live worker(s) checked" if f.workers else "no live worker"
            print_text(f"queue {f.queue} {what}: its jobs are steered with commands ({workers})")
        for r in refused:
            print(f"dueflow: {escape_text(str(r))}", file=sys.stderr)
    return 1 if refused else 0


def _merged(settings: Settings) -> tuple[Settings, QueueRegistryReader]:
    """Settings whose queues are static + registered (registry wins), and the reader."""
    reader = read_registry(settings)
    merged = dataclasses.replace(settings, queues=tuple(reader.view.specs.values()))
    return merged, reader


def _features(settings: Settings) -> dict[str, QueueFeatures]:
    """Every queue's features (finalized or not): none when there is no control topic."""
    consumer = ops_consumer(settings)
    try:
        return read_queue_features(settings, consumer)[0]
    except InvalidInput:
        return {}
    finally:
        consumer.close()


def _paused(settings: Settings) -> tuple[dict[str, QueueControl], list[str], list[str]]:
    """The paused queues, the bad control records, and notes (no control topic yet:
    nothing was ever paused)."""
    consumer = ops_consumer(settings)
    try:
        paused, problems = read_queue_controls(settings, consumer)
        return paused, problems, []
    except InvalidInput:
        topic = names(settings).control
        return {}, [], [f"the control topic {topic} does not exist: no queue is paused"]
    finally:
        consumer.close()


def _tiers(spec: QueueSpec) -> str:
    return ",".join(tier_label(t) for t in spec.retry_tiers_ms)


def _registry_problems(reader: QueueRegistryReader) -> list[str]:
    out = [f"bad queue registry record {b.partition}:{b.offset}: {b.reason}" for b in reader.bad]
    if reader.missing:
        out.append(
            f"the queue registry topic {reader.topic} does not exist: only static queues "
            "are shown (create it with `dueflow topics ensure` or `dueflow queue create`)"
        )
    return out


def _list(args: argparse.Namespace) -> int:
    settings, reader = _merged(settings_from_args(args))
    view = reader.view
    paused, problems, notes = _paused(settings)
    registry_problems = _registry_problems(reader) + notes
    conflicts = [str(c) for c in view.conflicts]
    if args.json:
        print_json(
            {
                "queues": [
                    {
                        "queue": q.name,
                        "paused": q.name in paused,
                        **({"control": paused[q.name].to_json()} if q.name in paused else {}),
                        "source": view.sources.get(q.name, "static"),
                        **spec_json(q),
                    }
                    for q in settings.queues
                ],
                "problems": problems,
                "registry_problems": registry_problems,
                "conflicts": conflicts,
            }
        )
        return 0
    rows = []
    for q in settings.queues:
        c = paused.get(q.name)
        rows.append(
            [
                q.name,
                q.partitions,
                _tiers(q),
                q.rate_limit_per_s if q.rate_limit_per_s is not None else "",
                view.sources.get(q.name, "static"),
                "paused" if c else "running",
            ]
            + ([c.by, show_utc(c.at_ms), c.reason] if c else ["", "", ""])
        )
    headers = ["queue", "partitions", "retry tiers", "rate/s", "source", "state", "by", "since"]
    print_text(format_table([*headers, "reason"], rows))
    for line in problems:
        print_text(f"bad control record {escape_text(line)}")
    for line in [*registry_problems, *conflicts]:
        print_text(escape_text(line))
    return 0


def _create(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    spec = QueueSpec(args.name, args.partitions)
    changes: dict[str, Any] = {}
    if args.retry_tiers is not None:
        tiers = [t.strip() for t in args.retry_tiers.split(",") if t.strip()]
        changes["retry_tiers_ms"] = tuple(parse_duration(t, field="--retry-tiers") for t in tiers)
    if args.rate_limit is not None:
        changes["rate_limit_per_s"] = args.rate_limit
    if args.idempotency_retention is not None:
        changes["idempotency_retention_ms"] = parse_duration(
            args.idempotency_retention, field="--idempotency-retention"
        )
    spec = dataclasses.replace(spec, **changes)
    try:
        validate_queue(spec, "queue")
    except ConfigError as exc:  # named as the option that set it
        field = exc.setting.rpartition(".")[2]
        raise InvalidInput(_OPTIONS.get(field, field), exc.value, exc.accepted) from None
    try:
        result = create_queue(settings, spec, by=args.by or operator_name(), now_ms=wall_ms())
    except TopicMismatch as exc:  # as `topics ensure`: reported, nothing changed, exit 1
        print(f"dueflow: {exc}", file=sys.stderr)
        print("dueflow did not change or delete any existing topic; fix them by hand.")
        return 1
    if args.json:
        print_json(result.to_json())
        return 0
    for name in result.topics_created:
        print(f"created  {name}")
    verb = "registered" if result.registered else "already registered with this spec"
    print(
        f"queue {spec.name} {verb}: {spec.partitions} partitions, retry tiers {_tiers(spec)}"
        + (f", {spec.rate_limit_per_s}/s" if spec.rate_limit_per_s is not None else "")
    )
    for note in result.notes:
        print_text(escape_text(note))
    for conflict in result.static_conflicts:
        print_text(f"warning: {escape_text(conflict)}")
    return 0


def _describe(args: argparse.Namespace) -> int:
    settings, reader = _merged(settings_from_args(args))
    view = reader.view
    spec = view.get(args.name)
    if spec is None:
        raise UnknownQueue(args.name, view.names)
    registered = reader.catalog.registered.get(args.name)
    topics = describe_topics(settings, spec)
    paused, _problems, _notes = _paused(settings)
    features = _features(settings).get(spec.name)
    finalized = features is not None and features.steerable
    conflicts = [str(c) for c in view.conflicts if c.queue == spec.name]
    rows: list[dict[str, Any]] = [
        {
            "topic": t.name,
            "role": t.role,
            "partitions": t.partitions,
            "actual_partitions": st.partitions,
            "status": (
                "missing"
                if st.partitions is None
                else ("ok" if st.partitions == t.partitions else "MISMATCH")
            ),
        }
        for t, st in topics
    ]
    source = view.sources.get(spec.name, "static")
    if args.json:
        print_json(
            {
                "queue": spec.name,
                "source": source,
                "spec": spec_json(spec),
                "registered": registered.to_json() if registered is not None else None,
                "paused": spec.name in paused,
                "finalized": features.to_json() if finalized and features else None,
                "topics": rows,
                "conflicts": conflicts,
            }
        )
        return 0
    print(f"queue        {spec.name} ({source})")
    print(f"partitions   {spec.partitions}")
    print(f"retry tiers  {_tiers(spec)}")
    print(f"rate limit   {spec.rate_limit_per_s if spec.rate_limit_per_s else 'none'}")
    print(f"idempotency  finished jobs kept {tier_label(spec.idempotency_retention_ms)}")
    if registered is not None:
        by = escape_text(registered.created_by)
        print_text(f"registered   {show_utc(registered.created_ms)} by {by}")
    print(f"state        {'paused' if spec.name in paused else 'running'}")
    if finalized and features is not None:
        by = escape_text(features.by)
        when = show_utc(features.at_ms)
        print_text(f"steering     commands, any horizon (finalized {when} by {by})")
    else:
        print(f"steering     legacy records (`dueflow queue finalize {spec.name}` when ready)")
    print()
    print_text(
        format_table(
            ["topic", "role", "partitions", "on the cluster", "status"],
            [
                [
                    r["topic"],
                    r["role"],
                    r["partitions"],
                    "-" if r["actual_partitions"] is None else r["actual_partitions"],
                    r["status"],
                ]
                for r in rows
            ],
        )
    )
    for line in conflicts:
        print_text(f"conflict: {escape_text(line)}")
    return 0
