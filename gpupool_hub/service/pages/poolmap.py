"""The admin pool map (``{prefix}admin/pool``): every GPU as a cell, or, for a large
pool, a summary per model that drills down.

A cell per GPU is what an admin of a few nodes wants: who holds what, at a
glance. At 1,000 nodes that is 10,000 cells, several megabytes of SVG that no
one reads. So past ``FULL_MAP_NODES`` nodes the page shows one row per GPU model
(nodes, GPUs, held, free, the largest free block), the nodes that need
attention, and the top holders; a model's link (``?model=``) or a search by
node name (``?node=``) draws the cells of the matching nodes, ``NODES_PER_PAGE``
at a time. The page's size then grows with what is shown, not with the pool.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from collections.abc import Iterable
from typing import Any

from tornado import web

from ..api.httpargs import INT64_MAX
from ..api.openapi import text_problem
from .admin import AdminPage
from .charts import RESERVED, gpu_cell, holder_colours

#: up to this many nodes, and with no filter, the map draws every GPU
FULL_MAP_NODES = 32
#: nodes drawn per page of a drill-down
NODES_PER_PAGE = 25
#: holders listed in the legend of a summary (the largest first)
TOP_HOLDERS = 20
#: allocations listed under a summary (the newest first); a drill-down lists those of its nodes
ALLOCATIONS_SHOWN = 100
#: nodes needing attention listed on a summary
ATTENTION_SHOWN = 50
#: waiting servers listed (the queue's order: the next to start first)
WAITING_SHOWN = 100


@dataclass
class ModelRow:
    """One GPU model of the pool, summed over its nodes."""

    model: str
    nodes: int = 0
    gpus: int = 0
    held_milli: int = 0
    mig_gpus: int = 0

    @property
    def held(self) -> str:
        return f"{self.held_milli / 1000:g}"


def model_rows(per_model: dict[str, dict[str, int]]) -> list[ModelRow]:
    """One row per GPU model, in name order (from ``Pool.held_per_model()``)."""
    return [ModelRow(model, nodes=e["nodes"], gpus=e["gpus"], held_milli=e["held_milli"], mig_gpus=e["mig_gpus"])
            for model, e in sorted(per_model.items())]


def matching(nodes: Iterable[Any], model: str, search: str) -> list[str]:
    """The names of the nodes (``Pool.nodes``) holding a GPU of ``model`` (any, when empty)
    whose name contains ``search``: a drill-down draws a page of them, not the pool."""
    search = search.casefold()
    return [ns.name for ns in nodes
            if (not model or any(g.model == model for g in ns.node.gpus))
            and (not search or search in ns.name.casefold())]


class PoolMapHandler(AdminPage):
    """Every node's GPUs as cells coloured by their holders; for a large pool, a summary
    per model first (see the module's docstring)."""

    title = "Pool map"

    def _text(self, name: str) -> str:
        value = self.get_argument(name, "").strip()
        problem = text_problem(value, max_length=255, allow_empty=True)
        if problem:
            raise web.HTTPError(400, f"{name} {problem}")
        return value

    async def get(self) -> None:
        m = self.manager
        model, search = self._text("model"), self._text("node")
        page = self.int_arg("page", 1, minimum=1, maximum=INT64_MAX // NODES_PER_PAGE)
        # reservations of a reclaim in progress are not allocations: their cells say "reserved"
        who = await m.records.active_holders.off_loop()
        summary = not model and not search and len(m.pool.nodes) > FULL_MAP_NODES
        if summary:  # one pass over the pool: no cell, no snapshot of every GPU
            per_model, by_alloc, free = await m.views.pool_summary.off_loop()
            node_count, matched, nodes = len(m.pool.nodes), 0, []
            holders: dict[str, float] = {}  # the legend counts the whole pool's holders, the largest first
            for alloc, milli in by_alloc.items():
                user = who.get(alloc, (RESERVED,))[0]
                holders[user] = holders.get(user, 0.0) + milli / 1000
            top = sorted(holders.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_HOLDERS]
            allocations = await m.records.active_allocations_on.off_loop(newest=ALLOCATIONS_SHOWN)
            allocations_total = len(who)  # the newest of the whole pool, of how many
        else:
            names = matching(m.pool.nodes, model, search)  # a pool's nodes never change
            node_count, matched, per_model = len(m.pool.nodes), len(names), {}
            if model or search or matched > FULL_MAP_NODES:
                names = names[(page - 1) * NODES_PER_PAGE:page * NODES_PER_PAGE]
            shown = await m.views.pool_snapshot.off_loop(names)
            free = await m.views.free_summary.off_loop()
            nodes, holders = self._nodes(shown, who)
            top = sorted(holders.items())
            allocations = await m.records.active_allocations_on.off_loop(nodes=[n["name"] for n in nodes])
            allocations_total = len(allocations)
        colours = holder_colours(u for u, _ in top)
        legend = [(u, colours[u], f"{n:g}") for u, n in top]
        inventory = m.inventory
        attention = [(name, inventory.unavailable.get(name) or inventory.problems.get(name))
                     for name in sorted({*inventory.unavailable, *inventory.problems})]
        # who waits for what: the first rows of GET queue's report, only those built
        waiting, waiting_total = await m.queue.reports.first_waiting.off_loop(WAITING_SHOWN)
        self.render_page(
            "admin/pool.html", nodes=nodes, waiting=waiting, waiting_total=waiting_total, legend=legend,
            held_nodes=await m.queue.reports.held_nodes.off_loop(),
            free=free.per_model,
            eta_accuracy=await m.queue.eta.accuracy.off_loop(),  # the wait estimates' record: a read-only query
            outside=self.context.reconcile_report(),
            reclaims=(await m.reclaims.team_report.off_loop())["reclaims"],  # the writer changes them
            allocations=allocations[:ALLOCATIONS_SHOWN], allocations_total=allocations_total,
            unsettled=await m.records.unsettled_allocations.off_loop(),  # pending jobs, stops not confirmed
            summary=summary, models=model_rows(per_model), model=model, search=search,
            page=page, pages=max(1, -(-matched // NODES_PER_PAGE)), matched=matched,
            node_count=node_count, attention=attention[:ATTENTION_SHOWN], attention_total=len(attention),
        )

    def _nodes(self, shown: list[dict[str, Any]], who: dict[str, tuple[str, str, bool]]
               ) -> tuple[list[dict[str, Any]], dict[str, float]]:
        """The drawn nodes (cells and notes) and the GPUs each of their holders has on them."""
        m = self.manager
        colours = holder_colours(who.get(a, (RESERVED,))[0] for n in shown for g in n["gpus"] for a in g["holders"])
        own = m.idle.own_utilization()  # each server's own figure, as of the idle job's last run
        nodes, holders = [], {}
        for node in shown:
            report = m.inventory.reports.get(node["node"])
            cells = [gpu_cell(g, who, colours) for g in node["gpus"]]
            for cell in cells:
                cell.parts = [replace(p, utilization=own.get(p.allocation)) for p in cell.parts]
                cell.cannot_attribute = report.unattributed.get(cell.uuid) if report is not None else None
                for part in cell.parts:
                    holders[part.user] = holders.get(part.user, 0.0) + float(part.fraction)
            nodes.append({"name": node["node"], "labels": node["labels"], "cells": cells,
                          "cpu": (node["cpu_milli"] - node["cpu_free"], node["cpu_milli"]),
                          "memory": (node["memory_mib"] - node["memory_free"], node["memory_mib"]),
                          "report": report, "unavailable": m.inventory.unavailable.get(node["node"]),
                          "problem": m.inventory.problems.get(node["node"])})
        return nodes, holders

