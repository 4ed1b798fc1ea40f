"""benchmarks/broker_probe.py: a broker's CPU by kind of thread, its requests by API."""

from __future__ import annotations

import os
import time

import pytest

from benchmarks.broker_probe import cpu_delta, request_rates, thread_cpu_s, thread_kind
from benchmarks.proc_cpu import stat_cpu_s


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        # as /proc/<pid>/task/<tid>/comm shows them: 15 characters at most
        ("data-plane-kafk", "requests"),
        ("C2 CompilerThre", "jit"),
        ("C1 CompilerThre", "jit"),
        ("GC Thread#1", "gc"),
        ("G1 Refine#0", "gc"),
        ("VM Thread", "gc"),
        ("group-coordinat", "group coordinator"),
        ("TxnMarkerSender", "transaction markers"),
        ("AddPartitionsTo", "transaction verification"),
        ("kafka-1-raft-io", "other"),
        ("java", "other"),
    ],
)
def test_thread_kind(name: str, kind: str) -> None:
    assert thread_kind(name) == kind


def test_cpu_delta_keeps_the_kinds_that_took_cpu() -> None:
    before = {"requests": 10.0, "jit": 5.0, "gc": 1.0}
    after = {"requests": 14.5, "jit": 5.0, "gc": 1.25, "other": 0.5}
    assert cpu_delta(before, after) == {"requests": 4.5, "gc": 0.25, "other": 0.5}


def test_request_rates_per_second_busiest_first_fetch_subkinds_not_added_twice() -> None:
    before = {"Produce": 1_000, "Fetch": 500, "FetchConsumer": 400, "EndTxn": 10}
    after = {"Produce": 3_000, "Fetch": 1_500, "FetchConsumer": 1_300, "EndTxn": 10, "Heartbeat": 4}
    rates = request_rates(before, after, 2.0)
    assert rates == {
        "total": 1_502.0,  # Produce 1000 + Fetch 500 + Heartbeat 2
        "Produce": 1_000.0,
        "Fetch": 500.0,
        "FetchConsumer": 450.0,
        "Heartbeat": 2.0,
    }
    assert list(rates)[1:] == ["Produce", "Fetch", "FetchConsumer", "Heartbeat"]


def test_request_rates_refuse_an_empty_window() -> None:
    with pytest.raises(ValueError, match="seconds must be > 0"):
        request_rates({}, {"Produce": 1}, 0.0)


def test_thread_cpu_s_sees_the_cpu_a_thread_spends() -> None:
    before = thread_cpu_s(os.getpid())
    spin_until = time.process_time() + 0.3
    while time.process_time() < spin_until:
        pass
    spent = cpu_delta(before, thread_cpu_s(os.getpid()))
    assert set(spent) <= {"requests", "jit", "gc", "group coordinator", "other"}
    assert sum(spent.values()) >= 0.2


def test_stat_cpu_s_counts_fields_after_a_name_with_spaces_and_parentheses() -> None:
    tick = os.sysconf("SC_CLK_TCK")
    # pid (comm) state ppid ... utime(14th) stime(15th): the name may hold ") ("
    stat = "42 (C2 Compiler) (x)) S 1 2 3 4 5 6 7 8 9 10 " + f"{3 * tick} {tick} 0 0"
    assert stat_cpu_s(stat) == 4.0
