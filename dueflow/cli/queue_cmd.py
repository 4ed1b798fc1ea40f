"""``dueflow queue pause|resume|list``: stop and restart a queue's workers taking work.

::

    dueflow queue pause billing --reason "payment provider down"
    dueflow queue list
    dueflow queue resume billing

A paused queue's workers start no job of it (running ones finish); they stay
in their consumer group with the queue's partitions paused. The emitter
keeps firing into the queue, so the due work waits in its exec topic and
runs after ``resume``.
"""

from __future__ import annotations

import argparse
from typing import Any

from dueflow.cli.common import add_global_options, format_table, print_json, settings_from_args
from dueflow.control import QueueControl
from dueflow.errors import InvalidInput
from dueflow.ops.control import operator_name, read_queue_controls, write_queue_control
from dueflow.ops.reading import ops_consumer
from dueflow.producers.core import wall_ms
from dueflow.timeutil import format_utc


def register(sub: Any) -> None:
    p = sub.add_parser("queue", help="pause, resume and list queues (workers stop taking work)")
    qsub = p.add_subparsers(dest="queue_command", metavar="ACTION")
    qsub.required = True
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
    lst = qsub.add_parser("list", help="the configured queues and which are paused")
    add_global_options(lst)
    lst.add_argument("--json", action="store_true", help="machine-readable output")
    lst.set_defaults(func=_list)


def _control(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    if args.queue not in settings.queue_names:
        raise InvalidInput(
            "queue", args.queue, f"one of the configured queues {settings.queue_names}"
        )
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
        print(f"queue {control.queue} {'paused' if control.paused else 'resumed'} by {control.by}")
    return 0


def _list(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    consumer = ops_consumer(settings)
    try:
        paused, problems = read_queue_controls(settings, consumer)
    finally:
        consumer.close()
    if args.json:
        print_json(
            {
                "queues": [
                    {
                        "queue": q,
                        "paused": q in paused,
                        **({"control": paused[q].to_json()} if q in paused else {}),
                    }
                    for q in settings.queue_names
                ],
                "problems": problems,
            }
        )
        return 0
    rows = []
    for q in settings.queue_names:
        c = paused.get(q)
        rows.append(
            [q, "paused" if c else "running"]
            + ([c.by, format_utc(c.at_ms), c.reason] if c else ["", "", ""])
        )
    print(format_table(["queue", "state", "by", "since", "reason"], rows))
    for line in problems:
        print(f"bad control record {line}")
    return 0
