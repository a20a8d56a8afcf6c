"""The spawn's wait for GPUs: ask the pool, and while it says asking again will help
(a reclaim in progress, a place in the wait queue), say so on the progress page and
ask again, until the pool answers, the hub cancels the spawn, or the wait's limit
(``wait_rules.queue_wait_limit``) ends it with the pool's own message.

:class:`WaitLoop` is an object :class:`~gpupool_hub.spawner.base.GPUPoolSpawner`
builds and holds (``spawner.waits``), as it holds its releases
(:class:`~.release.ServerReleases`): built from the spawner's ask, client factory
and progress log; its own state is whether a spawn waits and whether it is queued.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import datetime, timezone
from typing import Any, Protocol

from ..profiles import Profile
from ..reasons import RefusalReason
from .client import GPUPoolClient, ServiceError, ServiceUnavailable
from .errors import GPUPoolRefused, SpawnFailure
from .logs import is_normal_refusal, refusal_filter
from .progress import ProgressLog
from .wait_rules import gave_up_waiting, hub_answered_at, queue_wait_limit, service_away

__all__ = ["START_MARGIN", "WaitLoop", "wait_place"]

# a reclaim wait ends this long before the hub's start_timeout, so the spawn fails with a message
START_MARGIN = 5.0


class WaitOwner(Protocol):
    """What a wait asks of the spawner that holds it: one request to the pool (the allocation, or
    ``GPUPoolRefused``), a client made with its current URL and token, and whose server it is (asked
    each time: a user may be renamed)."""

    @property
    def gpupool_client(self) -> GPUPoolClient: ...

    async def gpupool_allocate(self, profile: Profile, gpus: int) -> dict[str, Any]: ...

    def gpupool_server(self) -> tuple[str, str]: ...


class WaitLoop:
    """One server's wait for GPUs: ``await waits.get_gpus(…)`` asks with ``ask`` until it gets an
    allocation or a final refusal, and says so on the progress page; ``waiting`` and ``queued`` say where the wait is (the
    spawner's ``pending`` reads ``queued``); :meth:`stop` ends it from the hub's ``stop``."""

    def __init__(self, owner: WaitOwner, progress: ProgressLog, log: logging.Logger | Any) -> None:
        self.owner = owner
        self.progress = progress
        self.log = log
        self.waiting = False  # a spawn is waiting for GPUs (a reclaim or a place in the queue)
        self.queued = False  # waiting in the pool's queue, and the hub has answered the start request
        #: the queued spawn's place as the pool last said it (``wait_place``), for the hub's home page
        self.place: dict[str, Any] | None = None

    async def get_gpus(self, profile: Profile, gpus: int, start_timeout: float, reclaim_wait: float,
                       handler: Any = None) -> dict[str, Any]:
        """The allocation for ``gpus`` of ``profile`` (:meth:`run`), told on the progress page and
        in the log; a refusal is told there too (as INFO when it is the pool saying no) and raised."""
        self.progress.add(10, f"Asking the GPU pool for {profile.describe(gpus)}…")
        try:
            allocation = await self.run(profile, gpus, start_timeout, reclaim_wait, handler)
        except GPUPoolRefused as e:
            self.progress.add(100, f"Refused: {e.message}", e.jupyterhub_html_message)
            if is_normal_refusal(e):
                self.log.info("GPU pool refused %s for %s: %s", profile.describe(gpus), self.log_name, e.message)
                refusal_filter.note(e, getattr(handler, "request", None))
            raise
        where = allocation.get("description") or f"{allocation.get('node')}"
        self.log.info("GPUs for %s: %s (allocation %s)", self.log_name, where, allocation["id"])
        if allocation.get("borrowed"):
            self.progress.add(40, f"GPUs allocated (borrowed: your team is over its quota, so they may be "
                                  f"reclaimed when another team needs them): {where}")
        else:
            self.progress.add(40, f"GPUs allocated: {where}")
        return allocation

    async def run(self, profile: Profile, gpus: int, start_timeout: float, reclaim_wait: float,
                  handler: Any = None) -> dict[str, Any]:
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
        hub_gives_up = started + max(start_timeout - START_MARGIN, 0)
        answered = hub_answered_at(handler, started)
        queued: GPUPoolRefused | None = None  # the last place in the queue this spawn was told
        waited_for_reclaim = False
        asked = 0
        self.waiting = True
        try:
            while True:
                try:
                    asked += 1
                    return await self.owner.gpupool_allocate(profile, gpus)
                except GPUPoolRefused as e:
                    if asked == 1 and "cancelled_at" in e.details:
                        # The pool ends, once, the first request after a place was given up (a retry
                        # of the left spawn still in flight). This is a new spawn: "Leave the queue"
                        # then Start again queues anew at once, instead of failing once.
                        continue
                    if queued is not None and e.reason == SpawnFailure.UNREACHABLE.value:
                        e = service_away(queued)  # restarting: the queue keeps the place meanwhile
                    elif e.refusal is RefusalReason.QUEUED:
                        queued = e
                    waited_for_reclaim = waited_for_reclaim or e.refusal is RefusalReason.RECLAIMING
                    give_up = started + queue_wait_limit(e, reclaim_wait, start_timeout)
                    if not self.waiting:  # stopped (stop() left the queue) while this request ran
                        raise await self._stopped_waiting(queued is not None) from None
                    if not e.retryable or loop.time() >= give_up:
                        if e.refusal is RefusalReason.QUEUED:  # the place lapses once the retries stop
                            raise gave_up_waiting(e, loop.time() - started) from None
                        raise
                    delay = _retry_delay(e.retry_at)
                    if e.refusal is RefusalReason.RECLAIMING and loop.time() + delay >= hub_gives_up:
                        msg = (f"{e.message} That is after this hub's start timeout ({start_timeout:g} s), "
                               "so this spawn gives up now; try again later. The borrowed servers keep running. "
                               "An admin can raise c.Spawner.start_timeout above c.GPUPool.preempt_grace.")
                        raise GPUPoolRefused(msg, reason=SpawnFailure.START_TIMEOUT, status_code=409) from None
                    wait = min(max(delay, 0.5), 10.0, max(give_up - loop.time(), 0.5))
                    title = e.refusal.title if e.refusal else "Waiting"
                    self.place = wait_place(e) if e.refusal is RefusalReason.QUEUED else None
                    self.progress.add(20, f"{title}: {e.message}", line=(e.refusal or RefusalReason.QUEUED).value,
                                      wait=self.place)
                    self.queued = queued is not None and loop.time() >= answered
                    await asyncio.sleep(wait)
                    if not self.waiting:  # stopped while it slept: asking again would queue it anew
                        raise await self._stopped_waiting(False)
        except BaseException as e:
            if waited_for_reclaim:
                await self._cancel_reclaim()
            if queued is not None and isinstance(e, asyncio.CancelledError):
                await self.leave_queue()  # the hub stopped the pending spawn: the place is free now
            raise
        finally:
            self.waiting = self.queued = False
            self.place = None

    @property
    def log_name(self) -> str:
        """``user:server`` or ``user``, as JupyterHub's ``Spawner._log_name``."""
        return ":".join(name for name in self.owner.gpupool_server() if name)

    async def stop(self) -> None:
        """The hub stops the server: a spawn still waiting gives up its place in the queue."""
        if self.waiting:
            self.waiting = False
            await self.leave_queue()

    async def leave_queue(self) -> None:
        """Give up this server's place in the pool's wait queue (the spawn was cancelled)."""
        try:
            await self.owner.gpupool_client.leave_queue(*self.owner.gpupool_server())
        except (ServiceUnavailable, ServiceError) as e:  # the place lapses when the retries stop anyway
            self.log.warning("Could not leave the GPU wait queue for %s: %s", self.log_name, e)

    async def _stopped_waiting(self, queued_again: bool) -> GPUPoolRefused:
        """The hub stopped this server while it waited: no entry may outlive the stop, even one
        that a request in flight during the stop made again."""
        if queued_again:
            await self.leave_queue()
        return GPUPoolRefused("The server was stopped while it waited for GPUs; its place in the queue "
                              "was given up.", reason=SpawnFailure.STOPPED, status_code=409)

    async def _cancel_reclaim(self) -> None:
        try:
            await self.owner.gpupool_client.cancel_reclaim(*self.owner.gpupool_server(), "the spawn ended while waiting")
        except (ServiceError, ServiceUnavailable) as e:  # the service drops it once nobody asks
            self.log.warning("Could not cancel the reclaim %s waited for: %s", self.log_name, e)


def wait_place(queued: GPUPoolRefused) -> dict[str, Any]:
    """What the hub's pages show of a queued spawn's place: its position, how many wait, the
    range (``eta_text``, when the pool has one) and the pool's own sentence."""
    d = queued.details
    return {"position": d.get("position"), "queue_length": d.get("queue_length"), "eta_text": d.get("eta_text"),
            "message": queued.message}


def _retry_delay(retry_at: str | None) -> float:
    """Seconds to wait before asking again: until the service's ``retry_at`` (plus a margin), else 2."""
    if retry_at:
        try:
            at = datetime.fromisoformat(retry_at.replace("Z", "+00:00"))
        except ValueError:
            return 2.0
        return (at - datetime.now(timezone.utc)).total_seconds() + 0.5
    return 2.0
