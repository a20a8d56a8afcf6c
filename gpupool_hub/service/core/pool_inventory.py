"""The pool's hardware as the service knows it: the placement pool, the price of
each model in it, and what the node agents last reported.

Admission, views and jobs ask this unit which models exist and how a held
allocation maps onto the placement pool; nobody else touches ``pool`` to add
or remove hardware. Agent reports live here (``reports``, in memory: the
enforcement answer asks an agent to report again when the service has no
report of its node, so after a restart every node is back within one agent
tick, and persisting them would only add a way to serve stale hardware facts).

With ``c.GPUPool.inventory = "agents"`` the reports *are* the pool: a report
that adds a node or changes one rebuilds the placement pool (:meth:`accept_report`),
and allocations on nodes not reported yet since a restart stay held in the
ledger until their node is back (:meth:`restore`). An allocation whose GPUs the pool
lacks (an unmapped Slurm GRES type, a node gone from the configuration) stays held
too, outside the pool, until the pool has them again (``unplaced.py``). Which node each device (GPU
or MIG UUID) belongs to *is* kept in the ledger database (``claims``): without
it, after a restart the first agent to report could claim another node's GPUs,
lock that node out and report its utilization (issue 27.12).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from datetime import datetime
from decimal import Decimal
from typing import Any

from ...inventory.agents import AgentInventory, AgentReports, NodeReport
from ...inventory.sources import InventorySource, NodeStatus
from ...ledger import AllocationRecord, Ledger
from ...placement.errors import InventoryError, PlacementError
from ...placement.hardware import Node, load_nodes
from ...placement.request import MILLI, Request, normalize_model
from ...placement.state import GPUShare, Placement, Pool
from ...money.pricing import PriceTable, PricingError, model_matches
from ...profiles import Profile
from ...reasons import RefusalReason
from .errors import Refused
from .threads import CoreThreads, writes
from .unplaced import UnplacedAllocations, fix_hint, missing_hardware

log = logging.getLogger("gpupool.inventory")

__all__ = ["DeviceOfAnotherNode", "NodeReport", "PoolInventory"]


class DeviceOfAnotherNode(InventoryError):
    """A report names a device another node reported: never allowed to that node's agent
    (403). ``remembered``: that node has not reported since the restart, and an admin may
    move the device (a GPU that really moved while its old node is gone)."""

    def __init__(self, message: str, remembered: bool) -> None:
        super().__init__(message)
        self.remembered = remembered


class PoolInventory:
    """The placement pool and its prices; the single owner of hardware facts."""

    def __init__(self, pool: Pool, prices: PriceTable, clock: Callable[[], datetime],
                 source: InventorySource | None = None, *, threads: CoreThreads | None = None) -> None:
        self.pool = pool
        self.prices = prices
        self.clock = clock
        self.threads = threads
        # with inventory "agents" the pool follows the agents' reports; the source shares their store
        self.source = source
        self.follows_reports = source is not None and source.follows_reports
        self.reports: AgentReports = source.reports if isinstance(source, AgentInventory) else AgentReports()
        # what the inventory source (Slurm, the agents' silence) last said; see apply_node_status
        self.node_status: dict[str, NodeStatus] = {}
        self.held_outside: dict[str, list[int]] = {}
        self.unavailable: dict[str, str] = {}
        self.problems: dict[str, str] = {}  # node -> what its source says an admin must fix
        # the configured profiles placement keeps room for (expect_profiles), declared again
        # whenever the pool is rebuilt: with inventory "agents" nodes, and models, come later
        self.expected_profiles: tuple[list[Profile], int | None] = ([], None)
        # per configured GPU profile (slug): its base request as declared (the spawn page's free count)
        self.profile_requests: dict[str, Request] = {}
        # device UUID -> node, as last reported (kept in the ledger: see the module docstring)
        self.claims: dict[str, str] = {}
        self.unplaced = UnplacedAllocations(fix_hint(source))  # held, but their GPUs are not in the pool
        self._models: tuple[Pool, frozenset[str]] | None = None
        prices.check_models(self.models())

    # ------------------------------------------------------------ models

    def models(self) -> set[str]:
        """The pool's GPU models (every admission asks: once per pool, not per GPU each time;
        a pool's nodes never change, a changed inventory is a new pool)."""
        cached = self._models
        if cached is None or cached[0] is not self.pool:
            cached = self._models = (self.pool, frozenset(g.model for ns in self.pool.nodes for g in ns.node.gpus))
        return set(cached[1])

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

    def expect_profiles(self, profiles: Iterable[Profile], owed_gpus: int | None = None) -> list[Request]:
        """Tell placement which request shapes may come, whatever history says (issue 18.1).

        Placement learns "typical requests" from history, so after weeks of
        5-GPU jobs a configured 8-GPU profile counts for nothing and team A's
        small servers spread over every node. Each GPU profile's shape (its
        base count, and for an adjustable one its largest count up to
        ``owed_gpus``, the most GPUs a team is owed) is declared with a floor
        weight, as admission will ask for it (models resolved like a request
        from a user who affords them all). Returns the declared shapes.
        """
        self.expected_profiles = (list(profiles), owed_gpus)
        shapes: list[Request] = []
        self.profile_requests = {}
        for p in self.expected_profiles[0]:
            if not p.needs_gpu or p.mig:  # MIG instances are placed by placement/mig.py, not the mix
                continue
            try:
                models = self.resolve_models(p.models) if p.models else frozenset(self.models())
            except Refused:  # a profile for a model this pool lacks: nothing to keep room for
                continue
            if not models:  # no GPU node yet (inventory "agents" before the first report)
                continue
            body = p.request()
            counts = {p.gpus} if not p.adjustable else {p.gpus, p.max_gpus if owed_gpus is None
                                                        else max(p.gpus, min(p.max_gpus, owed_gpus))}
            for n in sorted(counts):
                if not n and not p.gpu_milli:
                    continue
                shapes.append(Request(cpu_milli=body.get("cpu_milli", 0), memory_mib=body.get("memory_mib", 0),
                                      gpus=0 if p.gpu_milli else n, gpu_milli=p.gpu_milli, models=models))
                self.profile_requests.setdefault(p.slug, shapes[-1])  # the base count: the smallest
        self.pool.expect(shapes)
        if shapes:
            log.info("Placement keeps room for the configured shapes: %s",
                     ", ".join(sorted({r.describe() for r in shapes})))
        return shapes

    # -------------------------------------------------------- allocations

    def price_of(self, placement: Placement, share: str = "") -> Decimal:
        """Tokens per hour of a placement: GPUs by their share (a fraction times its class's
        factor, ``share`` or else ``timeslice``), a MIG instance by its profile
        (``c.GPUPool.mig_prices``, else its compute slices), whatever share was asked of it."""
        return sum((self.prices.mig_price_per_hour(g.model, g.mig_profile) if g.mig_profile
                    else self.prices.price_per_hour(g.model, Decimal(g.milli) / 1000,
                                                    (share or "timeslice") if g.milli < 1000 else "")
                    for g in placement.gpus), Decimal(0))

    def request_price(self, model: str, request: Request) -> Decimal:
        """What ``request`` would cost per hour on ``model`` (the affordability check)."""
        if request.mig:
            return self.prices.mig_price_per_hour(model, request.mig)
        share_class = (request.share or "timeslice") if request.gpu_milli else ""
        return self.prices.price_per_hour(model, Decimal(request.total_gpu_milli) / 1000, share_class)

    @staticmethod
    def placement_of(record: AllocationRecord) -> Placement:
        """A held allocation as the placement pool records it."""
        return Placement(
            node=record.node,
            gpus=tuple(GPUShare(g["index"], g["uuid"], g["model"], g["milli"], g.get("mig_uuid"), g.get("mig_profile"))
                       for g in record.gpus),
            cpu_milli=record.request.get("cpu_milli", 0), memory_mib=record.request.get("memory_mib", 0))

    def describe(self, record: AllocationRecord) -> str:
        return f"{self.pool.describe(self.placement_of(record))}, {record.price_per_hour:g} tokens/h"

    def restore(self, ledger: Ledger) -> int:
        """Rebuild the placement pool from the allocations the ledger says are held.

        With the agents inventory, allocations on nodes no agent has reported
        since the restart stay held: they go back into the pool when their
        node reports (:meth:`accept_report`). So does one whose GPUs the pool lacks, outside
        it (``unplaced``), said with a node status source's first word (Slurm's unmapped GRES type)."""
        restored = 0
        waiting = 0
        self.claims = ledger.nodes.devices()
        for record in ledger.allocations.active():
            if self.follows_reports and record.node not in self.pool.by_name:
                waiting += 1
                continue
            placement = self.placement_of(record)
            missing = missing_hardware(self.pool, placement)
            if missing:  # its server still runs on those GPUs: never release it for that
                self.unplaced.keep(record.id, f"{record.user}/{record.server or '-'}", placement, missing)
                continue
            try:
                self.pool.restore(record.id, placement)
                restored += 1
            except Exception as e:  # its GPUs are there but taken twice, or a bad record: release, loudly
                log.error("Releasing allocation %s of %s: cannot restore it (%s)", record.id, record.user, e)
                ledger.allocations.release(record.id, at=self.clock(), reason=f"not restorable: {e}")
        if waiting:
            log.info("%d allocation(s) on nodes not reported yet stay held until their agents report", waiting)
        if self.source is None or not self.source.dynamic:
            self.unplaced.say(self.problems)
        return restored

    def forget(self, alloc_id: str) -> None:
        """``alloc_id`` was released (Admission): if it was held outside the pool, it stays out."""
        self.unplaced.forget(alloc_id)

    # ------------------------------------------------------ agent reports

    def differences(self, node: Node) -> list[str]:
        """How a reported node differs from the configured pool (empty: it matches, or the
        pool is what the agents report)."""
        if self.follows_reports:
            return []
        configured = self.pool.by_name.get(node.name)
        return _differences(configured.node if configured is not None else None, node)

    def seen(self, name: str) -> NodeReport:
        """An agent of node ``name`` called: note when (with the agents inventory, that
        keeps the node taking placements)."""
        return self.reports.seen(name, self.clock())

    def attribution_reported(self, name: str, unattributed: dict[str, str]) -> NodeReport:
        """Node ``name``'s agent cannot attribute these GPUs' use (UUID -> why); the others it can."""
        return self.reports.attribution(name, unattributed, self.clock())

    def wants_report(self, name: str) -> bool:
        """Whether the service holds no inventory of node ``name`` (the agent should send it)."""
        report = self.reports.get(name)
        return report is None or report.inventory is None

    @writes
    def accept_report(self, name: str, inventory: dict[str, Any], node: Node,
                      ledger: Ledger | None = None, *, move_remembered: bool = False) -> NodeReport:
        """Store a node's validated inventory; with the agents inventory, a new or changed
        node rebuilds the pool (``ledger``: where allocations on nodes the pool did not
        have yet are read from, and where the node's devices are remembered). Raises
        :class:`InventoryError` for a report the pool cannot take (a model without a
        price), :class:`DeviceOfAnotherNode` for a device another node reported (unless
        ``move_remembered`` and that node has not reported since the restart); nothing
        is stored then. Runs on the writer thread."""
        if self.follows_reports:
            self._check_joinable(name, node, move_remembered)
            devices = {uuid for _, uuid in _devices(node)}
            if ledger is not None and devices != {d for d, n in self.claims.items() if n == name}:
                ledger.nodes.set_devices(name, devices, self.clock())
            self.claims = {**{d: n for d, n in self.claims.items() if n != name and d not in devices},
                           **dict.fromkeys(devices, name)}
        report = self.reports.accept(name, inventory, node, self.clock(), self.differences(node))
        if report.differences:
            log.warning("Node %s reports hardware that differs from the pool: %s", name,
                        "; ".join(report.differences))
        if self.source is not None and self.follows_reports:
            current = self.pool.by_name.get(name)
            if current is None or current.node != node:
                self._rebuild(ledger)
                log.info("Node %s %s the pool: %d GPU(s)", name, "joined" if current is None else "changed in",
                         len(node.gpus))
            if name in self.unavailable:  # back from silence: take placements now, not at the next refresh
                self.apply_node_status(self.source.node_status())
        return report

    def owner_of(self, uuid: str) -> str | None:
        """The node a device belongs to: the node that reports it now, else the node that
        reported it last (before a restart), else None."""
        for other in self.reports:
            report = self.reports.get(other)
            if report is not None and report.node is not None and any(u == uuid for _, u in _devices(report.node)):
                return other
        for ns in self.pool.nodes:
            if any(u == uuid for _, u in _devices(ns.node)):
                return ns.name
        return self.claims.get(uuid)

    def _check_joinable(self, name: str, node: Node, move_remembered: bool = False) -> None:
        """A report may not claim another node's devices, nor bring a GPU model without a price."""
        live: dict[str, str] = {}
        for other in self.reports:
            report = self.reports.get(other)
            if other != name and report is not None and report.node is not None:
                live.update((uuid, other) for _, uuid in _devices(report.node))
        for index, uuid in _devices(node):
            if uuid in live:
                raise DeviceOfAnotherNode(
                    f"device {uuid} of GPU {index} is already reported by node {live[uuid]!r}", remembered=False)
            owner = self.claims.get(uuid, name)
            if owner != name and not move_remembered:
                raise DeviceOfAnotherNode(
                    f"device {uuid} of GPU {index} belongs to node {owner!r} (its last report, kept across "
                    f"restarts); an admin may move it by sending this inventory", remembered=True)
        try:
            self.prices.check_models({g.model for g in node.gpus})
        except PricingError as e:
            raise InventoryError(str(e)) from None

    def _rebuild(self, ledger: Ledger | None) -> None:
        """A new placement pool over the reported nodes, holding what the old one held
        (allocations, reservations) and the ledger's allocations on nodes that just joined."""
        old = self.pool
        pool = Pool(load_nodes(self.reports.inventories()), policy=old.policy, seed=old.seed)
        held = {a: entry[3] for a, entry in old._allocs.items() if not self.is_outside(a)}
        who = {a: u.who for a, u in self.unplaced.items()}  # servers' allocations, not reservations
        held.update({a: u.placement for a, u in self.unplaced.items()})  # this report may bring their GPUs
        for record in ledger.allocations.active() if ledger is not None else ():
            held.setdefault(record.id, self.placement_of(record))
            who[record.id] = f"{record.user}/{record.server or '-'}"
        for alloc_id, placement in held.items():
            if placement.node not in pool.by_name:
                continue  # its node has not reported yet
            try:
                pool.restore(alloc_id, placement)
            except PlacementError as e:  # the node's hardware changed under it: the ledger keeps it
                if alloc_id not in who:
                    log.error("Reservation %s no longer fits its node's reported hardware (%s)", alloc_id, e)
                    continue
                self.unplaced.keep(alloc_id, who[alloc_id], placement, missing_hardware(pool, placement) or str(e))
            else:
                if alloc_id in self.unplaced:
                    self.unplaced.adopted(alloc_id, pool.describe(placement))
        self.pool = pool
        self.expect_profiles(*self.expected_profiles)  # models that just joined may have profiles
        self.apply_node_status(self.node_status)  # the source's last word, until its next refresh

    # --------------------------------------- the inventory source's status

    def is_outside(self, alloc_id: str) -> bool:
        """A placeholder allocation for what the hub does not hold (not a server's)."""
        return alloc_id.startswith((OUTSIDE, UNAVAILABLE))

    def drop_placeholders(self, node: str | None = None) -> None:
        """Take what is held outside the hub (of ``node``) out of the pool: ``apply_node_status`` puts it back."""
        for alloc_id in [a for a in list(self.pool._allocs) if self.is_outside(a)]:
            if node is None or alloc_id.split(":", 1)[1] == node:
                self.pool.release(alloc_id)

    @writes
    def apply_node_status(self, status: dict[str, NodeStatus]) -> None:
        """Make the pool refuse what its source says the hub cannot have.

        GPUs some job holds beyond the hub's own allocations on a node are held
        by a placeholder allocation ``outside:<node>`` (the indices Slurm
        says are in use and no server holds, else other free GPUs of the same
        model); a node that takes no placements (down in Slurm, its agent silent)
        gets ``unavailable:<node>``
        holding its free CPUs, memory and GPUs. Servers' allocations are never
        touched. Runs on the writer thread.
        """
        self.node_status = dict(status)
        self.problems = {name: st.problem for name, st in status.items() if st.problem}
        self.drop_placeholders()
        outside: dict[str, list[int]] = {}
        unavailable: dict[str, str] = {}
        for ns in self.pool.nodes:
            st = status.get(ns.name)
            if st is None:
                continue
            gpus = {g.index: g for g in ns.node.gpus}
            hub_held: set[int] = set()
            for s, pos in enumerate(ns.slot_gpu):
                if ns.holders[s]:
                    hub_held.add(ns.node.gpus[pos].index)
            in_use = {i for i in st.gpus_in_use if i in gpus}
            picked: list[int] = []
            for model in {g.model for g in ns.node.gpus}:
                used = [i for i in sorted(in_use) if gpus[i].model == model]
                mine = [i for i in sorted(hub_held) if gpus[i].model == model]
                count = max(len(used) - len(mine), 0)
                # Slurm's own indices first, then any other free GPU of the model
                order = [i for i in used if i not in hub_held] + [
                    i for i in sorted(gpus) if gpus[i].model == model and i not in hub_held and i not in used]
                picked += order[:count]
            free_slots = {ns.node.gpus[pos].index: s for s, pos in enumerate(ns.slot_gpu)
                          if ns.whole[s] and ns.free[s] == MILLI}
            picked = [i for i in picked if i in free_slots]
            if picked:
                self.pool.restore(f"{OUTSIDE}{ns.name}", Placement(node=ns.name, gpus=tuple(
                    GPUShare(i, gpus[i].uuid, gpus[i].model, MILLI) for i in sorted(picked))))
                outside[ns.name] = sorted(picked)
            if not st.takes_placements:
                rest = [gpus[i] for i in sorted(free_slots) if i not in picked]
                self.pool.restore(f"{UNAVAILABLE}{ns.name}", Placement(
                    node=ns.name, gpus=tuple(GPUShare(g.index, g.uuid, g.model, MILLI) for g in rest),
                    cpu_milli=max(ns.cpu_free, 0), memory_mib=max(ns.mem_free, 0)))
                unavailable[ns.name] = st.why_not or "takes no placements"
        changed = (outside, unavailable) != (self.held_outside, self.unavailable)
        self.held_outside = outside
        self.unavailable = unavailable
        if changed:  # once per change, not at every refresh while a node stays drained
            log.info("Held outside the hub: %s; nodes taking no placements: %s", outside or "none",
                     unavailable or "none")
        self.unplaced.say(self.problems)  # once per change of what to fix, not at every refresh

    def outside_note(self) -> str:
        """For a refusal: what outside the hub holds (empty when nothing)."""
        return _outside_note(self.pool, self.held_outside, self.unavailable)


