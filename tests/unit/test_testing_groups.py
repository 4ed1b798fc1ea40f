"""Fan-in in the in-memory pipeline: the same owner and member code as the worker."""

from __future__ import annotations

import pytest

from dueflow import PermanentJobError, task
from dueflow.config import QueueSpec, Settings
from dueflow.errors import InvalidInput
from dueflow.group_model import GroupResults
from dueflow.testing import InMemoryPipeline

callbacks: list[GroupResults] = []


@task("resize", queue="images")
def resize(payload: dict[str, int], ctx: object) -> None:
    if payload["n"] % 5 == 4:
        raise PermanentJobError("not an image")


@task("tag")
def tag(payload: dict[str, int], ctx: object) -> None:
    return None


@task("album-ready")
def album_ready(payload: dict[str, int], ctx: object) -> None:
    group = ctx.group  # type: ignore[attr-defined]
    assert group is not None
    callbacks.append(group)


def _settings() -> Settings:
    return Settings(queues=(QueueSpec("default"), QueueSpec("images", partitions=3))).validate()


@pytest.fixture(autouse=True)
def _clean() -> None:
    callbacks.clear()


def test_the_callback_runs_once_with_every_members_state() -> None:
    with InMemoryPipeline([resize, tag, album_ready], settings=_settings()) as pipeline:
        s = pipeline.scheduler
        members = [{"task": "resize", "payload": {"n": i}} for i in range(10)]
        members += [{"task": "tag", "payload": {"n": i}, "delay": "1h"} for i in range(4)]
        group = s.group(members, then={"task": "album-ready", "payload": {"album": 7}})
        cancelled = group.member_ids[-1]
        assert s.cancel(cancelled).verdict == "cancelled"
        pipeline.run_until_idle()
        assert len(callbacks) == 1
        seen = callbacks[0]
        assert seen.group_id == group.group_id
        assert seen.size == 14
        states = seen.states()
        assert set(states) == set(group.member_ids)
        assert states[cancelled] == "cancelled"
        assert seen.count("dead") == 2  # n = 4 and 9
        assert seen.count("succeeded") == 11
        assert len(pipeline.runs(group.then_job_id)) == 1
        # Nothing is left of the group at the owner.
        pipeline.run_until_idle()
        assert len(callbacks) == 1


def test_a_callback_waits_for_its_last_member() -> None:
    with InMemoryPipeline([tag, album_ready], settings=_settings()) as pipeline:
        s = pipeline.scheduler
        group = s.group(
            [
                {"task": "tag", "payload": {"n": 1}},
                {"task": "tag", "payload": {"n": 2}, "delay": "2d"},
            ],
            then={"task": "album-ready", "payload": {}},
            group_id="album-7",
        )
        assert group.group_id == "album-7"
        pipeline.run_due()
        assert callbacks == []
        pipeline.run_until_idle()  # two days later
        assert [c.states() for c in callbacks] == [dict.fromkeys(group.member_ids, "succeeded")]


def test_bad_groups_are_refused_before_anything_is_written() -> None:
    with InMemoryPipeline([tag, album_ready], settings=_settings()) as pipeline:
        s = pipeline.scheduler
        then = {"task": "album-ready"}
        with pytest.raises(InvalidInput, match="members"):
            s.group([], then=then)
        twice = {"task": "tag", "job_id": "same"}
        with pytest.raises(InvalidInput, match="distinct job ids"):
            s.group([twice, twice], then=then)
        with pytest.raises(InvalidInput, match="max_lateness"):
            s.group([{"task": "tag", "max_lateness": "5m"}], then=then)
        with pytest.raises(InvalidInput, match="expires"):
            s.group([{"task": "tag"}], then={**then, "expires": "2030-01-01T00:00:00Z"})
        with pytest.raises(InvalidInput, match="group_id"):
            s.group([{"task": "tag"}], then=then, group_id="bad\nid")
        assert pipeline.pending() == []


@task("measure")
def measure(payload: dict[str, int], ctx: object) -> dict[str, int]:
    return {"n": payload["n"], "square": payload["n"] ** 2}


def test_the_callback_receives_each_members_result() -> None:
    with InMemoryPipeline([measure, album_ready], settings=_settings()) as pipeline:
        group = pipeline.scheduler.group(
            [{"task": "measure", "payload": {"n": i}} for i in range(5)],
            then={"task": "album-ready", "payload": {}},
        )
        pipeline.run_until_idle()
        (seen,) = callbacks
        results = {m.job_id: m.result for m in seen.members}
        assert set(results) == set(group.member_ids)
        assert sorted(r["square"] for r in results.values()) == [0, 1, 4, 9, 16]
        assert not seen.results_truncated
