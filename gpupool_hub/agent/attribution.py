"""Who uses which GPU: NVML's process lists, turned into Unix users with psutil.

NVML knows pids and memory per GPU, nothing about people. The owner of a pid
is its real uid (what the spawner started the server as; an effective uid can
be changed by setuid helpers). Jupyter kernels are recognised by their command
line, because the enforcement rules treat "a kernel of a running server"
differently from any other process: stopping those is the hub's business
(culling through the server), not the node's. Which server is running is not
read from a command line (anyone can name a script ``jupyter-lab``): it is a
process the spawner recorded when it started it (:mod:`.servers`).

NVML reports host pids. The agent must therefore run in the host pid namespace
(``hostPID: true`` in a pod); otherwise pids do not resolve and processes are
reported as unattributed rather than guessed.
"""

from __future__ import annotations

import logging
import os
import pwd
import re
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

import psutil

from .activity import MEMORY_EMPTY, PROCESS_UTILIZATION, sample_processes, user_utilization
from .nvml import GpuInfo, nvml_error_code
from .servers import ServerRecords, recorded_server_of

log = logging.getLogger("gpupool.agent.attribution")

_KERNEL_FILE = re.compile(r"^kernel-(?P<id>[A-Za-z0-9_.\-]+)\.json$")
_KERNEL_MODULES = {"ipykernel_launcher", "ipykernel", "ipykernel_launcher.py"}


def user_name(uid: int) -> str:
    """Account name of a uid; the number itself when the account is unknown (e.g. a container's)."""
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)


def kernel_id(cmdline: Sequence[str]) -> str | None:
    """Kernel id when ``cmdline`` is a Jupyter kernel, else ``None``.

    Every kernel gets its connection file as ``-f …/kernel-<id>.json`` (or
    ``--f=``/``--connection-file``), whatever its language; ipykernel is also
    recognised by ``ipykernel_launcher`` alone (then the id is ``""``).
    """
    args = list(cmdline)
    for i, arg in enumerate(args):
        value = None
        if arg in ("-f", "--f", "--connection-file") and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(("--f=", "-f=", "--connection-file=")):
            value = arg.split("=", 1)[1]
        if value:
            hit = _KERNEL_FILE.match(os.path.basename(value))
            if hit:
                return hit.group("id")
    for i, arg in enumerate(args):
        base = os.path.basename(arg)
        if base in ("ipykernel_launcher", "ipykernel_launcher.py"):
            return ""
        if arg == "-m" and i + 1 < len(args) and args[i + 1] in _KERNEL_MODULES:
            return ""
    return None


@dataclass
class GpuProcess:
    """One process on one GPU, as NVML and psutil describe it."""

    pid: int
    gpu_index: int
    gpu_uuid: str
    model: str
    memory_bytes: int | None = 0  # None: NVML left it empty (unknown, not 0)
    kinds: tuple[str, ...] = ("compute",)
    mig_uuid: str | None = None
    uid: int | None = None  # None: the pid is not visible here (other pid namespace, or gone)
    user: str | None = None
    create_time: float | None = None
    cmdline: list[str] = field(default_factory=list)
    kernel_id: str | None = None
    server_pid: int | None = None  # a kernel's running server, as the spawner recorded it (servers.py)
    sm_util: float | None = None  # busy fraction since the last sample; None: NVML cannot say

    @property
    def is_kernel(self) -> bool:
        return self.kernel_id is not None

    @property
    def is_kernel_of_running_server(self) -> bool:
        return self.kernel_id is not None and self.server_pid is not None

    def as_dict(self) -> dict[str, Any]:
        return {
            "pid": self.pid, "gpu_index": self.gpu_index, "gpu_uuid": self.gpu_uuid, "model": self.model,
            "mig_uuid": self.mig_uuid, "memory_bytes": self.memory_bytes, "kinds": list(self.kinds),
            "uid": self.uid, "user": self.user, "kernel_id": self.kernel_id, "server_pid": self.server_pid,
            "sm_util": self.sm_util, "cmdline": " ".join(self.cmdline)[:300],
        }


@dataclass
class GpuStatus:
    """Per-GPU gauges; ``None`` where NVML cannot say (utilization of a MIG-enabled GPU).

    ``problems``: NVML calls whose failure leaves this GPU's use unattributed (call ->
    why); ``users``: each user's busy fraction of it (``None``: unknown)."""

    index: int
    uuid: str
    model: str
    memory_total_bytes: int
    memory_used_bytes: int | None
    utilization: float | None  # 0..1
    problems: dict[str, str] = field(default_factory=dict)
    users: dict[str, float | None] = field(default_factory=dict)

    @property
    def attribution_ok(self) -> bool:
        return not self.problems

    def why_not(self) -> str | None:
        """What keeps this GPU's use from being attributed, in a line; None when nothing does."""
        return "; ".join(self.problems[c] for c in sorted(self.problems)) or None


@dataclass
class Snapshot:
    taken_at: float
    gpus: list[GpuStatus]
    processes: list[GpuProcess]


