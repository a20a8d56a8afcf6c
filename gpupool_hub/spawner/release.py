"""Giving GPUs back: releases the service must hear about even when it cannot be told right away.

Two things went wrong when a release was a single request that could fail:

* **Abandoned spawns held GPUs.** A spawner that timed out on ``POST
  /allocations`` (a paused service, say) refused the spawn, but the service
  still processed the queued request when it resumed, and held and charged
  the GPUs until its reconcile job noticed, minutes later. Now each spawn
  attempt has a key (:func:`new_attempt_key`, kept in the spawner's state)
  sent with the ``POST``; when the spawner gives up on an attempt (timeout,
  error, cancelled start, the hub stopping a server that never came up) it
  *abandons* it: ``DELETE /allocations/by-key/{key}``, and the service
  releases whatever the key got as never charged and refuses the key's
  ``POST`` if it comes later.
* **A server stopped while the service was down was charged until the
  service next started.** Now a release remembers when its server stopped
  (``stopped_at``) and is sent with it (``?at=``), however late.

* **A stop that failed freed GPUs whose work ran on** (issue 48.2). A release
  made by a stop carries the server's :class:`~gpupool_hub.spawner.ends.WorkEnd`
  and is sent only once the engine confirms the work ended; until then the
  service is told the allocation is stopping (held and charged), the engine is
  asked again to end it at every retry, and a new spawn of that server is
  refused (``ServerReleases.still_stopping``).

A :class:`Release` is one such fact for the service. The process-wide
:data:`outbox` sends each at once and, while the service does not answer,
keeps it and tries again every ``retry_interval`` seconds, in order for each
server, until the service confirms. It outlives the spawner
object that queued it. A hub restart loses it; the service's reconcile job
then releases the allocation at the time the hub last saw its server.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from functools import partial
from typing import Any, Protocol

from tornado import web

from .client import GPUPoolClient, ServiceError, ServiceUnavailable
from .ends import WorkEnd
from .errors import GPUPoolRefused, SpawnFailure

__all__ = ["ATTEMPT_KEY", "STATE_KEY", "Release", "ReleaseOutbox", "ServerReleases", "new_attempt_key", "outbox",
           "outcome_unknown"]

STATE_KEY = "gpupool_allocation"  # the service's reconcile job reads this key of the server's state
ATTEMPT_KEY = "gpupool_attempt"

log = logging.getLogger("gpupool.spawner.release")

#: seconds between the service's reminders that a release waits for its work to end
STOPPING_RENEW = 60.0


class WorkNotEnded(Exception):
    """The release waits: the engine has not confirmed that the server's work ended."""


def new_attempt_key() -> str:
    """A fresh key for one spawn attempt (the ``POST`` and any retry of it share it)."""
    return uuid.uuid4().hex


@dataclass(eq=False)
class Release:
    """Tell the service that an allocation ended, or that a spawn attempt was abandoned.

    With ``key`` it abandons the attempt: whatever the key got is released as
    never charged. Otherwise it releases ``allocation_id``; ``stopped_at`` (when
    the server stopped) is where the charge ends, however late this arrives.
    """

    client: GPUPoolClient
    user: str
    server: str
    reason: str
    allocation_id: str | None = None
    key: str | None = None
    stopped_at: datetime | None = None
    on_confirmed: Callable[[], None] | None = None
    confirmed: bool = False
    failures: int = field(default=0)
    #: the stopped server's work: nothing is released until it ended (None: nothing to wait for)
    end: WorkEnd | None = None
    #: the engine has confirmed the end (at the first check, or later: then the charge ends then)
    ended: bool = False
    _told_stopping: float | None = None

    @property
    def what(self) -> str:
        target = f"spawn attempt {self.key}" if self.key else f"GPU allocation {self.allocation_id}"
        return f"{target} of {self.user}/{self.server}" if self.server else f"{target} of {self.user}"

    def same_target(self, other: Release) -> bool:
        if self.key is not None or other.key is not None:
            return self.key == other.key
        return self.allocation_id == other.allocation_id

    async def deliver(self) -> None:
        """One request; raises :class:`ServiceUnavailable` or :class:`ServiceError` if not confirmed,
        :class:`WorkNotEnded` while the server's work has not been seen to end."""
        if self.end is not None and not self.ended:
            await self._wait_for_end()
        if self.key is not None:
            await self.client.release_key(self.key, self.reason)
        elif self.allocation_id is not None:
            await self.client.release(self.allocation_id, self.reason, self.stopped_at)


    async def _wait_for_end(self) -> None:
        """The end confirmed: go on (the charge ends now, if it was ever seen running after the stop).
        Not yet: tell the service it is stopping (every :data:`STOPPING_RENEW` s), ask the engine again."""
        assert self.end is not None
        if await self.end.ended():
            self.ended = True
            if self._told_stopping is not None and self.stopped_at is not None:
                self.stopped_at = datetime.now(timezone.utc)  # held and charged until it was seen gone
            return
        now = asyncio.get_running_loop().time()
        if self.allocation_id is not None and (self._told_stopping is None
                                               or now - self._told_stopping >= STOPPING_RENEW):
            await self.client.stopping(self.allocation_id)
            self._told_stopping = now
        try:
            await self.end.stop_again()
        except Exception as e:  # slurmctld still down, say: the next check sees
            log.debug("Asking again to end %s: %s", self.end.what, e)
        raise WorkNotEnded(f"{self.end.what} has not ended")


