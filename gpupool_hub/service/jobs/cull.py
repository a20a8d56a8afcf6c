"""The cull job: warn, shut down kernels, stop servers (rules in ``gpupool_hub/cull.py``)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from typing import Any

from ...config import GPUPool
from ...cull import Culler, CullWarning, Decision, UserState, decide, pressure
from ...ledger import AuditEvent
from ...reasons import AuditAction
from ...usage.utilization import PrometheusUtilization
from ..core.admission import Admission
from ..core.enforcement import Enforcement
from ..core.inventory import PoolInventory
from ..core.notices import Notices
from ..core.queue import WaitQueue
from ..core.records import Records
from ..core.views import ViewCache
from ..hubapi import HubClient, HubError
from .userserver import UserServerAPI

log = logging.getLogger("gpupool.cull")


class UtilizationProbe:
    """The pool's GPU utilization (0–1) from Prometheus, for the optional pressure rule."""

    def __init__(self, culler: Culler, prometheus_url: str, token: str = "") -> None:
        self.culler = culler
        self.source = PrometheusUtilization(prometheus_url, token=token) if prometheus_url else None

    async def __call__(self) -> float | None:
        if not (self.culler.pressure_utilization and self.source is not None):
            return None
        try:
            return await self.source.scalar(self.culler.utilization_query)
        except Exception as e:  # pressure from allocation and refusals still works
            log.warning("GPU utilization unavailable for the pressure check: %s", e)
            return None


class CullJob:
    """Built from the units it reads and drives (kueue-style explicit dependencies)."""

    def __init__(self, hub: HubClient, culler: Culler, groups: Callable[[str], Awaitable[list[str]]],
                 utilization: Callable[[], Awaitable[float | None]], *, settings: GPUPool, records: Records,
                 inventory: PoolInventory, queue: WaitQueue, admission: Admission,
                 enforcement: Enforcement, notices: Notices, cache: ViewCache) -> None:
        self.hub = hub
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
        for record in await self.records.active_allocations.off_loop():
            servers.setdefault(record.user, set()).add(record.server)
            models.setdefault(record.user, set()).update(g["model"] for g in record.gpus)
            allocated += sum((Decimal(g["milli"]) / 1000 for g in record.gpus), Decimal(0))
        for user, server in enforcement.revoked_servers():
            servers.setdefault(user, set()).add(server)
        capacity = Decimal(self.inventory.gpu_count())
        utilization = await self.utilization()
        warnings = enforcement.warnings_for(culler.dry_run)
        grace = timedelta(seconds=culler.grace_period)
        # users the agents enforce against are re-checked too, so a top-up frees them
        for user in set(servers) | set(warnings) | set(enforcement.users):
            try:
                groups = set(await self.groups(user))
                rules = self.settings.rules_for(groups)
                balance = await self.records.balance.off_loop(user)
            except Exception:
                log.exception("Cull: cannot judge %s this time", user)
                continue
            exempt = user in culler.exempt_users or bool(groups & culler.exempt_groups)
            state = UserState(user, balance, rules.floor, tuple(sorted(servers.get(user, ()))), exempt)
            if balance >= 0:
                enforcement.reinstate(user)
            # the pool is under pressure for this user when someone else waits for what they hold
            # (with the queue off: others' refusals), never by their own request
            if self.settings.queue_enabled:
                demand = await self.queue.demand_for.off_loop(user, models.get(user, set()))
            else:
                demand = enforcement.last_refusal_excluding(user)
            why = pressure(allocated, capacity, demand, now, culler, utilization)
            for d in decide([state], warnings, why, now, grace):
                try:
                    await self.carry_out(d, warnings)
                except Exception:
                    log.exception("Cull: could not %s for %s/%s", d.action, d.user, d.server)

    async def carry_out(self, d: Decision, warnings: dict[str, CullWarning]) -> None:
        dry = self.culler.dry_run
        now = datetime.now(timezone.utc)
        detail: dict[str, Any] = {}
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
