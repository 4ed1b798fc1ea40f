"""Tests that must not run beside one another under ``make test`` (two xdist
workers): each group runs on one worker, one test after the other.

pytest-xdist's own ``--dist loadgroup`` does this for tests marked
``xdist_group``, but with pytest 9 its marks no longer reach the scheduler
(it renames ``item._nodeid``, which pytest 9 no longer reads): the chaos runs
went side by side, and so did the two demo tests, whose brokers raced for the
demo's port. So the groups are named here by path, where the scheduler sees
them (a test id is all it has).
"""

from __future__ import annotations

from typing import Any

SERIAL_GROUPS: dict[str, tuple[str, ...]] = {
    # the chaos runs: each loads both cores on its own
    "chaos": ("tests/chaos/test_chaos.py::", "tests/chaos/test_chaos_cluster.py::"),
    # the demos prefer the same broker port
    "demo": ("tests/integration/test_demo.py::",),
    # the upgrades and the rollback: each runs ten processes of two releases
    "upgrade": (
        "tests/integration/test_upgrade.py::",
        "tests/integration/test_upgrade_steering.py::",
    ),
}


def group_of(nodeid: str) -> str:
    """The scheduling unit of a test: its serial group, else the test itself."""
    for group, prefixes in SERIAL_GROUPS.items():
        if nodeid.startswith(prefixes):
            return group
    return nodeid


def make_scheduler(config: Any, log: Any) -> Any:
    """An xdist scheduler that sends each serial group to one worker."""
    from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

    class SerialGroups(LoadScopeScheduling):  # type: ignore[misc]
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    return SerialGroups(config, log)