class ReleaseOutbox:
    """Releases not yet confirmed by the service, delivered until each is: in order for one
    server, up to ``concurrency`` servers at a time (a paused service makes each request wait
    for its timeout, and one server's releases must not wait behind every other's)."""

    def __init__(self, retry_interval: float = 5.0, concurrency: int = 8) -> None:
        self.retry_interval = retry_interval
        self.concurrency = concurrency
        self.pending: list[Release] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._changed: asyncio.Condition | None = None
        self._wake: asyncio.Event | None = None
        self._worker: asyncio.Task[None] | None = None

    # ------------------------------------------------------------ public

    def add(self, release: Release) -> Release:
        """Queue ``release`` (a repeat of a queued one keeps the earlier stop time) and start sending."""
        for queued in self.pending:
            if queued.same_target(release):
                if release.stopped_at is not None and (queued.stopped_at is None
                                                       or release.stopped_at < queued.stopped_at):
                    queued.stopped_at = release.stopped_at
                if release.on_confirmed is not None and queued.on_confirmed is None:
                    queued.on_confirmed = release.on_confirmed
                self._kick()
                return queued
        self.pending.append(release)
        self._kick()
        return release

    async def send(self, release: Release, wait: float) -> bool:
        """Queue ``release`` and wait up to ``wait`` seconds for the service to confirm it."""
        queued = self.add(release)
        await self._wait_until(lambda: queued.confirmed, wait)
        return queued.confirmed

    async def flush(self, user: str, server: str, wait: float) -> bool:
        """Wait up to ``wait`` s until no release of ``user``'s ``server`` is pending; True if none is."""
        def done() -> bool:
            return not any(r.user == user and r.server == server for r in self.pending)

        if not done():
            self._kick()
            await self._wait_until(done, wait)
        return done()

    def pending_for(self, user: str, server: str) -> list[Release]:
        return [r for r in self.pending if r.user == user and r.server == server]

    # ----------------------------------------------------------- sending

    def _bind(self) -> None:
        """The outbox's waiters and worker belong to the running event loop (a new one in tests)."""
        loop = asyncio.get_running_loop()
        if loop is not self._loop:
            self._loop = loop
            self._changed = asyncio.Condition()
            self._wake = asyncio.Event()
            self._worker = None

    def _kick(self) -> None:
        self._bind()
        assert self._wake is not None
        self._wake.set()
        if self._worker is None or self._worker.done():
            self._worker = asyncio.ensure_future(self._run())

    async def _wait_until(self, predicate: Callable[[], bool], wait: float) -> None:
        self._bind()
        assert self._changed is not None
        try:
            async with self._changed:
                await asyncio.wait_for(self._changed.wait_for(predicate), timeout=max(wait, 0))
        except asyncio.TimeoutError:
            pass

    async def _notify(self) -> None:
        assert self._changed is not None
        async with self._changed:
            self._changed.notify_all()

    async def _run(self) -> None:
        assert self._wake is not None
        while True:
            self._wake.clear()
            servers: dict[tuple[str, str], list[Release]] = {}
            for release in self.pending:
                servers.setdefault((release.user, release.server), []).append(release)
            limit = asyncio.Semaphore(self.concurrency)
            await asyncio.gather(*(self._deliver_in_order(queue, limit) for queue in servers.values()))
            if not self.pending:
                await self._notify()
                if not self.pending:  # nothing was queued meanwhile: done (no await after this check)
                    return
                continue
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=self.retry_interval)
            except asyncio.TimeoutError:
                pass

    async def _deliver_in_order(self, queue: list[Release], limit: asyncio.Semaphore) -> None:
        """One server's releases, oldest first, stopping at the first the service does not take
        (an abandoned attempt must reach it before a later release of the same server)."""
        async with limit:
            for release in queue:
                if not await self._deliver(release):
                    return
                self.pending.remove(release)
                release.confirmed = True
                if release.on_confirmed is not None:
                    release.on_confirmed()
                await self._notify()

    async def _deliver(self, release: Release) -> bool:
        try:
            await release.deliver()
        except WorkNotEnded as e:
            release.failures += 1
            level = logging.WARNING if release.failures == 1 else logging.DEBUG
            log.log(level, "Not releasing %s yet: %s; its GPUs stay held (and charged) until it has, and it is "
                    "asked again every %g s", release.what, e, self.retry_interval)
            return False
        except (ServiceUnavailable, ServiceError) as e:
            release.failures += 1
            level = logging.WARNING if release.failures == 1 else logging.DEBUG
            log.log(level, "Could not release %s (%s); kept, and sent again every %g s until the service "
                    "confirms", release.what, e, self.retry_interval)
            return False
        except Exception:  # a bug, not the service: keep the release, say so once
            release.failures += 1
            if release.failures == 1:
                log.exception("Releasing %s failed; kept, and sent again", release.what)
            return False
        log.info("Released %s (%s)%s", release.what, release.reason,
                 f" after {release.failures} failed attempt(s)" if release.failures else "")
        return True


