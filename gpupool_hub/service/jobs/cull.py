"""The cull job: warn, shut down kernels, stop servers (rules in ``gpupool_hub/takeback/cull.py``)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

from ...config import GPUPool
from ...money.credits import uncharged_cost
from ...takeback.cull import Culler, CullWarning, Decision, UserState, decide, others_utilization, pressure
from ...ledger import AllocationRecord, AuditEvent
from ...reasons import AuditAction
from ...usage.utilization import UtilizationSource
from ..core.admission import Admission
from ..core.debits import Debits
from ..core.enforcement import Enforcement
from ..core.pool_inventory import PoolInventory
from ..core.takeback_notices import Notices
from ..core.queue import WaitQueue
from ..core.ledger_reads import Records
from ..core.views import ViewCache
from ..common.hubapi import HubClient, HubError
from .idle import measure_own
from .userserver import UserServerAPI

log = logging.getLogger("gpupool.cull")


#: per (allocation id, GPU UUID): the server's own use of that GPU (0-1), None where unknown
ServerFigures = dict[tuple[str, str], float | None]


class ServerUtilization:
    """Each held GPU's use by the server holding it, for the optional pressure rule: per
    (allocation id, GPU UUID), the server's own figure (on a shared GPU its own processes',
    never the GPU's) or None where unknown; None as a whole when the rule is off or the
    source cannot be read."""

    def __init__(self, culler: Culler, source: UtilizationSource | None) -> None:
        self.culler, self.source = culler, source

    async def __call__(self, records: list[AllocationRecord]) -> ServerFigures | None:
        if not (self.culler.pressure_utilization and self.source is not None):
            return None
        try:
            own = await measure_own(self.source, records, self.culler.interval)
        except Exception as e:  # pressure from allocation and refusals still works
            log.warning("GPU utilization unavailable for the pressure check: %s", e)
            return None
        return {(r.id, g["uuid"]): None if (x := own.get((r.id, g["uuid"]))) is None else x.utilization
                for r in records for g in r.gpus}


class CullJob:
    """Built from the units it reads and drives (kueue-style explicit dependencies)."""

    def __init__(self, hub: HubClient, culler: Culler, groups: Callable[[str], Awaitable[list[str]]],
                 utilization: Callable[[list[AllocationRecord]], Awaitable[ServerFigures | None]], *,
                 settings: GPUPool, records: Records, inventory: PoolInventory, queue: WaitQueue,
                 admission: Admission, debits: Debits,
                 enforcement: Enforcement, notices: Notices, cache: ViewCache) -> None:
        self.hub = hub
        self.debits = debits  # where charging stands: the floor counts the GPU time not charged yet
        self.settings, self.records, self.inventory = settings, records, inventory
        self.queue, self.admission, self.enforcement, self.notices, self.cache = (queue, admission, enforcement,
                                                                                 notices, cache)
        self.culler = culler
        self.groups = groups
        self.utilization = utilization
        self.servers = UserServerAPI(hub, culler.hub_public_url)

    async def __call__(self) -> None:
        now = datetime.now(timezone.utc)
        culler, enforcement = self.culler, self.enforcement
        servers: dict[str, set[str]] = {}
        allocated = Decimal(0)
        models: dict[str, set[str]] = {}
        held: dict[str, list[tuple[Decimal, datetime]]] = {}
        records = await self.records.active_allocations.off_loop()
        for record in records:
            servers.setdefault(record.user, set()).add(record.server)
            if record.charged_from is not None:  # a pending batch job holds GPUs but is not charged
                held.setdefault(record.user, []).append((record.price_per_hour, record.charged_from))
            models.setdefault(record.user, set()).update(g["model"] for g in record.gpus)
            allocated += sum((Decimal(g["milli"]) / 1000 for g in record.gpus), Decimal(0))
        for user, server in enforcement.revoked_servers():
            servers.setdefault(user, set()).add(server)
        capacity = Decimal(self.inventory.gpu_count())
        measured = await self.utilization(records)
        holdings = [(r.user, Decimal(g["milli"]) / 1000, (measured or {}).get((r.id, g["uuid"])))
                    for r in records for g in r.gpus]
        warnings = enforcement.warnings_for(culler.dry_run)
        grace = timedelta(seconds=culler.grace_period)
        # users the agents enforce against are re-checked too, so a top-up frees them
        judged = set(servers) | set(warnings) | set(enforcement.users)
        balances = await self.records.balances.off_loop(judged)  # one read for all, not one per user
        # the floor stop counts the GPU time used since the last charged interval (issue 39.6)
        charged_through, charged_now = self.debits.next_interval_start(), self.debits.clock()
        demands = (await self.queue.demand.off_loop([(u, frozenset(models.get(u, ()))) for u in judged])
                   if self.settings.queue_enabled else {})
        for user in judged:
            if user not in balances:
                log.warning("Cull: %s holds GPUs but has no account; nothing to judge", user)
                continue
            balance = balances[user]
            try:
                groups = set(await self.groups(user))
                rules = self.settings.rules_for(groups)
            except Exception:
                log.exception("Cull: cannot judge %s this time", user)
                continue
            exempt = user in culler.exempt_users or bool(groups & culler.exempt_groups)
            uncharged = uncharged_cost(held.get(user, ()), charged_through, charged_now)
            state = UserState(user, balance, rules.floor, tuple(sorted(servers.get(user, ()))), exempt, uncharged)
            if balance >= 0:
                enforcement.reinstate(user)
            # the pool is under pressure for this user when someone else waits for what they hold
            # (with the queue off: others' refusals), never by their own request
            if self.settings.queue_enabled:
                demand = demands[(user, frozenset(models.get(user, ())))]
            else:
                demand = enforcement.last_refusal_excluding(user)
            busy = None if measured is None else others_utilization(user, holdings, capacity)
            why = pressure(allocated, capacity, demand, now, culler, busy)
            for d in decide([state], warnings, why, now, grace):
                try:
                    await self.carry_out(d, warnings)
                except Exception:
                    log.exception("Cull: could not %s for %s/%s", d.action, d.user, d.server)

    async def carry_out(self, d: Decision, warnings: dict[str, CullWarning]) -> None:
        dry = self.culler.dry_run
        now = datetime.now(timezone.utc)
        detail: dict[str, Any] = dict(d.detail or {})
        if dry:
            log.warning("[dry run] would %s for %s/%s: %s", d.action, d.user, d.server, d.reason)
        if d.action == AuditAction.WARN:
            self.enforcement.warn(d.user, CullWarning("kernels", d.reason, d.deadline),  # type: ignore[arg-type]
                                  dry_run=dry)
            self.cache.forget(d.user)
            log.warning("Cull warning for %s until %s: %s", d.user, d.deadline, d.reason)
        elif d.action == AuditAction.CLEAR_WARNING:
            self.enforcement.clear(d.user, dry_run=dry)
            self.cache.forget(d.user)
        elif not dry:
            # what the server holds now: stopping it makes its spawner release these itself
            held = [r.id for r in await self.records.active_allocations.off_loop(d.user) if r.server == d.server]
            try:
                if d.action == AuditAction.CULL_KERNELS:
                    detail["kernels"] = await self.shutdown_kernels(d.user, d.server)
                    self.enforcement.kernels_culled(d.user, d.server, now)
                    if not detail["kernels"] and not await self.holds(d.user, d.server):
                        return  # a revoked server with nothing new to shut down: nothing to record
                elif d.action == AuditAction.STOP_SERVER:
                    await self.hub.stop_server(d.user, d.server)
                    self.enforcement.server_stopped(d.user, d.server)
                detail["released"] = await self.admission.release_all.off_loop(held, f"{d.action}: {d.reason}")
                log.warning("%s for %s/%s: %s", d.action, d.user, d.server, d.reason)
            except HubError as e:
                log.error("Could not %s for %s/%s: %s", d.action, d.user, d.server, e)
                await self.notices.record.off_loop(AuditEvent(
                    now, d.user, d.server, AuditAction.FAILED.value, f"{d.action}: {e}", dry))
                return
        await self.notices.record.off_loop(  # the user's notice of a cull or floor stop comes from it
            AuditEvent(now, d.user, d.server, str(d.action), d.reason, dry, detail or None))

    async def holds(self, user: str, server: str) -> bool:
        records = await self.records.active_allocations.off_loop(user)
        return any(r.server == server for r in records)

    async def shutdown_kernels(self, user: str, server: str) -> list[str]:
        """Shut down every kernel of the server (with a token for that server alone, never the
        service's own); notebooks and files stay as they are."""
        return await self.servers.shutdown_kernels(user, server)
