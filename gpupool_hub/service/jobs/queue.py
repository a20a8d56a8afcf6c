"""The wait queue's housekeeping: drop entries whose spawner stopped asking, and
dispatch after releases that did not go through admission (a reclaim's victims,
a lapsed reservation)."""

from __future__ import annotations

from ..core.queue import WaitQueue
from ..core.threads import CoreThreads


class QueueJob:
    def __init__(self, queue: WaitQueue, threads: CoreThreads) -> None:
        self.queue = queue
        self.threads = threads

    async def __call__(self) -> None:
        await self.threads.write(self.tick)

    def tick(self) -> None:
        queue = self.queue
        if queue.entries:
            queue.expire()
            queue.dispatch()
