"""A table-driven stand-in for ``pynvml`` (nvidia-ml-py), for machines without a GPU.

It provides exactly the functions and constants the agent calls, with the same
shapes pynvml returns (``bytes`` UUIDs and bus ids, ``[current, pending]`` MIG
mode, process objects with ``pid``/``usedGpuMemory``/``gpuInstanceId``) so the
agent's decoding is exercised too. Processes are whatever pids the test puts in
the table: the tests spawn real sleepers and list their pids here, so
attribution and enforcement run against real processes.

Table::

    {
      "driver": "550.54.15",
      "gpus": [
        {"uuid": "GPU-0", "name": "NVIDIA A100-SXM4-80GB", "memory_total": 80 << 30,
         "memory_used": 1 << 30, "utilization": 37, "bus_id": "00000000:17:00.0",
         "mig": [{"uuid": "MIG-0a", "name": "NVIDIA A100-SXM4-80GB MIG 3g.40gb",
                  "gi_id": 1, "slices": 3, "memory_total": 40 << 30}],
         "nvlinks": {0: "00000000:18:00.0", 1: "00000000:18:00.0"},   # link -> remote bus id
         "processes": [{"pid": 1234, "memory": 512 << 20, "kind": "compute", "gi_id": 1,
                        "sm": 90, "mem_util": 30}],
         "fail": {"nvmlDeviceGetNvLinkState": NVML_ERROR_NOT_SUPPORTED}},
      ],
      "topology": {(0, 1): 10},      # NVML level per pair; absent pairs are SYSTEM
      "init_error": None,            # e.g. NVML_ERROR_LIBRARY_NOT_FOUND: nvmlInit fails
    }

A process's ``"memory": None`` is memory NVML leaves empty (``usedGpuMemory``
is ``None``, as in containers without the host's pid namespace); no ``"memory"``
key means 0 bytes. ``"sm"`` (0-100, with ``"mem_util"``) gives the process a
sample in ``nvmlDeviceGetProcessUtilization``; a process without ``"sm"`` did no
work since the last sample and has none, and with no sample at all the call
raises ``NVMLError_NotFound``, as the real library does. ``"fail"`` makes any
device call of that GPU fail with the given code; a top-level ``"fail"`` does the
same for every GPU. Removing the entry is the recovery.

The table may be edited between calls (add a process, drop a GPU); every call
reads it afresh, like NVML does.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass
from typing import Any

NVML_SUCCESS = 0
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_INVALID_ARGUMENT = 2
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NO_PERMISSION = 4
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15

NVML_FEATURE_DISABLED = 0
NVML_FEATURE_ENABLED = 1
NVML_DEVICE_MIG_DISABLE = 0
NVML_DEVICE_MIG_ENABLE = 1
NVML_NVLINK_MAX_LINKS = 18

NVML_TOPOLOGY_INTERNAL = 0
NVML_TOPOLOGY_SINGLE = 10
NVML_TOPOLOGY_MULTIPLE = 20
NVML_TOPOLOGY_HOSTBRIDGE = 30
NVML_TOPOLOGY_NODE = 40
NVML_TOPOLOGY_SYSTEM = 50

_MESSAGES = {
    NVML_ERROR_UNINITIALIZED: "Uninitialized",
    NVML_ERROR_INVALID_ARGUMENT: "Invalid Argument",
    NVML_ERROR_NOT_SUPPORTED: "Not Supported",
    NVML_ERROR_NO_PERMISSION: "Insufficient Permissions",
    NVML_ERROR_NOT_FOUND: "Not Found",
    NVML_ERROR_LIBRARY_NOT_FOUND: "NVML Shared Library Not Found",
    NVML_ERROR_GPU_IS_LOST: "GPU is lost",
}


class NVMLError(Exception):
    """Same contract as pynvml's: ``.value`` is the NVML return code."""

    def __init__(self, value: int) -> None:
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _MESSAGES.get(self.value, f"Unknown Error {self.value}")


