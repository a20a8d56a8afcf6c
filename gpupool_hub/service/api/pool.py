"""``pool``, ``teams``, ``models``, ``queue``: what the pool holds, offers and waits for."""

from __future__ import annotations

from tornado import web

from ..core.catalog import catalog as models_catalog
from .base import APIHandler


class PoolHandler(APIHandler):
    async def get(self) -> None:
        self.require_admin()
        active = await self.read_db(self.manager.ledger.active_allocations)
        idle = self.manager.idle.idle_since()  # as of the idle job's last run
        report = await self.core(self.manager.views.pool_report, active, idle, self.manager.idle.own_utilization())
        teams = await self.core(self.manager.reclaims.team_report)
        self.write_json({**report, "unallocated_servers": self.context.reconcile_report(), "teams": teams["teams"]})


class ModelsHandler(APIHandler):
    """The GPU models of the pool with their prices and what is free: what the
    spawn form shows. Any caller of the service may read it (prices are public
    within the hub); the pool itself, not ``c.GPUPool.nodes``, is the source."""

    async def get(self) -> None:
        catalog = await self.core(models_catalog, self.manager.inventory, self.manager.settings.min_start_hours)
        waiting = await self.core(self.manager.queue.cached_summary)
        for entry in catalog["models"]:  # "full — 2 waiting, about 20 min" on the spawn form
            entry.update(waiting.get(entry["model"], {"waiting": 0, "eta": None}))
        self.write_json(catalog)


class QueueHandler(APIHandler):
    """The wait queue: the admins' view (GET), and a cancelled spawn giving up its place (DELETE)."""

    max_body_bytes = 0

    async def get(self) -> None:
        self.require_admin()
        self.write_json(await self.core(self.manager.queue.report))

    async def delete(self) -> None:
        self.require_spawner_or_admin()
        user = self.text_arg("user")
        if not user:
            raise web.HTTPError(400, "'user' (the waiting server's user) is required")
        server = self.text_arg("server", "") or ""
        self.write_json({"left": await self.core(self.manager.queue.leave, user, server)})


class TeamsHandler(APIHandler):
    """Fair share: per team quota, usage, borrowed GPUs; reclaims in progress (admins)."""

    async def get(self) -> None:
        self.require_admin()
        self.write_json(await self.core(self.manager.reclaims.team_report))


default_handlers = [
    (r"api/v1/pool", PoolHandler),
    (r"api/v1/teams", TeamsHandler),
    (r"api/v1/models", ModelsHandler),
    (r"api/v1/queue", QueueHandler),
]
