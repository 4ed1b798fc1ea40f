"""``GET /jobs/{id}?wait_ms=``: requests waiting for a job's next change or its end,
answered by the fold as soon as the batch that changes the job is folded."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import Any

from dueflow.rules import job_state as state

WAIT_UNTIL = ("final", "change")  # what GET /jobs/{id}?wait_ms= waits for


class JobWaiters:
    """The waiting requests by job id; ``current`` reads a job's view now."""

    def __init__(self, current: Callable[[str], dict[str, Any] | None]) -> None:
        self._current = current
        # job id -> (what it waits for, its future)
        self.pending: dict[str, list[tuple[str, asyncio.Future[dict[str, Any] | None]]]] = {}

    def __bool__(self) -> bool:
        return bool(self.pending)

    async def wait(self, job_id: str, *, until: str, timeout_s: float) -> dict[str, Any] | None:
        """``job_id``'s view once it is final (``until="final"``: at once when it is
        already) or once it changes (``"change"``; a job unknown so far changes when
        its first outcome is folded), else after ``timeout_s`` as it is then."""
        if until not in WAIT_UNTIL:
            raise ValueError(f"until: one of {WAIT_UNTIL}, not {until!r}")
        view = self._current(job_id)
        if until == "final" and view is not None and view.get("state") in state.FINAL_STATES:
            return view
        fut: asyncio.Future[dict[str, Any] | None] = asyncio.get_running_loop().create_future()
        waiting = self.pending.setdefault(job_id, [])
        entry = (until, fut)
        waiting.append(entry)
        try:
            return await asyncio.wait_for(fut, timeout_s)
        except TimeoutError:
            return self._current(job_id)
        finally:
            waiting.remove(entry)
            if not waiting:
                self.pending.pop(job_id, None)

    def wake(self, changed: Mapping[str, tuple[int, dict[str, Any]]]) -> None:
        """Answer the waiters of the jobs a batch changed (job id -> (partition, view))."""
        for job_id, waiting in list(self.pending.items()):
            batched = changed.get(job_id)
            if batched is None:
                continue
            view = batched[1]
            final = view.get("state") in state.FINAL_STATES
            for until, fut in waiting:
                if not fut.done() and (until == "change" or final):
                    fut.set_result(dict(view))
