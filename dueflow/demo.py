"""The main job of dueflow, end to end on a real broker (``make demo``).

For now: start the local broker (or use ``DUEFLOW_BOOTSTRAP``), ensure every
topic, and print the layout. Later steps grow this into the full pipeline.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from dueflow.broker.local import LocalBroker
from dueflow.cli.common import format_table
from dueflow.clients import make_admin
from dueflow.config import load_settings
from dueflow.topic_admin import TopicAdmin
from dueflow.topics import topic_layout


def main() -> int:
    external = os.environ.get("DUEFLOW_BOOTSTRAP")
    broker = None
    if not external:
        port = int(os.environ.get("DUEFLOW_DEMO_PORT", "39092"))
        broker = LocalBroker(port=port, state_dir=Path(".dueflow") / f"demo-broker-{port}")
        t0 = time.monotonic()
        pid, started = broker.start()
        print(
            f"local broker pid {pid} on {broker.bootstrap} "
            f"({'started in %.1fs' % (time.monotonic() - t0) if started else 'already running'})"
        )
    try:
        settings = load_settings(
            env=os.environ,
            overrides={"bootstrap": external or (broker.bootstrap if broker else None)},
        )
        admin = TopicAdmin(make_admin(settings), replication_factor=settings.replication_factor)
        specs = topic_layout(settings)
        report = admin.ensure(specs)
        print(f"topics: {len(report.created)} created, {len(report.unchanged)} already present")
        for diff in report.differences:
            print(str(diff))
        print(
            format_table(
                ["topic", "role", "partitions", "cleanup.policy"],
                [[s.name, s.role, s.partitions, s.config.get("cleanup.policy", "")] for s in specs],
            )
        )
        del admin  # close the client before the broker goes away
        return 0 if report.ok else 1
    finally:
        if broker is not None:
            broker.stop()
            print("local broker stopped")


if __name__ == "__main__":
    sys.exit(main())
