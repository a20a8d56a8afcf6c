"""Reconcile: the ledger's allocations against the servers the hub says run."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from typing import Any

from ...ledger import Ledger
from ..admission import Admission
from ..hubapi import HubClient
from ..threads import CoreThreads

log = logging.getLogger("gpupool.reconcile")


class ReconcileJob:
    """Release allocations whose server is gone; report servers claiming unknown allocations."""

    def __init__(self, hub: HubClient, ledger: Ledger, admission: Admission, threads: CoreThreads, grace: float,
                 clock: Callable[[], datetime] = lambda: datetime.now(timezone.utc)) -> None:
        self.hub = hub
        self.ledger = ledger
        self.admission = admission
        self.threads = threads
        self.grace = timedelta(seconds=grace)
        self.clock = clock
        self.findings: list[dict[str, Any]] = []

    def report(self) -> list[dict[str, Any]]:
        return list(self.findings)

    async def __call__(self) -> None:
        running: dict[tuple[str, str], dict[str, Any]] = {}
        async for user in self.hub.users(state="active"):
            for server_name, server in (user.get("servers") or {}).items():
                running[(user["name"], server_name)] = server
        now = self.clock()
        active = await self.threads.read(self.ledger.active_allocations)
        for record in active:
            if (record.user, record.server) in running or now - record.created_at < self.grace:
                continue
            try:
                log.warning("Releasing allocation %s: server %s/%s is not running", record.id, record.user,
                            record.server)
                await self.threads.write(self.admission.release, record.id, "reconcile: server not running")
            except Exception:
                log.exception("Could not release allocation %s of %s", record.id, record.user)
        known = {r.id for r in active}
        findings = []
        for (user, server_name), server in running.items():
            alloc = (server.get("state") or {}).get("gpupool_allocation")
            if alloc and alloc not in known:
                findings.append({"user": user, "server": server_name, "allocation": alloc,
                                 "message": "server claims GPUs the pool has no allocation for"})
                log.error("Server %s/%s holds allocation %s the pool does not know", user, server_name, alloc)
        self.findings = findings