#: The hub process's one outbox (a spawner object may be gone before its release is confirmed).
outbox = ReleaseOutbox()


class ReleaseOwner(Protocol):
    """What a server's releases ask of the spawner that holds them: a client made with its current URL
    and token, whose server it is (asked each time: a user may be renamed), and to be told that the
    service confirmed a release (it drops the allocation's id unless a newer one is held)."""

    @property
    def gpupool_client(self) -> GPUPoolClient: ...

    def gpupool_server(self) -> tuple[str, str]: ...

    def gpupool_released(self, alloc_id: str | None) -> None: ...


class ServerReleases:
    """One server's releases, which :class:`~gpupool_hub.spawner.GPUPoolSpawner` builds and holds
    (``spawner.releases``): each made a :class:`Release` of this user's server and sent through
    the process's :data:`outbox`. Its own state is the spawn attempt it abandoned; the held
    allocation and the attempt's key are the spawner's (in the server's state), and a confirmed
    release tells the spawner (``ReleaseOwner.gpupool_released``), which drops its id."""

    def __init__(self, owner: ReleaseOwner, retry_interval: float = 5.0) -> None:
        self.owner = owner
        self.retry_interval = retry_interval
        self.abandoned_key: str | None = None

    @property
    def outbox(self) -> ReleaseOutbox:
        outbox.retry_interval = self.retry_interval  # the process's one outbox, at this hub's setting
        return outbox

    def abandoned(self, key: str | None) -> bool:
        """Whether the attempt ``key`` was given up (its release by key is sent or on its way)."""
        return key is not None and self.abandoned_key == key

    def _release_of(self, reason: str, alloc: str | None, **kwargs: Any) -> Release:
        return Release(self.owner.gpupool_client, *self.owner.gpupool_server(), reason,
                       on_confirmed=partial(self.owner.gpupool_released, alloc), **kwargs)

    async def release(self, alloc: str, reason: str, stopped_at: datetime, wait: float,
                      end: WorkEnd | None = None) -> bool:
        """Give the allocation ``alloc`` back, its charge ending at ``stopped_at`` however late this
        arrives; True once the service confirmed within ``wait`` s (else it stays in the outbox).
        With ``end``, only once the server's work ended (the charge then ends when it was seen to)."""
        release = self._release_of(reason, alloc, allocation_id=alloc, stopped_at=stopped_at, end=end)
        return await self.outbox.send(release, wait)

    async def abandon(self, key: str, alloc: str | None, reason: str, wait: float,
                      end: WorkEnd | None = None) -> bool:
        """Give up the spawn attempt ``key``: whatever it got (``alloc``, if known) is released,
        never charged, and the key's ``POST`` is refused if it still arrives; with ``end``, only
        once the attempt's work ended."""
        self.abandoned_key = key
        return await self.outbox.send(self._release_of(reason, alloc, key=key, end=end), wait)

    def still_stopping(self) -> str | None:
        """What of this server's is stopped but not yet seen to end ("Slurm job 42"), or None."""
        for release in self.outbox.pending_for(*self.owner.gpupool_server()):
            if release.end is not None and not release.ended:
                return release.end.what
        return None

    async def flush(self, wait: float) -> bool:
        """Every release of this server delivered (True), or still not after ``wait`` s (False)."""
        return await self.outbox.flush(*self.owner.gpupool_server(), wait)


def outcome_unknown(error: BaseException, allocation: dict[str, Any] | None) -> bool:
    """Whether a failed start may have left GPUs held: it got an allocation, or its request's fate
    is unknown (no answer, cancelled, an unexpected error). A refusal the pool answered holds nothing."""
    if allocation is not None:
        return True
    if isinstance(error, GPUPoolRefused):
        return error.reason == SpawnFailure.UNREACHABLE
    return not isinstance(error, web.HTTPError)
