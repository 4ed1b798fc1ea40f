"""``dueflow topics ensure|describe``: the topic layout as code.

The queues are the static ones of the settings and those of the queue
registry, merged (the registry wins: its queues' topics were created with its
specs), so ``ensure`` also restores a registered queue's missing topics.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

from dueflow.apps.cli.common import add_global_options, format_table, print_json, settings_from_args
from dueflow.config import Settings
from dueflow.kafka.clients import make_admin
from dueflow.kafka.queue_reader import read_registry
from dueflow.kafka.topic_admin import TopicAdmin, compare
from dueflow.kafka.topics import names, registry_topic, topic_layout


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


def _with_registry(settings: Settings) -> tuple[Settings, list[str]]:
    """``settings`` with the registered queues merged in, and the conflicts."""
    view = read_registry(settings).view
    merged = dataclasses.replace(settings, queues=tuple(view.specs.values()))
    return merged, [str(c) for c in view.conflicts]


def _ensure(args: argparse.Namespace) -> int:
    admin, settings = _admin(args)
    # The registry first (so it can be read), then everything, registered queues too.
    isr = {"min.insync.replicas": str(settings.min_insync_replicas)}
    registry = admin.ensure([registry_topic(names(settings), isr)])
    settings, conflicts = _with_registry(settings)
    report = admin.ensure(topic_layout(settings))
    report.created[:0] = registry.created
    report.unchanged = [t for t in report.unchanged if t not in registry.created]
    if args.json:
        print_json(
            {
                "ok": report.ok,
                "conflicts": conflicts,
                "created": report.created,
                "grown": report.grown,
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
        for name in report.grown:
            print(f"grown    {name} (partitions added for wheel.shards)")
        print(
            f"{len(report.unchanged)} topics already as needed, {len(report.created)} created"
            + (f", {len(report.grown)} grown" if report.grown else "")
        )
        for diff in report.differences:
            print(str(diff))
        for conflict in conflicts:
            print(f"note: {conflict}")
    if not report.ok:
        print("dueflow did not change or delete any existing topic; fix them by hand.")
        return 1
    return 0


def _describe(args: argparse.Namespace) -> int:
    admin, settings = _admin(args)
    settings, _conflicts = _with_registry(settings)
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
            + (
                f"; {geo.shards} shards of {geo.shard_partitions} partitions"
                if geo.shards > 1
                else ""
            )
        )
    return 0