def _differences(configured: Node | None, node: Node) -> list[str]:
    """How a reported node differs from its configured entry (None: not configured)."""
    if configured is None:
        return [f"node {node.name!r} is not in the configured pool (c.GPUPool.nodes)"]
    conf = {g.index: g for g in configured.gpus}
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


def _outside_note(pool: Pool, held_outside: dict[str, list[int]], unavailable: dict[str, str]) -> str:
    """For a refusal: what outside the hub holds (empty when nothing)."""
    parts = []
    for node, idx in sorted(held_outside.items()):
        models = sorted({g.model for g in pool.by_name[node].node.gpus if g.index in idx})
        parts.append(f"{len(idx)} {'/'.join(models)} GPU(s) on {node}")
    for node, why in sorted(unavailable.items()):
        parts.append(f"node {node} ({why})")  # "node gpu-a (drained: maint)", "node n2 (its node agent …)"
    if not parts:
        return ""
    return " Held outside the hub (jobs it did not start, or nodes it may not use): " + "; ".join(parts) + "."


def _devices(node: Node) -> list[tuple[int, str]]:
    """(GPU index, UUID) of every GPU and MIG instance of a node."""
    return [(g.index, uuid) for g in node.gpus for uuid in (g.uuid, *(m.uuid for m in g.mig))]


#: placeholder allocations of the inventory source (GET pool marks their holders held_outside)
OUTSIDE = "outside:"
UNAVAILABLE = "unavailable:"
