"""The spawn's wait for GPUs: ask the pool, and while it says asking again will help
(a reclaim in progress, a place in the wait queue), say so on the progress page and
ask again, until the pool answers, the hub cancels the spawn, or the wait's limit
(``waiting.queue_wait_limit``) ends it with the pool's own message.

A half of :class:`~gpupool_hub.spawner.base.GPUPoolSpawner`, as :mod:`.release`
is the other: it uses the spawner's client, progress log and profile.
"""

from __future__ import annotations

import asyncio
from datetime import datetime, timezone
from typing import Any

from ..profiles import Profile
from ..reasons import RefusalReason
from .client import ServiceError, ServiceUnavailable
from .errors import GPUPoolRefused, SpawnFailure
from .release import GPUPoolReleases
from .waiting import gave_up_waiting, hub_answered_at, queue_wait_limit, service_away

# a reclaim wait ends this long before the hub's start_timeout, so the spawn fails with a message
START_MARGIN = 5.0


class GPUPoolWaits(GPUPoolReleases):
    async def gpupool_allocate(self, profile: Profile, gpus: int) -> dict[str, Any]:
        """Ask the pool for ``gpus`` of ``profile``: the allocation, or :class:`GPUPoolRefused`."""
        return await self.gpupool_client.allocate(
            self.user.name, self.name or "", self._groups(), profile.request(gpus), profile.describe(gpus),
            key=self.gpupool_attempt_key,
        )

    async def _gpupool_allocate_waiting(self, profile: Profile, gpus: int) -> dict[str, Any]:
        """Allocate; while the pool says asking again will help (a reclaim in progress, a
        place in the wait queue), say so on the progress page and retry.

        A spawn that ends while it waits for a reclaim cancels that reclaim, so no
        borrowed server is stopped for nobody; one the hub cancels (the user stopped
        it) gives up its place in the queue at once, so that it no longer counts
        against ``max_waiting_per_user``; a spawn whose retries stop loses its
        place in the queue (the service drops it) and says where it was. The wait
        ends, with a message, before the hub's ``start_timeout`` would."""
        loop = asyncio.get_event_loop()
        started = loop.time()
        hub_gives_up = started + max(self.start_timeout - START_MARGIN, 0)
        answered = hub_answered_at(getattr(self, "handler", None), started)
        queued: GPUPoolRefused | None = None  # the last place in the queue this spawn was told
        waited_for_reclaim = False
        self._gpupool_waiting = True
        try:
            while True:
                try:
                    return await self.gpupool_allocate(profile, gpus)
                except GPUPoolRefused as e:
                    if queued is not None and e.reason == SpawnFailure.UNREACHABLE.value:
                        e = service_away(queued)  # restarting: the queue keeps the place meanwhile
                    elif e.refusal is RefusalReason.QUEUED:
                        queued = e
                    waited_for_reclaim = waited_for_reclaim or e.refusal is RefusalReason.RECLAIMING
                    give_up = started + queue_wait_limit(e, self.reclaim_wait, self.start_timeout)
                    if not self._gpupool_waiting:  # stopped (stop() left the queue) while this request ran
                        raise await self._gpupool_stopped_waiting(queued is not None) from None
                    if not e.retryable or loop.time() >= give_up:
                        if e.refusal is RefusalReason.QUEUED:  # the place lapses once the retries stop
                            raise gave_up_waiting(e, loop.time() - started) from None
                        raise
                    delay = _retry_delay(e.retry_at)
                    if e.refusal is RefusalReason.RECLAIMING and loop.time() + delay >= hub_gives_up:
                        msg = (f"{e.message} That is after this hub's start timeout ({self.start_timeout:g} s), "
                               "so this spawn gives up now; try again later. The borrowed servers keep running. "
                               "An admin can raise c.Spawner.start_timeout above c.GPUPool.preempt_grace.")
                        raise GPUPoolRefused(msg, reason=SpawnFailure.START_TIMEOUT, status_code=409) from None
                    wait = min(max(delay, 0.5), 10.0, max(give_up - loop.time(), 0.5))
                    title = e.refusal.title if e.refusal else "Waiting"
                    self._gpupool_progress.add(20, f"{title}: {e.message}")
                    self._gpupool_queued = queued is not None and loop.time() >= answered
                    await asyncio.sleep(wait)
                    if not self._gpupool_waiting:  # stopped while it slept: asking again would queue it anew
                        raise await self._gpupool_stopped_waiting(False)
        except BaseException as e:
            if waited_for_reclaim:
                await self._gpupool_cancel_reclaim()
            if queued is not None and isinstance(e, asyncio.CancelledError):
                await self.gpupool_leave_queue()  # the hub stopped the pending spawn: the place is free now
            raise
        finally:
            self._gpupool_waiting = self._gpupool_queued = False

    async def _gpupool_stopped_waiting(self, queued_again: bool) -> GPUPoolRefused:
        """The hub stopped this server while it waited: no entry may outlive the stop, even one
        that a request in flight during the stop made again."""
        if queued_again:
            await self.gpupool_leave_queue()
        return GPUPoolRefused("The server was stopped while it waited for GPUs; its place in the queue "
                              "was given up.", reason=SpawnFailure.STOPPED, status_code=409)

    async def gpupool_leave_queue(self) -> None:
        """Give up this server's place in the pool's wait queue (the spawn was cancelled)."""
        try:
            await self.gpupool_client.leave_queue(self.user.name, self.name or "")
        except (ServiceUnavailable, ServiceError) as e:  # the place lapses when the retries stop anyway
            self.log.warning("Could not leave the GPU wait queue for %s: %s", self._log_name, e)
    async def _gpupool_cancel_reclaim(self) -> None:
        try:
            await self.gpupool_client.cancel_reclaim(self.user.name, self.name or "", "the spawn ended while waiting")
        except (ServiceError, ServiceUnavailable) as e:  # the service drops it once nobody asks
            self.log.warning("Could not cancel the reclaim %s waited for: %s", self._log_name, e)


def _retry_delay(retry_at: str | None) -> float:
    """Seconds to wait before asking again: until the service's ``retry_at`` (plus a margin), else 2."""
    if retry_at:
        try:
            at = datetime.fromisoformat(retry_at.replace("Z", "+00:00"))
        except ValueError:
            return 2.0
        return (at - datetime.now(timezone.utc)).total_seconds() + 0.5
    return 2.0
