"""``pool``, ``teams``, ``models``, ``queue``: what the pool holds, offers and waits for."""

from __future__ import annotations

from decimal import Decimal
from typing import Any

from tornado import web

from ...timefmt import iso as _iso
from ...units import format_tokens
from ..core.catalog import catalog as models_catalog
from .base import APIHandler


class PoolHandler(APIHandler):
    async def get(self) -> None:
        self.require_admin()
        active = {r.id: r for r in await self.read_db(self.manager.ledger.active_allocations)}
        nodes = await self.core(self.manager.pool.snapshot)

        idle = self.manager.idle.idle_since()  # as of the idle job's last run

        def holders(held: dict[str, int]) -> list[dict[str, Any]]:
            return [{"allocation": a, "fraction": format_tokens(Decimal(m) / 1000),
                     "user": active[a].user if a in active else None,
                     "server": active[a].server if a in active else None,
                     **({"idle_since": _iso(idle[a])} if a in idle else {})}
                    for a, m in held.items()]

        for node in nodes:
            for gpu in node["gpus"]:
                gpu["allocated_fraction"] = format_tokens(Decimal(gpu.pop("allocated_milli")) / 1000)
                gpu["holders"] = holders(gpu["holders"])
                for instance in gpu.get("mig", ()):  # MIG instances inside their GPU, each with its holder
                    instance["fraction"] = format_tokens(Decimal(instance.pop("milli")) / 1000)
                    instance["holders"] = holders(instance["holders"])
        inv = self.manager.inventory
        for node in nodes:  # placeholders of the inventory source (Slurm): not servers'
            node["held_outside"] = list(inv.held_outside.get(node["node"], []))
            if node["node"] in inv.unavailable:
                node["unavailable"] = inv.unavailable[node["node"]]
            for gpu in node["gpus"]:
                for h in gpu["holders"]:
                    if inv.is_outside(h["allocation"]):
                        h["held_outside"] = True
        free = await self.core(self.manager.pool.free_summary)
        teams = await self.core(self.manager.reclaims.team_report)
        self.write_json({"nodes": nodes, "free": free.as_dict(),
                         "unallocated_servers": self.context.reconcile_report(),
                         "teams": teams["teams"]})


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
