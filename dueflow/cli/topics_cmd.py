"""``dueflow topics ensure|describe``: the topic layout as code."""

from __future__ import annotations

import argparse
from typing import Any

from dueflow.cli.common import add_global_options, format_table, print_json, settings_from_args
from dueflow.clients import make_admin
from dueflow.topic_admin import TopicAdmin, compare
from dueflow.topics import topic_layout


def register(sub: Any) -> None:
    p = sub.add_parser("topics", help="create or check dueflow's topics")
    tsub = p.add_subparsers(dest="topics_command", metavar="ACTION")
    tsub.required = True
    ensure = tsub.add_parser(
        "ensure", help="create missing topics; report (never change) mismatched ones"
    )
    describe = tsub.add_parser("describe", help="print the layout and what the cluster has")
    for sp, func in ((ensure, _ensure), (describe, _describe)):
        add_global_options(sp)
        sp.add_argument("--json", action="store_true", help="machine-readable output")
        sp.set_defaults(func=func)


def _admin(args: argparse.Namespace) -> tuple[TopicAdmin, Any]:
    settings = settings_from_args(args)
    admin = TopicAdmin(make_admin(settings), replication_factor=settings.replication_factor)
    return admin, settings


def _ensure(args: argparse.Namespace) -> int:
    admin, settings = _admin(args)
    report = admin.ensure(topic_layout(settings))
    if args.json:
        print_json(
            {
                "ok": report.ok,
                "created": report.created,
                "unchanged": report.unchanged,
                "differences": [
                    {
                        "topic": d.topic,
                        "what": d.what,
                        "expected": d.expected,
                        "actual": d.actual,
                        "critical": d.critical,
                    }
                    for d in report.differences
                ],
            }
        )
    else:
        for name in report.created:
            print(f"created  {name}")
        print(f"{len(report.unchanged)} topics already as needed, {len(report.created)} created")
        for diff in report.differences:
            print(str(diff))
    if not report.ok:
        print("dueflow did not change or delete any existing topic; fix them by hand.")
        return 1
    return 0


def _describe(args: argparse.Namespace) -> int:
    admin, settings = _admin(args)
    specs = topic_layout(settings)
    states = {s.name: s for s in admin.describe(specs)}
    rows = []
    out = []
    for spec in specs:
        st = states[spec.name]
        diffs = compare(spec, st) if st.partitions is not None else []
        status = "missing" if st.partitions is None else ("MISMATCH" if diffs else "ok")
        rows.append(
            [
                spec.name,
                spec.role,
                spec.queue or "",
                spec.partitions,
                spec.config.get("cleanup.policy", ""),
                spec.config.get("retention.ms", "default"),
                status,
            ]
        )
        out.append(
            {
                "topic": spec.name,
                "role": spec.role,
                "queue": spec.queue,
                "partitions": spec.partitions,
                "actual_partitions": st.partitions,
                "config": dict(spec.config),
                "status": status,
                "differences": [str(d) for d in diffs],
            }
        )
    if args.json:
        print_json(out)
    else:
        print(
            format_table(
                ["topic", "role", "queue", "partitions", "cleanup", "retention.ms", "status"],
                rows,
            )
        )
        geo = settings.wheel
        print(
            f"\ntimer wheel: {geo.near_partitions} near partitions (window "
            f"{geo.near_window_ms} ms), levels "
            + ", ".join(f"{lv.slots}x{lv.width_ms}ms" for lv in geo.levels)
            + f", lookahead {geo.lookahead_ms} ms"
        )
    return 0
