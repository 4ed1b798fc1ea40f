from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dueflow.errors import ConflictError
from dueflow.producers.recent import Entry, RecentJobs


def entry(content_hash: str = "h1", due_ms: int = 5) -> Entry:
    return (content_hash, due_ms, "default", "send_email", "key", 3)


def test_first_claim_writes_then_same_content_is_a_duplicate() -> None:
    r = RecentJobs()
    assert r.claim("j", entry(), "send_email") is None
    again = r.claim("j", entry(due_ms=999), "send_email")  # same content, later call
    assert again is not None
    assert again.duplicate
    assert (again.job_id, again.due_ms, again.partition) == ("j", 5, 3)  # the first result
    assert r.get("j") == again


def test_other_content_is_a_conflict_naming_the_job_id() -> None:
    r = RecentJobs()
    r.claim("j", entry("h1"), "send_email")
    with pytest.raises(ConflictError, match="job_id 'j' was already scheduled") as info:
        r.claim("j", entry("h2"), "charge")
    assert "charge" in str(info.value)
    assert "same task and payload" in str(info.value)


def test_forget_lets_a_failed_write_be_retried() -> None:
    r = RecentJobs()
    r.claim("j", entry("h1"), "t")
    r.forget("j")
    assert r.get("j") is None
    assert r.claim("j", entry("h2"), "t") is None


def test_memory_is_bounded_and_keeps_recent_ids() -> None:
    r = RecentJobs(capacity=100)
    for i in range(1_000):
        r.claim(f"j{i}", entry(), "t")
        assert len(r) <= 100
    assert all(r.get(f"j{i}") is not None for i in range(950, 1_000))  # the last half
    assert r.get("j0") is None


def test_an_old_hit_is_kept_alive() -> None:
    r = RecentJobs(capacity=10)
    r.claim("keep", entry(), "t")
    for i in range(100):
        assert r.get("keep") is not None
        r.claim(f"j{i}", entry(), "t")


def test_capacity_zero_remembers_nothing() -> None:
    r = RecentJobs(capacity=0)
    assert r.claim("j", entry(), "t") is None
    assert r.claim("j", entry("other"), "t") is None
    assert len(r) == 0


@pytest.mark.parametrize("batch", [1, 7, 50, 333])
def test_remember_in_batches_equals_claiming_one_by_one(batch: int) -> None:
    claimed, remembered = RecentJobs(capacity=100), RecentJobs(capacity=100)
    entries = [(f"j{i}", entry(f"h{i}", i)) for i in range(1_000)]
    for job_id, e in entries:
        claimed.claim(job_id, e, "t")
    for start in range(0, len(entries), batch):
        ids, values = zip(*entries[start : start + batch], strict=True)
        remembered.remember(list(ids), list(values))
        assert len(remembered) <= 100
    assert remembered._young == claimed._young
    assert remembered._old == claimed._old
    assert remembered.get("j999") == claimed.get("j999")
    with pytest.raises(ConflictError):
        remembered.claim("j999", entry("other"), "t")


def test_remember_with_capacity_zero_keeps_nothing() -> None:
    r = RecentJobs(capacity=0)
    r.remember(["j"], [entry()])
    assert len(r) == 0


# One step against the memory: remember n new jobs at once, or claim / get /
# move / forget the i-th job seen so far (or a new one for claim).
STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("remember"), st.integers(0, 25)),
        st.tuples(st.sampled_from(["claim", "get", "move", "forget"]), st.integers(0, 200)),
    ),
    max_size=60,
)


@settings(max_examples=1000)
@given(capacity=st.integers(1, 12), steps=STEPS)
def test_remembering_in_batches_answers_as_claiming_one_by_one(
    capacity: int, steps: list[tuple[str, int]]
) -> None:
    # remember() defers its inserts and drops those a later insert would drop
    # again: every answer, and what is kept, equals claiming each job at once
    lazy, eager = RecentJobs(capacity), RecentJobs(capacity)
    seen: list[str] = []
    for kind, n in steps:
        if kind == "remember":
            ids = [f"j{len(seen) + i}" for i in range(n)]
            entries = [entry(f"h{len(seen) + i}", len(seen) + i) for i in range(n)]
            seen.extend(ids)
            lazy.remember(ids, entries)
            for job_id, e in zip(ids, entries, strict=True):
                assert eager.claim(job_id, e, "t") is None
            continue
        job_id = seen[n % len(seen)] if seen and (kind != "claim" or n % 3) else f"n{n}"
        if kind == "claim":
            e = entry("h-" + job_id, n)
            answers = []
            for r in (lazy, eager):
                try:
                    answers.append(r.claim(job_id, e, "t"))
                except ConflictError as exc:
                    answers.append(str(exc))  # type: ignore[arg-type]
            assert answers[0] == answers[1]
            seen.append(job_id)
        elif kind == "get":
            assert lazy.get(job_id) == eager.get(job_id)
        elif kind == "move":
            lazy.move(job_id, n, 1)
            eager.move(job_id, n, 1)
        else:
            lazy.forget(job_id)
            eager.forget(job_id)
    assert len(lazy) == len(eager) <= capacity
    assert (lazy._young, lazy._old) == (eager._young, eager._old)


def test_a_long_run_of_remembered_jobs_is_held_bounded() -> None:
    r = RecentJobs(capacity=100)
    for start in range(0, 10_000, 10):
        r.remember([f"j{i}" for i in range(start, start + 10)], [entry()] * 10)
        assert len(r._pending_ids) < 3 * 50  # dropped as they are overtaken
    assert len(r) == 50  # 10,000 jobs end a generation: the young one is empty
    assert r.get("j9999") is not None
    assert r.get("j9950") is not None
    assert r.get("j9949") is None
