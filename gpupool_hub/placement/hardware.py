"""Static description of the pool: nodes, their GPUs, MIG instances and links.

Loaded today from plain dicts an admin writes in ``jupyterhub_config.py``; the
node agent will later build the same objects from NVML. Errors name the exact
key (``nodes[3].gpus[1].uuid``) because a typo in a config file is the most
likely failure and the admin must find it without reading this code.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, List, Mapping, Optional, Sequence, Tuple

from ..mig import total_slices
from .errors import InventoryError
from .request import MILLI, normalize_model
from .topology import PcieLevel, Topology, build_topology, parse_pcie_level


@dataclass(frozen=True, slots=True)
class MigDevice:
    """One MIG instance; it is handed out whole to one fractional request."""

    uuid: str
    profile: str
    milli: int  # share of the parent GPU's compute, 1-1000


@dataclass(frozen=True, slots=True)
class GPU:
    index: int
    uuid: str
    model: str
    memory_mib: int = 0
    mig: Tuple[MigDevice, ...] = ()

    @property
    def model_key(self) -> str:
        return normalize_model(self.model)


@dataclass(frozen=True, slots=True)
class Link:
    """How two GPUs of one node are connected, as NVML reports it."""

    a: int
    b: int
    nvlinks: int = 0
    pcie: Optional[PcieLevel] = None


@dataclass(frozen=True, slots=True)
class Node:
    name: str
    cpu_milli: int
    memory_mib: int
    gpus: Tuple[GPU, ...] = ()
    labels: Tuple[Tuple[str, str], ...] = ()
    links: Tuple[Link, ...] = ()
    topology: Topology = field(default=None, compare=False, repr=False)  # type: ignore[assignment]

    def __post_init__(self) -> None:
        if self.topology is None:
            pos = {g.index: i for i, g in enumerate(self.gpus)}
            topo = build_topology(
                len(self.gpus),
                ((pos[l.a], pos[l.b], l.nvlinks, l.pcie) for l in self.links),
            )
            object.__setattr__(self, "topology", topo)

    @property
    def label_dict(self) -> dict:
        return dict(self.labels)

    def gpu_position(self, index: int) -> int:
        for i, g in enumerate(self.gpus):
            if g.index == index:
                return i
        raise KeyError(index)


# ---------------------------------------------------------------------------
# Loading from configuration
# ---------------------------------------------------------------------------

_MIG_PROFILE = re.compile(r"^(\d+)g\.", re.IGNORECASE)

# Every count is checked before anything is built from it: an inventory comes from a
# node agent over the network, and ``{"count": 1000000000}`` must cost nothing.
#: GPUs one node may have
MAX_GPUS_PER_NODE = 64
#: MIG instances one GPU may have (seven 1g slices on an A100/H100)
MAX_MIG_PER_GPU = 7
#: links one node may list: one per pair of GPUs, each way
MAX_LINKS = MAX_GPUS_PER_NODE * (MAX_GPUS_PER_NODE - 1)
#: labels one node may have
MAX_LABELS = 64
#: nodes one pool may have
MAX_NODES = 10_000
#: characters of a name, UUID, model, profile or label (what the ledger's columns hold)
MAX_TEXT = 255


def _req(d: Mapping[str, Any], key: str, where: str) -> Any:
    if key not in d:
        raise InventoryError(f"{where}.{key} is missing")
    return d[key]


def _int(value: Any, where: str, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise InventoryError(f"{where} must be a whole number, got {_short(value)}")
    if value < minimum:
        raise InventoryError(f"{where} must be at least {minimum}, got {value}")
    return value


def _str(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InventoryError(f"{where} must be a non-empty string, got {_short(value)}")
    if len(value) > MAX_TEXT:
        raise InventoryError(f"{where} must be at most {MAX_TEXT} characters, got {len(value)}")
    return value.strip()


def _short(value: Any) -> str:
    """A bad value for an error message, cut short: the message must not echo a megabyte back."""
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _at_most(items: Any, limit: int, where: str, what: str) -> None:
    """Refuse a list longer than ``limit`` before a single item of it is looked at."""
    if isinstance(items, (list, tuple)) and len(items) > limit:
        raise InventoryError(f"{where} lists {len(items)} {what}; at most {limit}")


def _check_keys(d: Mapping[str, Any], allowed: Iterable[str], where: str) -> None:
    unknown = sorted(set(d) - set(allowed))
    if unknown:
        raise InventoryError(f"{where} has unknown key(s) {', '.join(map(repr, unknown))}; allowed: {', '.join(sorted(allowed))}")


def _load_mig(items: Any, where: str, parent_uuid: str, model: str = "") -> Tuple[MigDevice, ...]:
    if not isinstance(items, (list, tuple)):
        raise InventoryError(f"{where} must be a list of MIG instances")
    _at_most(items, MAX_MIG_PER_GPU, where, "MIG instances")
    out = []
    for j, m in enumerate(items):
        w = f"{where}[{j}]"
        if not isinstance(m, Mapping):
            raise InventoryError(f"{w} must be a mapping")
        _check_keys(m, ("uuid", "profile", "milli"), w)
        profile = _str(_req(m, "profile", w), f"{w}.profile")
        uuid = _str(m.get("uuid", f"{parent_uuid}/mig{j}"), f"{w}.uuid")
        if "milli" in m:
            milli = _int(m["milli"], f"{w}.milli", minimum=1)
        else:
            hit = _MIG_PROFILE.match(profile)
            if not hit:
                raise InventoryError(f"{w}.milli is missing and profile {profile!r} does not start with '<N>g.'")
            milli = int(hit.group(1)) * MILLI // total_slices(model)  # 4 on an A30, else 7
        if milli > MILLI:
            raise InventoryError(f"{w}.milli must be at most {MILLI}, got {milli}")
        out.append(MigDevice(uuid=uuid, profile=profile, milli=milli))
    if sum(m.milli for m in out) > MILLI:
        raise InventoryError(f"{where}: MIG instances add up to more than one GPU")
    return tuple(out)


def _load_gpus(spec: Any, where: str, node_name: str) -> Tuple[GPU, ...]:
    if isinstance(spec, Mapping):  # shorthand: {"count": 8, "model": "A100", "memory_mib": ...}
        _check_keys(spec, ("count", "model", "memory_mib"), where)
        count = _int(_req(spec, "count", where), f"{where}.count")
        if count > MAX_GPUS_PER_NODE:
            raise InventoryError(f"{where}.count is {count}; at most {MAX_GPUS_PER_NODE} GPUs per node")
        model = _str(_req(spec, "model", where), f"{where}.model")
        mem = _int(spec.get("memory_mib", 0), f"{where}.memory_mib")
        return tuple(GPU(index=i, uuid=f"{node_name}/gpu{i}", model=model, memory_mib=mem) for i in range(count))
    if not isinstance(spec, (list, tuple)):
        raise InventoryError(f"{where} must be a list of GPUs or {{'count': N, 'model': ...}}")
    _at_most(spec, MAX_GPUS_PER_NODE, where, "GPUs")
    gpus = []
    for i, g in enumerate(spec):
        w = f"{where}[{i}]"
        if not isinstance(g, Mapping):
            raise InventoryError(f"{w} must be a mapping")
        _check_keys(g, ("index", "uuid", "model", "memory_mib", "mig"), w)
        index = _int(g.get("index", i), f"{w}.index")
        uuid = _str(g.get("uuid", f"{node_name}/gpu{index}"), f"{w}.uuid")
        model = _str(_req(g, "model", w), f"{w}.model")
        mem = _int(g.get("memory_mib", 0), f"{w}.memory_mib")
        mig = _load_mig(g.get("mig", ()), f"{w}.mig", uuid, model)
        gpus.append(GPU(index=index, uuid=uuid, model=model, memory_mib=mem, mig=mig))
    seen = set()
    for i, g in enumerate(gpus):
        if g.index in seen:
            raise InventoryError(f"{where}[{i}].index {g.index} is used twice on node {node_name!r}")
        seen.add(g.index)
    return tuple(gpus)


def _load_links(spec: Any, where: str, gpus: Sequence[GPU]) -> Tuple[Link, ...]:
    if not isinstance(spec, (list, tuple)):
        raise InventoryError(f"{where} must be a list of links")
    _at_most(spec, MAX_LINKS, where, "links")
    indices = {g.index for g in gpus}
    links = {}
    for i, l in enumerate(spec):
        w = f"{where}[{i}]"
        if isinstance(l, Mapping):
            _check_keys(l, ("gpus", "a", "b", "nvlinks", "pcie"), w)
            if "gpus" in l:
                pair = l["gpus"]
                if not isinstance(pair, (list, tuple)) or len(pair) != 2:
                    raise InventoryError(f"{w}.gpus must be a pair of GPU indices")
                a, b = pair
            else:
                a, b = _req(l, "a", w), _req(l, "b", w)
            nv = l.get("nvlinks", 0)
            pcie = l.get("pcie")
        elif isinstance(l, (list, tuple)) and len(l) in (3, 4):
            a, b, nv = l[0], l[1], l[2]
            pcie = l[3] if len(l) == 4 else None
        else:
            raise InventoryError(f"{w} must be a mapping or an (a, b, nvlinks[, pcie]) tuple")
        a = _int(a, f"{w}.a")
        b = _int(b, f"{w}.b")
        nv = _int(nv, f"{w}.nvlinks")
        for x in (a, b):
            if x not in indices:
                raise InventoryError(f"{w} names GPU index {x}, which this node does not have")
        if a == b:
            raise InventoryError(f"{w} links GPU {a} to itself")
        try:
            level = parse_pcie_level(pcie) if pcie is not None else None
        except ValueError as e:
            raise InventoryError(f"{w}.pcie: {e}") from None
        key = (min(a, b), max(a, b))
        if key in links and links[key] != (nv, level):
            raise InventoryError(f"{w} contradicts an earlier link between GPUs {key[0]} and {key[1]}")
        links[key] = (nv, level)
    return tuple(Link(a, b, nv, lv) for (a, b), (nv, lv) in sorted(links.items()))


def load_node(d: Mapping[str, Any], where: str = "node") -> Node:
    """One node from its config mapping; see :func:`load_nodes`."""
    if isinstance(d, Node):
        return d
    if not isinstance(d, Mapping):
        raise InventoryError(f"{where} must be a mapping, got {type(d).__name__}")
    _check_keys(d, ("name", "cpu_milli", "memory_mib", "gpus", "labels", "links"), where)
    name = _str(_req(d, "name", where), f"{where}.name")
    cpu = _int(_req(d, "cpu_milli", where), f"{where}.cpu_milli", minimum=1)
    mem = _int(_req(d, "memory_mib", where), f"{where}.memory_mib", minimum=1)
    gpus = _load_gpus(d.get("gpus", ()), f"{where}.gpus", name)
    labels = d.get("labels", {})
    if isinstance(labels, Mapping) and len(labels) > MAX_LABELS:
        raise InventoryError(f"{where}.labels has {len(labels)} labels; at most {MAX_LABELS}")
    if not isinstance(labels, Mapping) or not all(isinstance(k, str) and isinstance(v, str)
                                                  and len(k) <= MAX_TEXT and len(v) <= MAX_TEXT
                                                  for k, v in labels.items()):
        raise InventoryError(f"{where}.labels must map strings to strings (at most {MAX_TEXT} characters each)")
    links = _load_links(d.get("links", ()), f"{where}.links", gpus)
    return Node(name=name, cpu_milli=cpu, memory_mib=mem, gpus=gpus,
                labels=tuple(sorted(labels.items())), links=links)


def load_nodes(config: Iterable[Mapping[str, Any]]) -> List[Node]:
    """Nodes from the admin's configuration list.

    Each entry::

        {"name": "node-a", "cpu_milli": 64000, "memory_mib": 262144,
         "labels": {"rack": "r1"},
         "gpus": [{"index": 0, "uuid": "GPU-...", "model": "NVIDIA A100-SXM4-80GB",
                   "memory_mib": 81920,
                   "mig": [{"uuid": "MIG-...", "profile": "3g.40gb"}]}, ...],
         "links": [{"gpus": [0, 1], "nvlinks": 12, "pcie": "SYSTEM"}, ...]}

    ``gpus`` may also be ``{"count": 8, "model": "..."}`` for identical GPUs.
    Raises :class:`InventoryError` (a ``ValueError``) naming the bad key.
    """
    if isinstance(config, Mapping) or isinstance(config, (str, bytes)):
        raise InventoryError("nodes configuration must be a list of node mappings")
    config = list(config)
    _at_most(config, MAX_NODES, "nodes", "nodes")
    nodes = [load_node(d, f"nodes[{i}]") for i, d in enumerate(config)]
    names = set()
    uuids = set()
    for i, n in enumerate(nodes):
        if n.name in names:
            raise InventoryError(f"nodes[{i}].name {n.name!r} is used twice")
        names.add(n.name)
        for j, g in enumerate(n.gpus):
            for u in (g.uuid, *(m.uuid for m in g.mig)):
                if u in uuids:
                    raise InventoryError(f"nodes[{i}].gpus[{j}]: uuid {u!r} is used twice")
                uuids.add(u)
    return nodes
