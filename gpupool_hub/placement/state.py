"""The live pool: what is allocated where, updated incrementally.

One :class:`Pool` lives in the hub process. ``allocate`` asks the policy for a
node and devices among the nodes that fit *now*, then applies the choice in
O(GPUs on that node); ``release`` is its exact inverse. Nothing is rebuilt per
request: policies see per-node aggregates (free CPU, memory, per-device free
milli-GPU, count of whole free GPUs) kept current on every change, plus an
interned signature id of the node's state that lets them cache scores across
identical nodes and across requests.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Dict, FrozenSet, Iterable, List, Mapping, Optional, Tuple

from .errors import ModelUnavailable, NoCapacity, PlacementConflict, PlacementError
from . import mig as mig_placement
from . import kept, pins, report, scarce
from .hardware import MigDevice, Node, load_node
from .mix import DEFAULT_FLOOR_WEIGHT, DEFAULT_RESERVE, Expected
from .request import MILLI, Request, model_allowed


@dataclass(frozen=True, slots=True)
class GPUShare:
    """One device of a placement: ``milli`` is 1000 for a whole GPU.

    On a MIG instance, ``mig_uuid`` names it and ``mig_profile`` is its
    profile: what the server's CUDA_VISIBLE_DEVICES and its price go by.
    """

    index: int
    uuid: str
    model: str
    milli: int
    mig_uuid: Optional[str] = None
    mig_profile: Optional[str] = None


@dataclass(frozen=True, slots=True)
class Placement:
    node: str
    gpus: Tuple[GPUShare, ...]
    cpu_milli: int = 0
    memory_mib: int = 0

    @property
    def gpu_milli(self) -> int:
        return sum(g.milli for g in self.gpus)


class NodeState:
    """Mutable per-node bookkeeping; policies read it, only the Pool writes it.

    Devices are "slots": one per plain GPU, one per MIG instance of a MIG GPU.
    ``free[s]`` is the free milli-GPU of slot ``s``.
    """

    __slots__ = (
        "i", "node", "name", "model_key", "models", "slot_gpu", "slot_mig", "slot_model",
        "cap", "whole", "cpu_free", "mem_free", "free", "n_full", "max_free", "total_free",
        "holders", "sig", "sig_id", "rank", "real", "cap_total", "uuid_slots",
    )

    def __init__(self, i: int, node: Node, rank: int) -> None:
        self.i = i
        self.node = node
        self.name = node.name
        self.rank = rank
        self.real = self
        slot_gpu: List[int] = []
        slot_mig: List[Optional[MigDevice]] = []
        cap: List[int] = []
        whole: List[bool] = []
        for pos, g in enumerate(node.gpus):
            if g.mig:
                for m in g.mig:
                    slot_gpu.append(pos)
                    slot_mig.append(m)
                    cap.append(m.milli)
                    whole.append(False)
            else:
                slot_gpu.append(pos)
                slot_mig.append(None)
                cap.append(MILLI)
                whole.append(True)
        self.slot_gpu = slot_gpu
        self.slot_mig = slot_mig
        self.slot_model = [node.gpus[p].model_key for p in slot_gpu]
        self.models = frozenset(g.model_key for g in node.gpus)
        self.model_key = next(iter(self.models)) if len(self.models) == 1 else ("" if not self.models else "<mixed>")
        self.cap = cap
        self.cap_total = sum(cap)
        self.whole = whole
        # device UUID -> its slots: a plain GPU's or MIG instance's own slot; a MIG GPU's UUID -> all its instances
        uuid_slots: Dict[str, Tuple[int, ...]] = {}
        for s, pos in enumerate(slot_gpu):
            g = node.gpus[pos]
            uuid_slots[g.uuid] = uuid_slots.get(g.uuid, ()) + (s,)
            if slot_mig[s] is not None:
                uuid_slots[slot_mig[s].uuid] = (s,)
        self.uuid_slots = uuid_slots
        self.cpu_free = node.cpu_milli
        self.mem_free = node.memory_mib
        self.free = list(cap)
        self.holders: List[Dict[str, int]] = [dict() for _ in cap]
        self.sig = None
        self.sig_id = -1
        self.n_full = 0
        self.max_free = 0
        self.total_free = 0

    def refresh(self) -> None:
        """Recompute aggregates after a change (O(devices on this node))."""
        free = self.free
        whole = self.whole
        self.n_full = sum(1 for s, f in enumerate(free) if f == MILLI and whole[s])
        self.max_free = max(free) if free else 0
        self.total_free = sum(free)

    def masked(self, allowed: FrozenSet[str]) -> "NodeState":
        """A read-only view of a mixed-model node with disallowed devices hidden."""
        v = object.__new__(NodeState)
        for a in NodeState.__slots__:
            setattr(v, a, getattr(self, a))
        v.free = [f if model_allowed(m, allowed) else 0 for f, m in zip(self.free, self.slot_model)]
        v.models = frozenset(m for m in self.models if m in allowed)
        v.model_key = next(iter(v.models)) if len(v.models) == 1 else "<mixed>"
        v.refresh()
        v.real = self
        return v


class Pool:
    """The GPU pool: static inventory plus live allocations.

    ``seed`` fixes the random node order used to break ties, so the same state
    and request always give the same answer.
    """

    def __init__(self, nodes: Iterable[Node | Mapping[str, Any]], policy: Any = None, *, seed: int = 0) -> None:
        from .policies import get_policy  # local import: policies import this module

        node_list = [n if isinstance(n, Node) else load_node(n, f"nodes[{i}]") for i, n in enumerate(nodes)]
        names = [n.name for n in node_list]
        if len(set(names)) != len(names):
            raise PlacementConflict("node names must be unique")
        order = list(range(len(node_list)))
        random.Random(seed).shuffle(order)
        rank = {idx: r for r, idx in enumerate(order)}
        self.seed = seed
        self.nodes: List[NodeState] = [NodeState(i, n, rank[i]) for i, n in enumerate(node_list)]
        self.by_name: Dict[str, NodeState] = {ns.name: ns for ns in self.nodes}
        self.by_device: Dict[str, NodeState] = {u: ns for ns in self.nodes for u in ns.uuid_slots}
        # Per model key: nodes with no GPU in use (what keep_whole_nodes protects), and nodes by
        # their number of whole free GPUs (what protects declared k-GPU shapes); kept in O(1) per change.
        self._idle: Dict[str, int] = {}
        self._by_whole: Dict[str, List[int]] = {}
        for ns in self.nodes:
            if ns.cap_total:
                self._idle[ns.model_key] = self._idle.get(ns.model_key, 0) + 1
            hist = self._by_whole.setdefault(ns.model_key, [0] * (len(ns.free) + 1))
            if len(hist) <= len(ns.free):
                hist.extend([0] * (len(ns.free) + 1 - len(hist)))
        self._sig_ids: Dict[tuple, int] = {}
        self.sig_epoch = 0  # bumps when the signature table is reset; policies drop caches then
        for ns in self.nodes:
            ns.refresh()
            self._resign(ns)
            self._by_whole[ns.model_key][ns.n_full] += 1
        self._allocs: Dict[str, Tuple[NodeState, Tuple[int, ...], Tuple[int, ...], Placement]] = {}
        self._ever_fits: Dict[tuple, bool] = {}
        self._weights: Optional[List[int]] = None  # per node: scarce nodes last (see expect)
        self._kept: Tuple[kept.Guard, ...] = ()  # declared shapes whose last nodes are kept whole (see expect)
        self._model_nodes: Dict[Optional[FrozenSet[str]], Tuple[List[NodeState], List[NodeState]]] = {}
        self.all_model_keys = frozenset(k for ns in self.nodes for k in ns.models)
        self.max_cpu = max((n.cpu_milli for n in node_list), default=1) or 1
        self.max_gpu_milli = max((sum(ns.cap) for ns in self.nodes), default=MILLI) or MILLI
        self.capacity_gpu_milli = sum(sum(ns.cap) for ns in self.nodes)
        self.allocated_gpu_milli = 0
        self.releases = 0  # counts release(): whoever saw the pool unable to place something can tell
        # whether it may have changed its mind since (only a release frees capacity)
        self.changes = 0  # counts every allocation and release: a summary of the pool is of one count
        if policy is None:
            policy = "fgd"
        self.policy = get_policy(policy) if isinstance(policy, str) else policy
        self.policy.bind(self)

    # -- signatures -------------------------------------------------------
    def _resign(self, ns: NodeState) -> None:
        sig = (ns.model_key, ns.cpu_free, ns.mem_free, tuple(sorted(ns.free, reverse=True)))
        ns.sig = sig
        sid = self._sig_ids.get(sig)
        if sid is None:
            if len(self._sig_ids) >= 500_000:  # bound memory in a long-lived service
                self._sig_ids.clear()
                self.sig_epoch += 1
                for other in self.nodes:
                    if other is not ns:
                        other.sig_id = self._sig_ids.setdefault(other.sig, len(self._sig_ids))
            sid = self._sig_ids.setdefault(sig, len(self._sig_ids))
        ns.sig_id = sid

    def sig_id_of(self, sig: tuple) -> int:
        """Intern a signature for a masked view (mixed-model nodes)."""
        return self._sig_ids.setdefault(sig, len(self._sig_ids))

    # -- lookups ----------------------------------------------------------
    def _nodes_for(self, models: Optional[FrozenSet[str]]) -> Tuple[List[NodeState], List[NodeState]]:
        """(homogeneous nodes whose model is allowed, mixed nodes with some allowed model)."""
        hit = self._model_nodes.get(models)
        if hit is None:
            if models is None:
                hit = (self.nodes, [])
            else:
                plain = [ns for ns in self.nodes if len(ns.models) == 1 and ns.model_key in models]
                mixed = [ns for ns in self.nodes if len(ns.models) > 1 and ns.models & models]
                hit = (plain, mixed)
            self._model_nodes[models] = hit
        return hit

    def expect(self, shapes: Expected, floor_weight: float = DEFAULT_FLOOR_WEIGHT,
               reserve: int = DEFAULT_RESERVE) -> None:
        """Declare request shapes that may come, whatever history says.

        ``shapes``: :class:`Request` objects (configured profiles, shapes a team
        is owed under its quota), or a mapping request → its own floor. Each
        keeps at least ``floor_weight`` of the request mix the policy plans for,
        so a configured 8-GPU profile keeps a whole node free even after weeks
        of small requests. Replaces the previous declaration; an empty list
        clears it. Raises :class:`InvalidRequest` for a bad declaration.

        The nodes that are the only home of a declared shape fitting at most half of
        them are then allocated last (:mod:`.scarce`): a small request lands there only
        when it fits nowhere else, so the big shape finds them free or draining. And the
        last :data:`.kept.KEEP_WHOLE` nodes able to host a declared shape of several GPUs
        are kept from smaller requests, which wait instead (:mod:`.kept`), where those
        are at most a quarter of the nodes it fits.
        """
        # MIG requests never reach the policy (placement/mig.py places them): not part of its mix
        if isinstance(shapes, Mapping):
            shapes = {r: w for r, w in shapes.items() if not (isinstance(r, Request) and r.mig)}
        else:
            shapes = [r for r in shapes if not (isinstance(r, Request) and r.mig)]
        self.policy.expect(shapes, floor_weight, reserve)
        self._weights = scarce.node_weights(self.nodes, shapes)  # validated by the policy above
        self._kept = kept.guards(self.nodes, shapes)

    def idle_nodes(self, model_key: str) -> int:
        """How many nodes of this (normalized) GPU model have no GPU in use."""
        return self._idle.get(model_key, 0)

    def nodes_with_whole(self, k: int, models: Optional[FrozenSet[str]] = None) -> int:
        """How many nodes (of the allowed models) have at least ``k`` whole free GPUs right now."""
        total = 0
        for mk, hist in self._by_whole.items():
            if models is None or mk in models:
                total += sum(hist[k:])
        return total

    def candidates(self, req: Request) -> List[NodeState]:
        """Nodes that can take ``req`` right now (a fresh list; order = config order).

        With ``required`` devices only their node qualifies, and only while
        they are free; with ``preferred`` ones, the nodes holding the most of
        them (usable now) are the only candidates if any holds one.
        """
        if req.mig:
            return [ns for ns in self.nodes if ns.cpu_free >= req.cpu_milli and ns.mem_free >= req.memory_mib
                    and mig_placement.free_instances(ns, req)]
        out = self._candidates(req)
        if req.required:
            node = pins.pin_node(self.by_device, req)
            return pins.keep_required(out, node, req) if node is not None else []
        if req.preferred and out:
            return pins.keep_preferred(out, req)
        return out

    def _candidates(self, req: Request) -> List[NodeState]:
        c, m = req.cpu_milli, req.memory_mib
        if not req.gpus and not req.gpu_milli:
            return [n for n in self.nodes if n.cpu_free >= c and n.mem_free >= m]
        plain, mixed = self._nodes_for(req.models)
        if req.gpu_milli:
            f = req.gpu_milli
            out = [n for n in plain if n.max_free >= f and n.cpu_free >= c and n.mem_free >= m]
        else:
            k = req.gpus
            out = [n for n in plain if n.n_full >= k and n.cpu_free >= c and n.mem_free >= m]
        if mixed:
            for n in mixed:
                if n.cpu_free < c or n.mem_free < m:
                    continue
                v = n.masked(req.models)  # type: ignore[arg-type]
                if (req.gpu_milli and v.max_free >= req.gpu_milli) or (req.gpus and v.n_full >= req.gpus):
                    v.sig = (v.model_key, v.cpu_free, v.mem_free, tuple(sorted(v.free, reverse=True)))
                    v.sig_id = self.sig_id_of(v.sig)
                    out.append(v)
        return out

    def could_ever_fit(self, req: Request) -> bool:
        """Whether the request fits some node of this pool when that node is empty."""
        if req.mig:
            return any(mig_placement.fits_node(ns, req) for ns in self.nodes)
        if req.required:
            return pins.why_never(self.by_device, req) is None
        for ns in self.nodes:
            n = ns.node
            if n.cpu_milli < req.cpu_milli or n.memory_mib < req.memory_mib:
                continue
            if not req.gpus and not req.gpu_milli:
                return True
            ok = [s for s, mk in enumerate(ns.slot_model) if model_allowed(mk, req.models)]
            if req.gpu_milli and any(ns.cap[s] >= req.gpu_milli for s in ok):
                return True
            if req.gpus and sum(1 for s in ok if ns.whole[s]) >= req.gpus:
                return True
        return False

    def open_to(self, req: Request, cands: Optional[List[NodeState]] = None) -> List[NodeState]:
        """The candidates (default: :meth:`candidates`) ``req`` may take now: not the last nodes
        kept whole for a declared shape of more GPUs (:mod:`.kept`)."""
        if cands is None:
            cands = self.candidates(req)
        return kept.allowed(self, req, cands, self._kept) if self._kept else cands

    def kept_nodes(self) -> List[str]:
        """The nodes kept whole for a declared shape of several GPUs now (:mod:`.kept`)."""
        return kept.kept_nodes(self, self._kept) if self._kept else []

    def withheld(self, req: Request) -> Dict[str, int]:
        """Per model, the whole free GPUs kept now from ``req`` for a shape of more GPUs (:mod:`.kept`)."""
        return kept.withheld(self, req, self._kept) if self._kept else {}

    def open_blocks(self, req: Request) -> Dict[str, int]:
        """Per model of which GPUs are kept from ``req``, the most whole free GPUs on one node it may take."""
        return kept.open_blocks(self, req, self._kept) if self._kept else {}

    # -- the API the hub uses ----------------------------------------------
    def allocate(self, alloc_id: str, req: Request, *, avoid: FrozenSet[str] = frozenset()) -> Placement:
        """Place ``req`` and record it under ``alloc_id``; never on a node named in ``avoid``
        (the wait queue holds a node back for the request at its head).

        Raises :class:`NoCapacity` when it would fit an empty pool but not now,
        :class:`ModelUnavailable` when it can never fit this pool.
        """
        if alloc_id in self._allocs:
            raise PlacementConflict(f"allocation id {alloc_id!r} is already in use")
        policy = self.policy
        if not req.mig:  # the policies never see MIG requests (placement/mig.py chooses)
            policy.observe(req)
        cands = self.candidates(req)
        if avoid:
            cands = [c for c in cands if c.name not in avoid]
        if self._kept and cands:
            cands = self.open_to(req, cands)
        if not cands:
            self._refuse(req)
        if self._weights is not None and len(cands) > 1:  # scarce nodes last (placement/scarce.py)
            cands = scarce.heaviest(cands, self._weights)
        ns, slots = mig_placement.choose(req, cands) if req.mig else policy.select(req, cands)
        return self._apply(alloc_id, req, ns.real, tuple(slots))

    def _refuse(self, req: Request) -> None:
        if req.models is not None and (req.gpus or req.gpu_milli or req.mig) and not (req.models & self.all_model_keys):
            have = ", ".join(sorted({g.model for ns in self.nodes for g in ns.node.gpus})) or "none"
            raise ModelUnavailable(
                f"no node in this pool has GPU model {' or '.join(sorted(req.models))} (available: {have})")
        if req.required and not req.mig:
            never = pins.why_never(self.by_device, req)
            if never:
                raise ModelUnavailable(never)
        key = (req.cpu_milli, req.memory_mib, req.gpus, req.gpu_milli, req.models, req.required, req.mig)
        ever = self._ever_fits.get(key)
        if ever is None:
            ever = self._ever_fits[key] = self.could_ever_fit(req)
        if not ever:
            raise ModelUnavailable(f"no node in this pool could ever fit {req.describe()}")
        raise NoCapacity(f"no room right now for {req.describe()}", free=self.free_summary)

    def _apply(self, alloc_id: str, req: Request, ns: NodeState, slots: Tuple[int, ...]) -> Placement:
        node = ns.node
        if ns.cpu_free < req.cpu_milli or ns.mem_free < req.memory_mib:
            raise PlacementError(f"policy chose {ns.name}, which lacks CPU or memory")  # policy bug
        charges: List[int] = []
        if req.mig:
            if len(slots) != 1 or slots[0] not in mig_placement.free_instances(ns, req):
                raise PlacementError(f"policy chose devices {slots} of {ns.name}, not one free {req.mig} instance")
            charges.append(ns.cap[slots[0]])
        elif req.gpu_milli:
            if len(slots) != 1:
                raise PlacementError("a fractional request takes exactly one device")
            s = slots[0]
            charge = ns.cap[s] if ns.slot_mig[s] is not None else req.gpu_milli
            if ns.free[s] < charge or ns.cap[s] < req.gpu_milli or not model_allowed(ns.slot_model[s], req.models):
                raise PlacementError(f"policy chose device {s} of {ns.name}, which cannot take {req.gpu_milli} milli")
            charges.append(charge)
        elif req.gpus:
            if len(slots) != req.gpus or len(set(slots)) != len(slots):
                raise PlacementError("policy returned the wrong number of GPUs")
            for s in slots:
                if not ns.whole[s] or ns.free[s] != MILLI or not model_allowed(ns.slot_model[s], req.models):
                    raise PlacementError(f"policy chose GPU slot {s} of {ns.name}, which is not wholly free")
                charges.append(MILLI)
        elif slots:
            raise PlacementError("a request without GPUs takes no devices")
        shares = []
        for s, ch in zip(slots, charges):
            g = node.gpus[ns.slot_gpu[s]]
            mig = ns.slot_mig[s]
            milli = ch if req.mig else (req.gpu_milli or MILLI)
            shares.append(GPUShare(g.index, g.uuid, g.model, milli, mig.uuid if mig else None,
                                   mig_placement.instance_profile(mig) if mig else None))
        placement = Placement(node=ns.name, gpus=tuple(shares), cpu_milli=req.cpu_milli, memory_mib=req.memory_mib)
        self._commit(alloc_id, ns, slots, tuple(charges), placement)
        return placement

    def _commit(self, alloc_id: str, ns: NodeState, slots: Tuple[int, ...], charges: Tuple[int, ...], placement: Placement) -> None:
        if slots and ns.total_free == ns.cap_total:
            self._idle[ns.model_key] -= 1
        self._by_whole[ns.model_key][ns.n_full] -= 1
        ns.cpu_free -= placement.cpu_milli
        ns.mem_free -= placement.memory_mib
        for s, ch in zip(slots, charges):
            ns.free[s] -= ch
            ns.holders[s][alloc_id] = ch
            self.allocated_gpu_milli += ch
        ns.refresh()
        self._by_whole[ns.model_key][ns.n_full] += 1
        self._resign(ns)
        self._allocs[alloc_id] = (ns, slots, charges, placement)
        self.changes += 1

    def release(self, alloc_id: str) -> Placement:
        """Give back everything ``alloc_id`` held; the exact inverse of allocate."""
        try:
            ns, slots, charges, placement = self._allocs.pop(alloc_id)
        except KeyError:
            raise PlacementConflict(f"unknown allocation id {alloc_id!r}") from None
        self.releases += 1
        self.changes += 1
        self._by_whole[ns.model_key][ns.n_full] -= 1
        ns.cpu_free += placement.cpu_milli
        ns.mem_free += placement.memory_mib
        for s, ch in zip(slots, charges):
            ns.free[s] += ch
            del ns.holders[s][alloc_id]
            self.allocated_gpu_milli -= ch
        ns.refresh()
        self._by_whole[ns.model_key][ns.n_full] += 1
        if slots and ns.total_free == ns.cap_total:
            self._idle[ns.model_key] += 1
        self._resign(ns)
        return placement

    def restore(self, alloc_id: str, placement: Placement) -> Placement:
        """Re-apply a placement recorded before a restart, after checking it still fits."""
        if alloc_id in self._allocs:
            raise PlacementConflict(f"allocation id {alloc_id!r} is already in use")
        ns = self.by_name.get(placement.node)
        if ns is None:
            raise PlacementConflict(f"placement of {alloc_id!r} names unknown node {placement.node!r}")
        if ns.cpu_free < placement.cpu_milli or ns.mem_free < placement.memory_mib:
            raise PlacementConflict(f"{alloc_id!r}: node {ns.name} has no CPU/memory left for it")
        fractional = len(placement.gpus) == 1 and placement.gpus[0].milli < MILLI
        slots: List[int] = []
        charges: List[int] = []
        for share in placement.gpus:
            s = self._find_slot(ns, share)
            if s in slots:
                raise PlacementConflict(f"{alloc_id!r} lists device {share.index} twice")
            if share.milli <= 0 or share.milli > MILLI or (share.milli < MILLI and not fractional):
                raise PlacementConflict(f"{alloc_id!r}: invalid share {share.milli} milli on GPU {share.index}")
            if ns.slot_mig[s] is not None:
                charge = ns.cap[s]
                if share.milli > charge:
                    raise PlacementConflict(f"{alloc_id!r}: MIG device {share.mig_uuid} is smaller than {share.milli} milli")
            else:
                charge = share.milli
            if ns.free[s] < charge:
                raise PlacementConflict(
                    f"{alloc_id!r}: GPU {share.index} on {ns.name} has {ns.free[s]} milli free, needs {charge}")
            slots.append(s)
            charges.append(charge)
        self._commit(alloc_id, ns, tuple(slots), tuple(charges), placement)
        return placement

    @staticmethod
    def _find_slot(ns: NodeState, share: GPUShare) -> int:
        for s, pos in enumerate(ns.slot_gpu):
            g = ns.node.gpus[pos]
            if g.index != share.index:
                continue
            if g.uuid != share.uuid:
                raise PlacementConflict(f"GPU {share.index} on {ns.name} is now {g.uuid}, not {share.uuid}")
            mig = ns.slot_mig[s]
            if (mig.uuid if mig else None) == share.mig_uuid:
                return s
        raise PlacementConflict(f"node {ns.name} has no GPU {share.index}" + (f" MIG {share.mig_uuid}" if share.mig_uuid else ""))

    def get(self, alloc_id: str) -> Optional[Placement]:
        hit = self._allocs.get(alloc_id)
        return hit[3] if hit else None

    def __contains__(self, alloc_id: str) -> bool:
        return alloc_id in self._allocs

    def __len__(self) -> int:
        return len(self._allocs)

    # -- reporting (placement/report.py) -------------------------------------
    def snapshot(self, names: Optional[Iterable[str]] = None) -> List[Dict[str, Any]]:
        """Per node and per GPU: model, allocated milli and holders, for the allocation map API
        (of the nodes ``names`` only, when given)."""
        return report.snapshot(self, names)

    def held_per_model(self) -> "tuple[Dict[str, Dict[str, int]], Dict[str, int]]":
        """Per model: nodes, GPUs, MIG GPUs, milli held; and each allocation's milli (see report)."""
        return report.held_per_model(self)

    def free_summary(self) -> "report.FreeSummary":
        """What is free right now, per GPU model: the words behind a "no capacity" message."""
        return report.free_summary(self)

    def describe(self, placement: Placement) -> str:
        """One line for the spawn progress message, e.g. "node-a, GPUs 2+3 joined by NVLink"."""
        return report.describe(self, placement)
