"""How busy each user is on a GPU, and what the agent cannot see.

A GPU's utilization says how busy the GPU is, not whose work it is. On a GPU
that several users' servers share, the per-user figure comes from
``nvmlDeviceGetProcessUtilization``: SM busy samples per pid since the last call,
added up per user. A process without a sample did no work since then (0 %); no
sample at all is NVML's ``NOT_FOUND``, which means the same for every process.

Where that call fails and one user alone has processes on the GPU, the device's
utilization is that user's, exactly. Where it fails on a GPU of several users,
each of them is *unknown*: never a guess, and never the neighbour's figure, since
idle reclaim would stop a server on it.

Every call whose failure leaves a GPU's use unattributed is a *problem* of that
GPU (the call's name and NVML's words); :class:`AttributionHealth` logs one
WARNING for each change of a GPU's problems, so a failing query is loud once,
not every tick, and its recovery is said too.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping
from typing import Any

from .nvml import GpuInfo, nvml_error_code

log = logging.getLogger("gpupool.agent.attribution")

PROCESS_UTILIZATION = "nvmlDeviceGetProcessUtilization"
#: the problem of a process list whose memory NVML left empty (containers without the host's pid namespace)
MEMORY_EMPTY = "usedGpuMemory"


def sample_processes(nvml: Any, gpu: GpuInfo, last_seen: dict[str, int]) -> tuple[dict[int, float] | None, str]:
    """Each pid's SM busy fraction (0-1) since this GPU's previous sample, and NVML's error
    when it cannot say (``None`` then). ``last_seen`` keeps the newest sample's timestamp
    per GPU UUID between calls, so each call covers the time since the previous one."""
    since = last_seen.get(gpu.uuid, 0)
    try:
        samples = nvml.nvmlDeviceGetProcessUtilization(gpu.handle, since)
    except nvml.NVMLError as e:
        if nvml_error_code(nvml, e) == nvml.NVML_ERROR_NOT_FOUND:
            return {}, ""  # no process worked since the last sample
        return None, str(e) or type(e).__name__
    busy: dict[int, list[float]] = {}
    newest = since
    for s in samples:
        stamp, pid = int(s.timeStamp), int(s.pid)
        if stamp <= since or pid <= 0:  # unused entries of the buffer NVML fills
            continue
        busy.setdefault(pid, []).append(min(100, max(0, int(s.smUtil))) / 100.0)
        newest = max(newest, stamp)
    last_seen[gpu.uuid] = newest
    return {pid: sum(v) / len(v) for pid, v in busy.items()}, ""


def user_utilization(device: float | None, processes: Iterable[Any], samples: Mapping[int, float] | None,
                     ) -> tuple[dict[str, float | None], bool]:
    """Each user's busy fraction of one GPU from their processes (pure), and whether the
    per-process samples were needed and missing (several users, or a pid nobody owns).

    With samples: the sum of the user's processes' samples (capped at 1). Without: the
    device's figure when one user alone has processes there, else unknown (``None``)."""
    procs = list(processes)
    users = sorted({p.user for p in procs if p.user is not None})
    if samples is not None:
        out: dict[str, float | None] = {}
        for user in users:
            out[user] = min(1.0, sum(samples.get(p.pid, 0.0) for p in procs if p.user == user))
        return out, False
    alone = len(users) == 1 and all(p.user is not None for p in procs)
    if alone:
        return {users[0]: device}, False
    return {u: None for u in users}, bool(users)


class AttributionHealth:
    """The problems each GPU had at the last snapshot; one WARNING per change."""

    def __init__(self) -> None:
        self.problems: dict[str, frozenset[str]] = {}

    def update(self, gpus: Iterable[Any]) -> None:
        """Log what changed since the last snapshot: a new failing call, or a recovery."""
        seen = {}
        for g in gpus:
            now = frozenset(g.problems)
            before = self.problems.get(g.uuid, frozenset())
            if now - before:
                log.warning("GPU %d (%s): cannot attribute its use to users: %s", g.index, g.uuid,
                            "; ".join(f"{g.problems[c]}" for c in sorted(now - before)))
            if before - now:
                log.warning("GPU %d (%s): attribution works again (%s answer%s)", g.index, g.uuid,
                            ", ".join(sorted(before - now)), "s" if len(before - now) == 1 else "")
            seen[g.uuid] = now
        self.problems = seen
