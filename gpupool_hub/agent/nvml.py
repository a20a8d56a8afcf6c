"""GPU discovery through NVML: what this node has, in the pool's inventory format.

The agent reports the node as the same dict an admin would write in
``c.GPUPool.nodes`` (see :func:`gpupool_hub.placement.hardware.load_nodes`),
so the service validates it with the same loader and placement can later use
discovered nodes without a second format.

The NVML module is always passed in (``nvml=``; default: ``pynvml`` from
nvidia-ml-py) so tests run on machines without a GPU against a table-driven
fake, and so nothing here imports ``pynvml`` at module load time: the agent must
still start (and say clearly why it cannot discover anything) where the
library or driver is missing.
"""

from __future__ import annotations

import logging
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

import psutil

from ..mig import total_slices
from ..placement.hardware import load_node
from ..placement.topology import PcieLevel

log = logging.getLogger("gpupool.agent.nvml")

MIB = 1 << 20

_MIG_PROFILE_IN_NAME = re.compile(r"\b(\d+g\.\d+gb(?:\+me)?)\b", re.IGNORECASE)


def default_nvml() -> Any:
    """``pynvml`` (nvidia-ml-py), imported only when a real GPU is wanted."""
    import pynvml

    return pynvml


def text(value: Any) -> str:
    """NVML strings arrive as ``bytes`` or ``str`` depending on the binding's version."""
    if isinstance(value, bytes):
        value = value.decode("utf-8", "replace")
    return str(value).replace("\x00", "").strip()


def bus_key(bus_id: Any) -> tuple[int, ...]:
    """Comparable PCI address: NVML writes the domain with 4 or 8 hex digits, upper or lower case."""
    raw = text(bus_id)
    parts = re.split(r"[:.]", raw)
    try:
        return tuple(int(p, 16) for p in parts if p)
    except ValueError:
        return (hash(raw.lower()),)


def nvml_error_code(nvml: Any, exc: BaseException) -> int | None:
    return getattr(exc, "value", None) if isinstance(exc, nvml.NVMLError) else None


@contextmanager
def nvml_session(nvml: Any) -> Iterator[Any]:
    """``nvmlInit``/``nvmlShutdown`` around one use; NVML counts nested inits."""
    nvml.nvmlInit()
    try:
        yield nvml
    finally:
        try:
            nvml.nvmlShutdown()
        except Exception as e:  # shutting down must never hide the real result
            log.debug("nvmlShutdown failed: %s", e)


@dataclass
class MigInfo:
    uuid: str
    profile: str
    milli: int
    gpu_instance_id: int | None
    memory_mib: int


@dataclass
class GpuInfo:
    """One physical GPU with the handle later calls (processes, utilization) need."""

    index: int
    uuid: str
    model: str
    memory_mib: int
    handle: Any = field(repr=False)
    bus: tuple[int, ...] = ()
    mig: list[MigInfo] = field(default_factory=list)

    def inventory(self) -> dict[str, Any]:
        out: dict[str, Any] = {"index": self.index, "uuid": self.uuid, "model": self.model,
                               "memory_mib": self.memory_mib}
        if self.mig:
            out["mig"] = [{"uuid": m.uuid, "profile": m.profile, "milli": m.milli} for m in self.mig]
        return out


