"""Reconcile: the ledger's allocations against the servers the hub says run.

An allocation whose server the hub no longer runs is released, and its charge
ends when the hub last knew the server alive (the server's ``last_activity``,
which the hub sets when it stops a server; else the user's), kept within
[the allocation's start, now], not when this job happens to run: a server
stopped while the service was down or paused must not be charged for the
downtime. For the same reason :class:`DebitAfterReconcile` charges an
interval only once the servers were reconciled after it closed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import quote

from ...ledger import AllocationRecord
from ..core.admission import Admission
from ..core.debits import Debits
from ..core.ledger_reads import Records
from ..common.hubapi import HubClient, HubError

log = logging.getLogger("gpupool.reconcile")

Clock = Callable[[], datetime]


def _utcnow() -> datetime:
    return datetime.now(timezone.utc)


def _instant(value: Any) -> datetime | None:
    """A hub timestamp (ISO 8601, ``Z``) as an aware datetime; None if absent or unreadable."""
    if not isinstance(value, str) or not value:
        return None
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


class ReconcileJob:
    """Release allocations whose server is gone; report servers claiming unknown allocations.

    ``grace`` protects young allocations the hub cannot account for yet (e.g.
    made through the API with no server); it does not protect an allocation
    whose server the hub saw after the allocation began and reports stopped.
    """

    def __init__(self, hub: HubClient, records: Records, admission: Admission, grace: float,
                 clock: Clock = _utcnow, engine_work: Callable[[], Awaitable[set[str]]] | None = None) -> None:
        """``engine_work``: the allocations whose server's work the engine still runs (Slurm's jobs by
        their comment); it alone releases a stopped server's allocation whose spawner lost track of it
        (a hub restart while it waited for the job to end). None: no engine the service can ask."""
        self.engine_work = engine_work
        self.hub = hub
        self.records = records
        self.admission = admission
        self.grace = timedelta(seconds=grace)
        self.clock = clock
        self.findings: list[dict[str, Any]] = []
        self.checked_through: datetime | None = None  # when the last complete run asked the hub
        self._lock = asyncio.Lock()  # the schedule and the debit job may both ask for a run

    def report(self) -> list[dict[str, Any]]:
        return list(self.findings)

    async def __call__(self) -> None:
        async with self._lock:
            await self._run()

    async def _run(self) -> None:
        started = self.clock()
        running: dict[tuple[str, str], dict[str, Any]] = {}
        async for user in self.hub.users(state="active"):
            for server_name, server in (user.get("servers") or {}).items():
                running[(user["name"], server_name)] = server
        active = await self.records.active_allocations.off_loop()
        models: dict[str, dict[str, Any] | None] = {}
        for record in active:
            if (record.user, record.server) in running or record.created_at >= started:
                continue  # running, or made after the hub was asked
            if record.stop_asked_at is not None:
                await self._settle_stopped(record)  # its work not yet seen to end: released once it has
                continue
            try:
                if record.user not in models:
                    models[record.user] = await self._user_with_stopped_servers(record.user)
                await self._settle(record, models[record.user])
            except Exception:
                log.exception("Could not reconcile allocation %s of %s", record.id, record.user)
        known = {r.id for r in active}
        findings = []
        for (user, server_name), server in running.items():
            alloc = (server.get("state") or {}).get("gpupool_allocation")
            if not alloc or alloc in known:
                continue
            record = await self.records.allocation.off_loop(alloc)
            if record is not None and record.released_at is not None and taken_back(record):
                # the service itself took these GPUs back (kernels culled, reclaimed) and the server
                # runs on without them, as intended: the node agents stop its GPU work; no finding
                log.debug("Server %s/%s runs on without allocation %s (%s)", user, server_name, alloc,
                          record.release_reason)
                continue
            findings.append({"user": user, "server": server_name, "allocation": alloc,
                             "message": "server claims GPUs the pool has no allocation for"})
            log.error("Server %s/%s holds allocation %s the pool does not know", user, server_name, alloc)
        self.findings = findings
        self.checked_through = started

    async def _settle_stopped(self, record: AllocationRecord) -> None:
        """A stopped server whose work its spawner has not seen end: held and charged, unless the engine
        says its work is gone (a hub restart lost the spawner that was waiting for it)."""
        if self.engine_work is None:
            return
        try:
            alive = await self.engine_work()
        except Exception as e:  # slurmctld down: the next run asks again
            log.debug("Cannot ask the engine whether %s's work ended: %s", record.id, e)
            return
        if record.id not in alive:
            log.warning("Releasing allocation %s of %s/%s: stopped %s, and its job is no longer in Slurm",
                        record.id, record.user, record.server, record.stop_asked_at.isoformat()
                        if record.stop_asked_at else "")
            await self.admission.release.off_loop(record.id, "reconcile: its stopped job has ended")

    async def _user_with_stopped_servers(self, name: str) -> dict[str, Any] | None:
        return await self.hub.request("GET", f"/users/{quote(name, safe='')}",
                                      params={"include_stopped_servers": "1"}, allow_404=True)

    async def _settle(self, record: AllocationRecord, user: dict[str, Any] | None) -> None:
        """Release ``record`` (its server is not running) at the time the hub last saw the server.

        The server's own ``last_activity`` after the allocation began proves the
        server ran with it and is now stopped: released at once, at that time.
        Otherwise (no such server, or not seen since) the allocation is left
        alone while younger than ``grace``, then released at the server's or the
        user's last activity, kept within [its start, now] (now if the hub knows neither).
        """
        now = self.clock()
        server = ((user or {}).get("servers") or {}).get(record.server)
        if server is not None and not server.get("stopped", True):
            return  # it started after the hub was asked: the next run decides
        server_seen = _instant((server or {}).get("last_activity"))
        if server_seen is not None and server_seen >= record.created_at:
            seen: datetime | None = server_seen
        elif now - record.created_at < self.grace:
            return
        else:
            seen = server_seen or _instant((user or {}).get("last_activity"))
        at = min(max(seen, record.created_at), now) if seen is not None else now
        log.warning("Releasing allocation %s: server %s/%s is not running (last seen by the hub %s)",
                    record.id, record.user, record.server, seen.isoformat() if seen else "never")
        await self.admission.release.off_loop(record.id, "reconcile: server not running", at=at)


#: release reasons of the service's own enforcement (see jobs/cull.py, reclaims.py, jobs/idle.py):
#: a server still running with such an allocation lost its GPUs on purpose
TAKEN_BACK = ("cull_kernels:", "stop_server:", "preempted:", "idle_reclaim:")


def taken_back(record: AllocationRecord) -> bool:
    return (record.release_reason or "").startswith(TAKEN_BACK)


class DebitAfterReconcile:
    """The debit job, run only after the servers were reconciled since the interval to charge closed.

    Why: when the service was down or paused while a server stopped, that
    server's release has not arrived yet; charging the intervals that closed
    meanwhile would bill the allocation until the service came back. Reconciling
    first releases it at the time the hub last saw the server. If the hub does
    not answer, the interval is charged anyway (accounting must not stall on it).
    """

    def __init__(self, reconcile: ReconcileJob, debit: Callable[[], Awaitable[Any]], debits: Debits) -> None:
        self.reconcile = reconcile
        self.debit = debit
        self.debits = debits
        self._tried: datetime | None = None  # one failed attempt per interval, not one per check

    async def __call__(self) -> None:
        closed = self.debits.next_interval_start() + timedelta(seconds=self.debits.interval)
        checked = self.reconcile.checked_through
        if closed <= self.debits.clock() and (checked is None or checked < closed) and self._tried != closed:
            self._tried = closed
            try:
                await self.reconcile()
            except (HubError, OSError) as e:
                log.warning("Could not reconcile before charging (%s); charging anyway", e)
        await self.debit()
