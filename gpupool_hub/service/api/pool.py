"""``pool``, ``teams``, ``models``, ``queue``: what the pool holds, offers and waits for."""

from __future__ import annotations

from tornado import web

from .base import APIHandler


class PoolHandler(APIHandler):
    async def get(self) -> None:
        self.require_admin()
        active = await self.manager.records.active_holders.off_loop()  # who, not every allocation parsed
        idle = self.manager.idle.idle_since()  # as of the idle job's last run
        report = await self.manager.views.pool_report.off_loop(active, idle, self.manager.idle.own_utilization())
        teams = await self.manager.reclaims.team_report.off_loop()
        self.write_json({**report, "unallocated_servers": self.context.reconcile_report(), "teams": teams["teams"]})


class ModelsHandler(APIHandler):
    """The GPU models of the pool with their prices and what is free: what the
    spawn form shows. Any caller of the service may read it (prices are public
    within the hub); the pool itself, not ``c.GPUPool.nodes``, is the source."""

    async def get(self) -> None:
        catalog = await self.manager.views.models.off_loop()
        waiting = await self.manager.queue.reports.cached_summary.off_loop()
        for entry in catalog["models"]:  # "full — 2 waiting, about 20 min" on the spawn form
            entry.update(waiting.get(entry["model"], {"waiting": 0, "eta": None}))
        self.write_json(catalog)


class QueueHandler(APIHandler):
    """The wait queue: the admins' view (GET), and a cancelled spawn giving up its place (DELETE)."""

    max_body_bytes = 0

    async def get(self) -> None:
        self.require_admin()
        self.write_json(await self.manager.queue.reports.report.off_loop())

    async def delete(self) -> None:
        self.require_spawner_or_admin()
        user = self.name_arg("user")
        if not user:
            raise web.HTTPError(400, "'user' (the waiting server's user) is required")
        server = self.name_arg("server", "") or ""
        self.write_json({"left": await self.manager.queue.leave.off_loop(user, server)})


class TeamsHandler(APIHandler):
    """Fair share: per team quota, usage, borrowed GPUs; reclaims in progress (admins)."""

    async def get(self) -> None:
        self.require_admin()
        self.write_json(await self.manager.reclaims.team_report.off_loop())


default_handlers = [
    (r"api/v1/pool", PoolHandler),
    (r"api/v1/teams", TeamsHandler),
    (r"api/v1/models", ModelsHandler),
    (r"api/v1/queue", QueueHandler),
]