def _mig_devices(nvml: Any, handle: Any, model: str) -> list[MigInfo]:
    """MIG instances of one GPU, or ``[]`` when MIG is unsupported or off."""
    try:
        current, _pending = nvml.nvmlDeviceGetMigMode(handle)
    except nvml.NVMLError:
        return []  # NOT_SUPPORTED on every non-MIG GPU: the common case, not an error
    if current != nvml.NVML_DEVICE_MIG_ENABLE:
        return []
    total = total_slices(model)  # 7, or 4 on an A30: the same rule prices and placement use
    out = []
    count = nvml.nvmlDeviceGetMaxMigDeviceCount(handle)
    for i in range(count):
        try:
            mh = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, i)
        except nvml.NVMLError:
            continue  # NOT_FOUND: an empty slot
        uuid = text(nvml.nvmlDeviceGetUUID(mh))
        name = text(nvml.nvmlDeviceGetName(mh))
        try:
            attrs = nvml.nvmlDeviceGetAttributes(mh)
            slices, mem_mb = int(attrs.gpuInstanceSliceCount), int(attrs.memorySizeMB)
        except nvml.NVMLError:
            slices, mem_mb = 0, 0
        hit = _MIG_PROFILE_IN_NAME.search(name)
        if hit:
            profile = hit.group(1).lower()
            slices = slices or int(profile.split("g", 1)[0])
        elif slices:
            profile = f"{slices}g.{max(1, round(mem_mb / 1024))}gb"
        else:
            log.warning("MIG device %s (%r): cannot tell its profile; skipped", uuid, name)
            continue
        try:
            gi = int(nvml.nvmlDeviceGetGpuInstanceId(mh))
        except nvml.NVMLError:
            gi = None
        milli = max(1, min(1000, slices * 1000 // total))
        out.append(MigInfo(uuid=uuid, profile=profile, milli=milli, gpu_instance_id=gi, memory_mib=mem_mb))
    # Never report more than one GPU's worth: the loader rejects that, and a
    # wrong total slice count is the only way to get there.
    total_milli = sum(m.milli for m in out)
    if total_milli > 1000:
        for m in out:
            m.milli = max(1, m.milli * 1000 // total_milli)
    return out


def list_gpus(nvml: Any) -> list[GpuInfo]:
    """Every GPU NVML sees (NVML must be initialised), in NVML index order."""
    gpus = []
    for i in range(nvml.nvmlDeviceGetCount()):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        model = text(nvml.nvmlDeviceGetName(h))
        mem = nvml.nvmlDeviceGetMemoryInfo(h)
        try:
            bus = bus_key(nvml.nvmlDeviceGetPciInfo(h).busId)
        except nvml.NVMLError:
            bus = ()
        gpus.append(GpuInfo(
            index=i, uuid=text(nvml.nvmlDeviceGetUUID(h)), model=model, memory_mib=int(mem.total) // MIB,
            handle=h, bus=bus, mig=_mig_devices(nvml, h, model),
        ))
    return gpus


def _nvlink_peers(nvml: Any, gpu: GpuInfo, by_bus: Mapping[tuple[int, ...], int]) -> tuple[dict[int, int], int]:
    """Active NVLinks of one GPU: count per peer GPU index, and links to non-GPUs (NVSwitch)."""
    peers: dict[int, int] = {}
    switch = 0
    for link in range(int(getattr(nvml, "NVML_NVLINK_MAX_LINKS", 18))):
        try:
            if nvml.nvmlDeviceGetNvLinkState(gpu.handle, link) != nvml.NVML_FEATURE_ENABLED:
                continue
        except nvml.NVMLError as e:
            if nvml_error_code(nvml, e) == nvml.NVML_ERROR_NOT_SUPPORTED and link == 0:
                return {}, 0  # no NVLink on this GPU at all
            continue  # INVALID_ARGUMENT past the GPU's last link, or a link that is down
        try:
            remote = bus_key(nvml.nvmlDeviceGetNvLinkRemotePciInfo(gpu.handle, link).busId)
        except nvml.NVMLError:
            continue
        peer = by_bus.get(remote)
        if peer is None:
            switch += 1
        elif peer != gpu.index:
            peers[peer] = peers.get(peer, 0) + 1
    return peers, switch


def discover_links(nvml: Any, gpus: list[GpuInfo]) -> list[dict[str, Any]]:
    """NVLink count and PCIe relation for every pair of GPUs.

    Direct GPU-GPU links are counted from the first GPU's side (NVML lists a
    link on both ends; counting both would double it). Links that end at a
    non-GPU are NVSwitch ports: every pair of switch-attached GPUs can talk at
    the smaller of their switch bandwidths, which is what we report for them.
    """
    by_bus = {g.bus: g.index for g in gpus if g.bus}
    peers: dict[int, dict[int, int]] = {}
    switch: dict[int, int] = {}
    for g in gpus:
        peers[g.index], switch[g.index] = _nvlink_peers(nvml, g, by_bus)
    links = []
    for i, a in enumerate(gpus):
        for b in gpus[i + 1:]:
            direct = max(peers[a.index].get(b.index, 0), peers[b.index].get(a.index, 0))
            nv = direct + min(switch[a.index], switch[b.index])
            try:
                level = PcieLevel(int(nvml.nvmlDeviceGetTopologyCommonAncestor(a.handle, b.handle)))
                pcie: str | None = level.name
            except (nvml.NVMLError, ValueError) as e:
                log.debug("No PCIe relation for GPUs %d and %d: %s", a.index, b.index, e)
                pcie = None
            link: dict[str, Any] = {"gpus": [a.index, b.index], "nvlinks": nv}
            if pcie is not None:
                link["pcie"] = pcie
            links.append(link)
    return links


def host_resources() -> tuple[int, int]:
    """(cpu_milli, memory_mib) this node offers: usable CPUs and physical memory."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        cpus = os.cpu_count() or 1
    return cpus * 1000, max(1, psutil.virtual_memory().total // MIB)


def build_inventory(node_name: str, gpus: list[GpuInfo], links: list[dict[str, Any]], *,
                    cpu_milli: int | None = None, memory_mib: int | None = None,
                    labels: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The node dict, checked with the same loader the service uses (fails here, not there)."""
    host_cpu, host_mem = host_resources()
    inv = {
        "name": node_name,
        "cpu_milli": cpu_milli or host_cpu,
        "memory_mib": memory_mib or host_mem,
        "labels": dict(labels or {}),
        "gpus": [g.inventory() for g in gpus],
        "links": links,
    }
    load_node(inv, f"inventory of {node_name}")
    return inv


def discover(nvml: Any, node_name: str, **kw: Any) -> tuple[dict[str, Any], list[GpuInfo]]:
    """Inventory of this node, plus the GPU handles; NVML must be initialised."""
    gpus = list_gpus(nvml)
    return build_inventory(node_name, gpus, discover_links(nvml, gpus), **kw), gpus
