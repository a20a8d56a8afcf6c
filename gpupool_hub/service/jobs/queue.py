"""The wait queue's housekeeping: drop entries whose spawner stopped asking, and
dispatch after releases that did not go through admission (a reclaim's victims,
a lapsed reservation)."""

from __future__ import annotations

from ..core.manager import PoolManager


class QueueJob:
    def __init__(self, manager: PoolManager) -> None:
        self.manager = manager

    async def __call__(self) -> None:
        await self.manager.threads.write(self.tick)

    def tick(self) -> None:
        queue = self.manager.queue
        if queue.entries:
            queue.expire()
            queue.dispatch()
