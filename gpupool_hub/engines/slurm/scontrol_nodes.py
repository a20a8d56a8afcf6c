"""The pool's nodes, as ``scontrol -d show node -o`` describes them.

Per node: CPUs, memory, partitions, features, state and, per GRES type, the
GPUs configured (``Gres=gpu:a6000:4``) and in use (``GresUsed=gpu:a6000:2(IDX:0-1)``),
so GPUs held by jobs the hub did not start can be subtracted. :meth:`SlurmNode.config`
gives the node in the format of ``c.GPUPool.nodes`` (see ``gpupool_hub.placement.hardware``).

GRES types are mapped to GPU model names by an admin-given map such as
``{"a6000": "NVIDIA RTX A6000"}``; a type missing from it is an error that
names the type, never a guess.

GPU indices: Slurm numbers a node's GPUs across all its GPU types, grouped by
type in the order of the node's ``Gres=`` list (a node with
``Gres=gpu:rtx3090:2,gpu:a6000:2`` has rtx3090 = 0-1, a6000 = 2-3, whatever
the order of its ``gres.conf`` lines). The indices in ``GresUsed`` are checked
against that layout; a mismatch is an error rather than a wrong free list.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .commands import SlurmOutputError, UnmappedGresType
from .parse import NODE_FREE_TEXT, NODE_KEYS, _NULL, _first, _int_field, _records, parse_gres, parse_record

__all__ = ["SlurmNodeState", "SlurmGpu", "SlurmNode", "check_models", "parse_node", "parse_node_state", "parse_nodes",
           "shards_per_gpu"]


# ---------------------------------------------------------------------------
# Nodes
# ---------------------------------------------------------------------------

#: Base states in which a node can run new jobs.
_RUNNABLE = {"IDLE", "MIXED", "ALLOCATED"}
#: Flags that do not stop a node from taking new jobs.
_HARMLESS_FLAGS = {"COMPLETING", "PLANNED", "CLOUD", "DYNAMIC_NORM"}
#: sinfo-style suffix characters -> flag names.
_SUFFIX_FLAGS = {"*": "NOT_RESPONDING", "~": "POWERED_DOWN", "#": "POWERING_UP", "!": "POWERING_DOWN",
                 "%": "POWERING_DOWN", "$": "MAINTENANCE", "@": "REBOOT_REQUESTED", "^": "REBOOT_ISSUED",
                 "-": "PLANNED"}
_STATE_WORDS = {
    "DRAIN": "drained", "NOT_RESPONDING": "not responding", "RESERVED": "reserved (advance reservation)",
    "MAINTENANCE": "in maintenance", "FAIL": "failing", "POWERED_DOWN": "powered down",
    "POWERING_DOWN": "powering down", "POWER_DOWN": "powering down", "POWERING_UP": "powering up",
    "REBOOT_REQUESTED": "reboot requested", "REBOOT_ISSUED": "rebooting", "INVALID_REG": "invalid registration",
    "DOWN": "down", "FUTURE": "not yet in service (FUTURE)", "UNKNOWN": "state unknown",
    "ERROR": "in error", "DRAINED": "drained", "DRAINING": "draining",
}


@dataclass(frozen=True)
class SlurmNodeState:
    raw: str
    base: str
    flags: frozenset[str]

    @property
    def takes_placements(self) -> bool:
        return self.base in _RUNNABLE and self.flags <= _HARMLESS_FLAGS

    @property
    def why_not(self) -> str | None:
        """Why the node takes no placements (None when it does), e.g. ``"draining"``."""
        if self.takes_placements:
            return None
        words = []
        if self.base not in _RUNNABLE:
            words.append(_STATE_WORDS.get(self.base, f"state {self.base}"))
        for flag in sorted(self.flags - _HARMLESS_FLAGS):
            if flag == "DRAIN" and self.base in ("MIXED", "ALLOCATED"):
                words.append("draining")
            else:
                words.append(_STATE_WORDS.get(flag, flag.lower().replace("_", " ")))
        return ", ".join(dict.fromkeys(words))


def parse_node_state(raw: str) -> SlurmNodeState:
    """``MIXED+DRAIN`` / ``IDLE*`` / ``DOWN+NOT_RESPONDING`` -> base state and flags."""
    text = raw.strip().upper()
    if not text or not re.fullmatch(r"[A-Z_]+[*~#!%$@^-]*(\+[A-Z_]+[*~#!%$@^-]*)*", text):
        raise SlurmOutputError(f"cannot read node state {raw!r}")
    words = text.split("+")
    flags: set[str] = set()
    cleaned = []
    for w in words:
        core = w.rstrip("*~#!%$@^-")
        flags.update(_SUFFIX_FLAGS[c] for c in w[len(core):])
        cleaned.append(core)
    base, rest = cleaned[0], cleaned[1:]
    flags.update(rest)
    # sinfo's long names
    if base == "DRAINED":
        base, flags = "IDLE", flags | {"DRAIN"}
    elif base == "DRAINING":
        base, flags = "MIXED", flags | {"DRAIN"}
    elif base in ("MIX",):
        base = "MIXED"
    elif base in ("ALLOC",):
        base = "ALLOCATED"
    return SlurmNodeState(raw=raw.strip(), base=base, flags=frozenset(flags))


@dataclass(frozen=True)
class SlurmGpu:
    index: int  # Slurm's GPU index on the node (the IDX in GresUsed / a job's GRES)
    gres_type: str
    model: str
    in_use: bool


@dataclass(frozen=True)
class SlurmNode:
    name: str
    cpus: int
    memory_mib: int
    partitions: tuple[str, ...]
    features: tuple[str, ...]
    state: SlurmNodeState
    reason: str | None
    gpus: tuple[SlurmGpu, ...]
    #: GRES type -> GPU count of the types missing from the model map (left out; ``skip_unmapped``)
    unmapped: Mapping[str, int] = field(default_factory=dict)
    #: GRES type -> shards per GPU (``Gres=gpu:a6000:2,shard:a6000:16`` -> {"a6000": 8}); no entry: no shards
    shards_per_gpu: Mapping[str, int] = field(default_factory=dict)

    @property
    def takes_placements(self) -> bool:
        return self.state.takes_placements

    @property
    def problem(self) -> str | None:
        """What an admin must fix about this node, e.g. an unmapped GRES type (None: nothing)."""
        if not self.unmapped:
            return None
        types = ", ".join(f"{t!r} ({n} GPU{'s' if n != 1 else ''})" for t, n in sorted(self.unmapped.items()))
        return (f"GRES type {types} is not in c.GPUPool.slurm_gpu_models, so these GPUs are left out of the "
                "pool and nobody can be given them; add the type with its GPU model")

    @property
    def why_not(self) -> str | None:
        why = self.state.why_not
        if why and self.reason:
            return f"{why}: {self.reason}"
        return why

    @property
    def gpus_in_use(self) -> frozenset[int]:
        """Indices of GPUs Slurm has allocated to some job (the hub's or anyone's)."""
        return frozenset(g.index for g in self.gpus if g.in_use)

    @property
    def free_gpus(self) -> tuple[int, ...]:
        return tuple(g.index for g in self.gpus if not g.in_use)

    def used_by_type(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for g in self.gpus:
            out.setdefault(g.gres_type, 0)
            if g.in_use:
                out[g.gres_type] += 1
        return out

    def labels(self) -> dict[str, str]:
        labels = {"slurm.partitions": ",".join(self.partitions)}
        for p in self.partitions:
            labels[f"slurm.partition.{p}"] = "true"
        for f in self.features:
            labels[f"slurm.feature.{f}"] = "true"
        return labels

    def config(self) -> dict[str, Any]:
        """The node in ``c.GPUPool.nodes`` format (``load_node`` accepts it)."""
        return {
            "name": self.name,
            "cpu_milli": self.cpus * 1000,
            "memory_mib": self.memory_mib,
            "gpus": [{"index": g.index, "uuid": f"{self.name}/gpu{g.index}", "model": g.model} for g in self.gpus],
            "labels": self.labels(),
        }


def _words(value: str | None) -> tuple[str, ...]:
    if value is None or value.strip() in _NULL:
        return ()
    return tuple(w for w in value.split(",") if w)


def _node_gpus(name: str, gres: str, used: str | None, models: Mapping[str, str],
               unmapped: dict[str, int] | None = None) -> tuple[SlurmGpu, ...]:
    """The node's GPUs of mapped types; with ``unmapped`` (a dict to fill) GPUs of a type missing
    from ``models`` are counted there and left out, else the type raises UnmappedGresType."""
    where = f"node {name}"
    layout: dict[str, list[int]] = {}
    skipped: set[str] = set()
    next_index = 0
    for item in parse_gres(gres, f"{where} Gres="):
        if item.name != "gpu":
            continue
        if item.type is None:
            raise SlurmOutputError(
                f"{where} has GPUs without a GRES type (Gres={gres}); give them a Type= in gres.conf "
                "and slurm.conf so that they map to a GPU model"
            )
        if item.type not in models:
            if unmapped is None:
                raise UnmappedGresType(item.type, where, models)
            unmapped[item.type] = unmapped.get(item.type, 0) + item.count
            skipped.add(item.type)
            next_index += item.count  # Slurm numbers GPUs across all types
            continue
        layout.setdefault(item.type, []).extend(range(next_index, next_index + item.count))
        next_index += item.count
    in_use: set[int] = set()
    if used is not None:
        for item in parse_gres(used, f"{where} GresUsed="):
            if item.name == "shard" and item.count and item.indices and item.type in layout:
                # shard:a6000:2(IDX:0-1): GPUs 0 and 1 have shards in use (22.05 counts GPUs here,
                # not shards); such a GPU is busy for a whole-GPU job
                in_use.update(i for i in item.indices if i in layout[item.type])
                continue
            if item.name != "gpu" or item.count == 0 or item.type in skipped:
                continue
            if item.type is None or item.type not in layout:
                raise SlurmOutputError(
                    f"{where}: GresUsed={used} names GPU type {item.type!r}, which Gres={gres} does not list"
                )
            if item.indices is None:
                raise SlurmOutputError(
                    f"{where}: GresUsed={used} gives no GPU indices (IDX) although --details was asked for "
                    "(seen while slurmctld restarts); read again at the next refresh"
                )
            bad = set(item.indices) - set(layout[item.type])
            if bad:
                raise SlurmOutputError(
                    f"{where}: GresUsed={used} says {item.type} GPU(s) {sorted(bad)} are in use, but by "
                    f"Gres={gres} the {item.type} GPUs are {layout[item.type]}; cannot tell which GPUs are free"
                )
            in_use.update(item.indices)
    gpus = [SlurmGpu(i, t, models[t], i in in_use) for t, idx in layout.items() for i in idx]
    return tuple(sorted(gpus, key=lambda g: g.index))


def parse_node(line: str, models: Mapping[str, str], skip_unmapped: bool = False) -> SlurmNode:
    pairs = parse_record(line, free_text=NODE_FREE_TEXT, known=NODE_KEYS)
    name = _first(pairs, "NodeName")
    if not name:
        raise SlurmOutputError(f"node record without NodeName=: {line[:200]!r}")
    where = f"node {name}"
    cpus_raw = _first(pairs, "CPUEfctv") or _first(pairs, "CPUTot")
    cpus = _int_field(cpus_raw, "CPUTot", where)
    memory = _int_field(_first(pairs, "RealMemory"), "RealMemory", where)
    state_raw = _first(pairs, "State")
    if not state_raw:
        raise SlurmOutputError(f"{where}: State= is missing")
    try:
        state = parse_node_state(state_raw)
    except SlurmOutputError as e:
        raise SlurmOutputError(f"{where}: {e}") from None
    reason = _first(pairs, "Reason")
    unmapped: dict[str, int] | None = {} if skip_unmapped else None
    gres = _first(pairs, "Gres") or "(null)"
    gpus = _node_gpus(name, gres, _first(pairs, "GresUsed"), models, unmapped)
    return SlurmNode(
        name=name,
        cpus=cpus,
        memory_mib=memory,
        partitions=_words(_first(pairs, "Partitions")),
        features=_words(_first(pairs, "AvailableFeatures")),
        state=state,
        reason=drain_reason(reason) if reason and reason not in _NULL else None,
        gpus=gpus,
        unmapped=unmapped or {},
        shards_per_gpu=shards_per_gpu(gres, where),
    )


def shards_per_gpu(gres: str, where: str = "GRES") -> dict[str, int]:
    """GRES type -> shards per GPU from a node's ``Gres=`` (``gpu:a6000:2,shard:a6000:16`` -> {"a6000": 8}).

    Slurm counts a node's shards per type, not per GPU; the gres.conf lines give each GPU the
    same ``Count=`` (docs/slurm.md), so the per-GPU number is the quotient. A type whose shards
    do not divide evenly among its GPUs is left out (the start check then names it)."""
    items = parse_gres(gres, f"{where} Gres=")
    gpus: dict[str, int] = {}
    shards: dict[str, int] = {}
    for item in items:
        if item.name in ("gpu", "shard") and item.type is not None:
            table = gpus if item.name == "gpu" else shards
            table[item.type] = table.get(item.type, 0) + item.count
    return {t: n // gpus[t] for t, n in shards.items() if gpus.get(t) and n and n % gpus[t] == 0}


#: what slurmctld appends to a node's reason: who set it, and when (``[root@2026-11-28T10:00:00]``,
#: ``[root@1764324000]`` with ``SLURM_TIME_FORMAT=%s``)
_SET_BY = re.compile(r"\s*\[[^\[\]@\s]+@[^\[\]\s]+\]\s*$")


def drain_reason(reason: str) -> str:
    """The admin's reason for a drain, for users: without the ``[user@time]`` slurmctld appends."""
    return _SET_BY.sub("", reason).strip() or reason.strip()


def parse_nodes(text: str, models: Mapping[str, str], skip_unmapped: bool = False) -> list[SlurmNode]:
    """Every node of ``scontrol -d show node -o`` output (one line per node). An unmapped GRES
    type raises UnmappedGresType, or with ``skip_unmapped`` leaves that type's GPUs out
    (``SlurmNode.unmapped``, ``problem``): the rest of the cluster keeps working."""
    check_models(models)
    lines = _records(text, "NodeName", "node")
    if not lines:
        raise SlurmOutputError("scontrol show node printed no nodes")
    nodes = [parse_node(ln, models, skip_unmapped) for ln in lines]
    seen: set[str] = set()
    for n in nodes:
        if n.name in seen:
            raise SlurmOutputError(f"node {n.name} is listed twice")
        seen.add(n.name)
    return nodes


def check_models(models: Mapping[str, str]) -> None:
    if not isinstance(models, Mapping):
        raise TypeError("the GRES-to-model map must be a mapping such as {'a6000': 'NVIDIA RTX A6000'}")
    for k, v in models.items():
        if not isinstance(k, str) or not isinstance(v, str) or not k or not v.strip():
            raise ValueError(f"GRES-to-model map: {k!r}: {v!r} must map a GRES type to a model name (strings)")
