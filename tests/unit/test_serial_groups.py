"""make test's serial groups: the chaos runs on one worker, the demos on one, the
upgrade tests on one."""

from __future__ import annotations

from pathlib import Path

from tests.support.serial import SERIAL_GROUPS, group_of

ROOT = Path(__file__).resolve().parents[2]


def test_the_chaos_runs_and_the_demos_are_grouped() -> None:
    assert group_of("tests/chaos/test_chaos.py::test_x") == "chaos"
    assert group_of("tests/chaos/test_chaos_cluster.py::test_y[1]") == "chaos"
    assert group_of("tests/integration/test_demo.py::test_ctrl_c") == "demo"
    assert group_of("tests/integration/test_upgrade.py::test_rolling_back") == "upgrade"
    assert group_of("tests/integration/test_upgrade_steering.py::test_u") == "upgrade"
    assert group_of("tests/unit/test_x.py::test_z") == "tests/unit/test_x.py::test_z"
    assert group_of("tests/chaos/test_skew.py::test_s") == "tests/chaos/test_skew.py::test_s"


def test_every_grouped_file_exists() -> None:
    for prefixes in SERIAL_GROUPS.values():
        for prefix in prefixes:
            assert (ROOT / prefix.removesuffix("::")).is_file(), prefix
