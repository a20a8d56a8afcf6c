"""The pool's hardware as the service knows it: the placement pool, the price of
each model in it, and what the node agents last reported.

Admission, views and jobs ask this unit which models exist and how a held
allocation maps onto the placement pool; nobody else touches ``pool`` to add
or remove hardware. Agent reports live here (in memory: an agent re-reports
within minutes after a restart, so persisting them would only add a way to
serve stale hardware facts).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from decimal import Decimal
from typing import Any

from ..ledger import AllocationRecord, Ledger
from ..placement.inventory import Node
from ..placement.request import normalize_model
from ..placement.state import GPUShare, Placement, Pool
from ..pricing import PriceTable, PricingError, model_matches
from ..reasons import RefusalReason
from ..units import format_tokens
from .errors import Refused

log = logging.getLogger("gpupool.inventory")


@dataclass
class NodeReport:
    """The latest word of one node's agent."""

    inventory: dict[str, Any] | None = None
    node: Node | None = None
    received_at: datetime | None = None
    last_seen: datetime | None = None
    differences: list[str] = field(default_factory=list)


class PoolInventory:
    """The placement pool and its prices; the single owner of hardware facts."""

    def __init__(self, pool: Pool, prices: PriceTable, clock: Callable[[], datetime]) -> None:
        self.pool = pool
        self.prices = prices
        self.clock = clock
        self.reports: dict[str, NodeReport] = {}
        prices.check_models(self.models())

    # ------------------------------------------------------------ models

    def models(self) -> set[str]:
        return {g.model for ns in self.pool.nodes for g in ns.node.gpus}

    def gpu_count(self) -> int:
        return sum(len(ns.node.gpus) for ns in self.pool.nodes)

    def resolve_models(self, names: Iterable[str] | None) -> frozenset[str] | None:
        """Turn profile names ("RTX 3090") into the pool's reported model strings."""
        if names is None:
            return None
        names = list(names)
        models = self.models()
        out = {m for m in models for name in names if model_matches(name, m) or name.lower() == m.lower()}
        if not out:
            raise Refused(
                RefusalReason.MODEL_UNAVAILABLE,
                f"No GPU of model {' or '.join(sorted(names))} exists in this pool; "
                f"available models: {', '.join(sorted(models)) or 'none'}.",
                details={"requested": sorted(names), "available": sorted(models)},
            )
        return frozenset(out)

    def models_matching(self, allowed: frozenset[str] | None) -> set[str]:
        """Pool models a request with ``allowed`` (normalized names, or None for any) may use."""
        return {g.model for ns in self.pool.nodes for g in ns.node.gpus
                if allowed is None or normalize_model(g.model) in allowed}

    def catalog(self, min_start_hours: Decimal) -> dict[str, Any]:
        """Per pool GPU model: price per GPU-hour, GPUs in the pool and whole GPUs free."""
        free = self.pool.free_summary().per_model
        counts: dict[str, int] = {}
        for ns in self.pool.nodes:
            for g in ns.node.gpus:
                counts[g.model] = counts.get(g.model, 0) + 1
        models = []
        for model in sorted(counts):
            try:
                price: str | None = format_tokens(self.prices.price_per_gpu_hour(model))
            except PricingError:
                price = None
            e = free.get(model, {})
            models.append({"model": model, "price_per_gpu_hour": price, "gpus": counts[model],
                           "whole_free": e.get("whole_free", 0),
                           "largest_whole_block": e.get("largest_whole_block", 0)})
        return {"models": models, "min_start_hours": format_tokens(min_start_hours)}

    # -------------------------------------------------------- allocations

    def price_of(self, placement: Placement) -> Decimal:
        return sum((self.prices.price_per_gpu_hour(g.model) * Decimal(g.milli) / 1000 for g in placement.gpus),
                   Decimal(0))

    @staticmethod
    def placement_of(record: AllocationRecord) -> Placement:
        """A held allocation as the placement pool records it."""
        return Placement(
            node=record.node,
            gpus=tuple(GPUShare(g["index"], g["uuid"], g["model"], g["milli"], g.get("mig_uuid")) for g in record.gpus),
            cpu_milli=record.request.get("cpu_milli", 0), memory_mib=record.request.get("memory_mib", 0))

    def describe(self, record: AllocationRecord) -> str:
        return f"{self.pool.describe(self.placement_of(record))}, {record.price_per_hour:g} tokens/h"

    def restore(self, ledger: Ledger) -> int:
        """Rebuild the placement pool from the allocations the ledger says are held."""
        restored = 0
        for record in ledger.active_allocations():
            try:
                self.pool.restore(record.id, self.placement_of(record))
                restored += 1
            except Exception as e:  # the node left the inventory, or a conflict: release, loudly
                log.error("Releasing allocation %s of %s: cannot restore it (%s)", record.id, record.user, e)
                ledger.release_allocation(record.id, at=self.clock(), reason=f"not restorable: {e}")
        return restored

    # ------------------------------------------------------ agent reports

    def differences(self, node: Node) -> list[str]:
        """How a reported node differs from the configured pool (empty: it matches)."""
        configured = self.pool.by_name.get(node.name)
        if configured is None:
            return [f"node {node.name!r} is not in the configured pool (c.GPUPool.nodes)"]
        conf = {g.index: g for g in configured.node.gpus}
        seen = {g.index: g for g in node.gpus}
        out = []
        for index in sorted(set(conf) | set(seen)):
            c, s = conf.get(index), seen.get(index)
            if c is None:
                out.append(f"GPU {index} ({s.model}) is present but not configured")  # type: ignore[union-attr]
            elif s is None:
                out.append(f"GPU {index} ({c.model}) is configured but not present")
            elif normalize_model(c.model) != normalize_model(s.model):
                out.append(f"GPU {index} is a {s.model}, configured as {c.model}")
        return out

    def seen(self, name: str) -> NodeReport:
        """An agent of node ``name`` called: note when."""
        report = self.reports.setdefault(name, NodeReport())
        report.last_seen = self.clock()
        return report

    def accept_report(self, name: str, inventory: dict[str, Any], node: Node) -> NodeReport:
        report = self.reports.setdefault(name, NodeReport())
        report.inventory = inventory
        report.node = node
        report.received_at = self.clock()
        report.differences = self.differences(node)
        if report.differences:
            log.warning("Node %s reports hardware that differs from the pool: %s", name,
                        "; ".join(report.differences))
        return report
