"""The wait queue's housekeeping: drop entries whose spawner stopped asking, and
dispatch after releases that did not go through admission (a reclaim's victims,
a lapsed reservation)."""

from __future__ import annotations

from ..core.queue import WaitQueue


class QueueJob:
    def __init__(self, queue: WaitQueue) -> None:
        self.queue = queue

    async def __call__(self) -> None:
        await self.queue.housekeeping.off_loop()