class NVMLError_NotFound(NVMLError):  # noqa: N801 (pynvml's own name)
    """pynvml raises a subclass per code; the agent only reads ``.value``."""

    def __init__(self) -> None:
        super().__init__(NVML_ERROR_NOT_FOUND)


@dataclass
class _Handle:
    gpu: int
    mig: int | None = None


class _Obj:
    """pynvml returns ctypes structures with attribute access; this mimics them."""

    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)


class FakeNVML:
    """One fake NVML library over a table; pass it wherever the agent takes ``nvml=``."""

    NVMLError = NVMLError
    NVMLError_NotFound = NVMLError_NotFound

    def __init__(self, table: dict[str, Any]) -> None:
        self.table = copy.deepcopy(table)
        self.initialized = 0
        self.calls: list[str] = []
        for name, value in globals().items():
            if name.startswith("NVML_"):
                setattr(self, name, value)

    # ------------------------------------------------------------ helpers

    def _gpu(self, handle: _Handle) -> dict[str, Any]:
        if not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        if not isinstance(handle, _Handle) or handle.gpu >= len(self.table["gpus"]):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return self.table["gpus"][handle.gpu]

    def _check(self, fn: str, handle: _Handle) -> dict[str, Any]:
        self.calls.append(fn)
        gpu = self._gpu(handle)
        code = gpu.get("fail", {}).get(fn, self.table.get("fail", {}).get(fn))
        if code is not None:
            raise NVMLError(code)
        return gpu

    def _mig(self, handle: _Handle) -> dict[str, Any]:
        gpu = self._gpu(handle)
        return gpu["mig"][handle.mig] if handle.mig is not None else gpu

    # ------------------------------------------------------------ library

    def nvmlInit(self) -> None:
        self.calls.append("nvmlInit")
        if self.table.get("init_error") is not None:
            raise NVMLError(self.table["init_error"])
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self.calls.append("nvmlShutdown")
        if not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        self.initialized -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        if not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        return self.table.get("driver", "550.00")

    def nvmlDeviceGetCount(self) -> int:
        if not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        return len(self.table["gpus"])

    def nvmlDeviceGetHandleByIndex(self, index: int) -> _Handle:
        if not self.initialized:
            raise NVMLError(NVML_ERROR_UNINITIALIZED)
        if not 0 <= index < len(self.table["gpus"]):
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(index)

    # ------------------------------------------------------------ device facts

    def nvmlDeviceGetUUID(self, handle: _Handle) -> bytes:
        self._check("nvmlDeviceGetUUID", handle)
        return self._mig(handle)["uuid"].encode()

    def nvmlDeviceGetName(self, handle: _Handle) -> str:
        self._check("nvmlDeviceGetName", handle)
        return self._mig(handle)["name"]

    def nvmlDeviceGetMemoryInfo(self, handle: _Handle) -> _Obj:
        self._check("nvmlDeviceGetMemoryInfo", handle)
        d = self._mig(handle)
        total = d.get("memory_total", 0)
        used = d.get("memory_used", 0)
        return _Obj(total=total, used=used, free=total - used)

    def nvmlDeviceGetUtilizationRates(self, handle: _Handle) -> _Obj:
        gpu = self._check("nvmlDeviceGetUtilizationRates", handle)
        return _Obj(gpu=gpu.get("utilization", 0), memory=gpu.get("memory_utilization", 0))

    def nvmlDeviceGetPciInfo(self, handle: _Handle) -> _Obj:
        gpu = self._check("nvmlDeviceGetPciInfo", handle)
        return _Obj(busId=gpu.get("bus_id", f"00000000:{handle.gpu + 1:02X}:00.0").encode())

    # ------------------------------------------------------------ MIG

    def nvmlDeviceGetMigMode(self, handle: _Handle) -> list[int]:
        gpu = self._check("nvmlDeviceGetMigMode", handle)
        if "mig" not in gpu:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        mode = NVML_DEVICE_MIG_ENABLE if gpu["mig"] else NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, handle: _Handle) -> int:
        self._check("nvmlDeviceGetMaxMigDeviceCount", handle)
        return 7

    def nvmlDeviceGetMigDeviceHandleByIndex(self, handle: _Handle, index: int) -> _Handle:
        gpu = self._check("nvmlDeviceGetMigDeviceHandleByIndex", handle)
        if index >= len(gpu.get("mig", [])):
            raise NVMLError(NVML_ERROR_NOT_FOUND)
        return _Handle(handle.gpu, index)

    def nvmlDeviceGetGpuInstanceId(self, handle: _Handle) -> int:
        self._check("nvmlDeviceGetGpuInstanceId", handle)
        if handle.mig is None:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return self._mig(handle)["gi_id"]

    def nvmlDeviceGetAttributes(self, handle: _Handle) -> _Obj:
        self._check("nvmlDeviceGetAttributes", handle)
        d = self._mig(handle)
        return _Obj(gpuInstanceSliceCount=d.get("slices", 7), memorySizeMB=d.get("memory_total", 0) >> 20)

    # ------------------------------------------------------------ links

    def nvmlDeviceGetNvLinkState(self, handle: _Handle, link: int) -> int:
        gpu = self._check("nvmlDeviceGetNvLinkState", handle)
        if not 0 <= link < NVML_NVLINK_MAX_LINKS:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        links = gpu.get("nvlinks")
        if links is None:
            raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
        return NVML_FEATURE_ENABLED if link in links else NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkRemotePciInfo(self, handle: _Handle, link: int) -> _Obj:
        gpu = self._check("nvmlDeviceGetNvLinkRemotePciInfo", handle)
        links = gpu.get("nvlinks") or {}
        if link not in links:
            raise NVMLError(NVML_ERROR_INVALID_ARGUMENT)
        return _Obj(busId=links[link].encode())

    def nvmlDeviceGetTopologyCommonAncestor(self, a: _Handle, b: _Handle) -> int:
        self._check("nvmlDeviceGetTopologyCommonAncestor", a)
        self._check("nvmlDeviceGetTopologyCommonAncestor", b)
        topo = self.table.get("topology", {})
        key = (min(a.gpu, b.gpu), max(a.gpu, b.gpu))
        return topo.get(key, NVML_TOPOLOGY_SYSTEM)

    # ------------------------------------------------------------ processes

    def _procs(self, fn: str, handle: _Handle, kind: str) -> list[_Obj]:
        gpu = self._check(fn, handle)
        out = []
        for p in gpu.get("processes", []):
            if p.get("kind", "compute") == kind:
                out.append(_Obj(pid=p["pid"], usedGpuMemory=p.get("memory", 0),
                                gpuInstanceId=p.get("gi_id", 0xFFFFFFFF), computeInstanceId=0xFFFFFFFF))
        return out

    def nvmlDeviceGetComputeRunningProcesses(self, handle: _Handle) -> list[_Obj]:
        return self._procs("nvmlDeviceGetComputeRunningProcesses", handle, "compute")

    def nvmlDeviceGetGraphicsRunningProcesses(self, handle: _Handle) -> list[_Obj]:
        return self._procs("nvmlDeviceGetGraphicsRunningProcesses", handle, "graphics")

    def nvmlDeviceGetProcessUtilization(self, handle: _Handle, lastSeenTimeStamp: int) -> list[_Obj]:
        """``c_nvmlProcessUtilizationSample_t`` entries (timestamps in microseconds) of the
        processes that worked since ``lastSeenTimeStamp``; none: ``NVMLError_NotFound``."""
        gpu = self._check("nvmlDeviceGetProcessUtilization", handle)
        now_us = int(time.time() * 1_000_000)
        out = [_Obj(pid=p["pid"], timeStamp=now_us, smUtil=p["sm"], memUtil=p.get("mem_util", 0), encUtil=0,
                    decUtil=0)
               for p in gpu.get("processes", []) if p.get("sm") is not None and now_us > lastSeenTimeStamp]
        if not out:
            raise NVMLError_NotFound()
        return out


def load(table: dict[str, Any]) -> FakeNVML:
    """A fake library over a copy of ``table`` (edit ``.table`` to change the machine)."""
    return FakeNVML(table)
