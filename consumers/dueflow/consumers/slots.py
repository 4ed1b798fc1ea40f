"""The per-process concurrency bound, shared by every queue's runtime."""

from __future__ import annotations

import asyncio
from typing import Any


class Slots:
    """How many attempts may run at once in this process, and who waits for one."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.free = total
        self._waiting: list[Any] = []
        self._scheduled = False

    def wait(self, pump: Any) -> None:
        """Call ``pump`` when a slot frees."""
        if pump not in self._waiting:
            self._waiting.append(pump)

    def release(self) -> None:
        self.free += 1
        if self._waiting and not self._scheduled:
            self._scheduled = True
            asyncio.get_running_loop().call_soon(self._wake)

    def _wake(self) -> None:
        self._scheduled = False
        waiting, self._waiting = self._waiting, []
        for pump in waiting:
            pump()