def _nvml_processes(nvml: Any, gpu: GpuInfo, problems: dict[str, str]) -> list[GpuProcess]:
    """Compute and graphics processes of one GPU; a pid in both lists is one process.
    A list NVML cannot give, or memory it leaves empty, is added to ``problems``."""
    by_pid: dict[int, GpuProcess] = {}
    empty: set[int] = set()
    mig_by_gi = {m.gpu_instance_id: m.uuid for m in gpu.mig if m.gpu_instance_id is not None}
    for kind, call in (("compute", "nvmlDeviceGetComputeRunningProcesses"),
                       ("graphics", "nvmlDeviceGetGraphicsRunningProcesses")):
        try:
            procs = getattr(nvml, call)(gpu.handle)
        except nvml.NVMLError as e:
            if kind == "graphics" and nvml_error_code(nvml, e) == nvml.NVML_ERROR_NOT_SUPPORTED:
                continue  # compute-only GPUs: no graphics list to miss
            problems[call] = f"{call} failed: {e}"
            continue
        for p in procs:
            pid = int(p.pid)
            raw = getattr(p, "usedGpuMemory", None)
            mem = None if raw is None else int(raw)
            if mem is None:
                empty.add(pid)
            mig = mig_by_gi.get(getattr(p, "gpuInstanceId", None))
            if pid in by_pid:
                known = by_pid[pid]
                known.kinds = tuple(sorted({*known.kinds, kind}))
                if mem is not None:  # the same allocation, seen twice
                    known.memory_bytes = mem if known.memory_bytes is None else max(known.memory_bytes, mem)
                known.mig_uuid = known.mig_uuid or mig
            else:
                by_pid[pid] = GpuProcess(pid=pid, gpu_index=gpu.index, gpu_uuid=gpu.uuid, model=gpu.model,
                                         memory_bytes=mem, kinds=(kind,), mig_uuid=mig)
    if any(by_pid[pid].memory_bytes is None for pid in empty):
        pids = sorted(pid for pid in empty if by_pid[pid].memory_bytes is None)
        problems[MEMORY_EMPTY] = (f"NVML left usedGpuMemory empty for pid(s) {', '.join(map(str, pids[:5]))}"
                                  f"{' …' if len(pids) > 5 else ''} (their memory is unknown)")
    return list(by_pid.values())


def attribute(proc: GpuProcess) -> GpuProcess:
    """Fill owner, start time and kernel id from psutil; a vanished pid stays unattributed."""
    try:
        p = psutil.Process(proc.pid)
        with p.oneshot():
            proc.uid = p.uids().real
            proc.create_time = p.create_time()
            proc.cmdline = p.cmdline()
        proc.user = user_name(proc.uid)
        proc.kernel_id = kernel_id(proc.cmdline)
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        proc.uid = proc.user = None
    except psutil.AccessDenied:
        # uids are always readable on Linux; the cmdline may not be (hidepid). Keep what we have.
        log.debug("pid %d: partial information (access denied)", proc.pid)
        if proc.uid is not None:
            proc.user = user_name(proc.uid)
    return proc


def gpu_status(nvml: Any, gpu: GpuInfo) -> GpuStatus:
    try:
        mem = nvml.nvmlDeviceGetMemoryInfo(gpu.handle)
        total, used = int(mem.total), int(mem.used)
    except nvml.NVMLError:
        total, used = gpu.memory_mib << 20, None
    try:
        util: float | None = float(nvml.nvmlDeviceGetUtilizationRates(gpu.handle).gpu) / 100.0
    except nvml.NVMLError:
        util = None
    return GpuStatus(index=gpu.index, uuid=gpu.uuid, model=gpu.model, memory_total_bytes=total,
                     memory_used_bytes=used, utilization=util)


def take_snapshot(nvml: Any, gpus: Iterable[GpuInfo], last_seen: dict[str, int] | None = None,
                  servers: ServerRecords | None = None) -> Snapshot:
    """Every GPU's gauges and every GPU process with its owner and busy fraction, at one
    moment; ``last_seen`` carries the process samples' timestamps from one snapshot to the next.
    ``servers``: the hub's records of the servers it started here; without them no kernel
    counts as a running server's."""
    statuses, processes = [], []
    last_seen = {} if last_seen is None else last_seen
    for gpu in gpus:
        status = gpu_status(nvml, gpu)
        procs = [attribute(p) for p in _nvml_processes(nvml, gpu, status.problems)]
        samples, error = sample_processes(nvml, gpu, last_seen) if procs else ({}, "")
        for p in procs:
            p.sm_util = None if samples is None else samples.get(p.pid, 0.0)
        if not any(c.endswith("RunningProcesses") for c in status.problems):
            status.users, needed = user_utilization(status.utilization, procs, samples)
            if needed:
                status.problems[PROCESS_UTILIZATION] = (
                    f"{PROCESS_UTILIZATION} failed: {error} (several users' processes share the GPU)")
        statuses.append(status)
        processes.extend(procs)
    kernels = [p for p in processes if p.kernel_id is not None and p.uid is not None]
    records = servers.load() if kernels and servers is not None else {}  # read only when a kernel is on a GPU
    for p in kernels:
        p.server_pid = recorded_server_of(p.pid, p.uid, records)
    return Snapshot(taken_at=time.time(), gpus=statuses, processes=processes)
