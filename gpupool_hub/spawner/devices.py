"""What selects a GPU (environment variables) and what opens one (device nodes).

Two very different things, kept side by side so each is stated once:

* **Variables** only *ask* the GPU libraries to show some devices: whoever runs
  code in a server can set them again. :data:`DEVICE_SELECTION_VARS` lists every
  variable that picks devices for a common runtime, with a value that names no
  device; a kernel started after the pool took a server's GPUs back gets all of
  them (``labext/kernels.py``).
* **Device nodes** are the boundary the kernel enforces: a process that may not
  open ``/dev/nvidia<minor>`` cannot use that GPU, whatever its environment says.
  :func:`device_allow` lists the nodes one allocation needs, for a device cgroup
  (systemd's ``DevicePolicy=closed`` + ``DeviceAllow=``).

A GPU's node is ``/dev/nvidia<minor>``. The minor number is read from the driver
(``/proc/driver/nvidia/gpus/<bus id>/information``: ``Device Minor`` and ``GPU
UUID``) and matched by UUID; where that file is missing (no driver on this
machine), the allocation's GPU index is used, which is the minor number on
standard installs (both follow PCI bus order) but is not guaranteed to be.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Iterable, Mapping
from typing import Any

__all__ = ["CONTROL_NODES", "DEVICE_SELECTION_VARS", "MIG_CAPS", "NVIDIA_PROC", "device_allow", "gpu_minors",
           "no_device_env"]

log = logging.getLogger("gpupool.devices")

#: every variable that selects GPUs for a common runtime -> a value that names no device
DEVICE_SELECTION_VARS: Mapping[str, str] = {
    "CUDA_VISIBLE_DEVICES": "",          # CUDA: empty = no device
    "NVIDIA_VISIBLE_DEVICES": "none",    # NVIDIA container runtime
    "ROCR_VISIBLE_DEVICES": "-1",        # ROCm runtime: an ordinal no device has
    "HIP_VISIBLE_DEVICES": "-1",         # HIP
    "GPU_DEVICE_ORDINAL": "-1",          # AMD OpenCL / ROCm
    "ZE_AFFINITY_MASK": "-1",            # Intel Level Zero
    "ONEAPI_DEVICE_SELECTOR": "!*",      # oneAPI / SYCL: exclude everything
}

#: nodes every CUDA process opens besides its GPUs' (present or not, allowing them grants no GPU)
CONTROL_NODES: tuple[str, ...] = ("/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools",
                                  "/dev/nvidia-modeset")
#: the device group of MIG capability nodes (/dev/nvidia-caps/nvidia-cap<N>), as /proc/devices names it
MIG_CAPS = "char-nvidia-caps"
#: where the NVIDIA driver describes each GPU
NVIDIA_PROC = "/proc/driver/nvidia/gpus"

_FIELD = re.compile(r"^(Device Minor|GPU UUID):\s*(\S+)\s*$", re.MULTILINE)


def no_device_env() -> dict[str, str]:
    """Every device-selecting variable set to name no device."""
    return dict(DEVICE_SELECTION_VARS)


def gpu_minors(proc_dir: str = NVIDIA_PROC) -> dict[str, int]:
    """GPU UUID -> device minor number, from the driver's ``information`` files; {} without a driver."""
    out: dict[str, int] = {}
    try:
        entries = sorted(os.listdir(proc_dir))
    except OSError:
        return out
    for entry in entries:
        try:
            with open(os.path.join(proc_dir, entry, "information"), encoding="utf-8", errors="replace") as f:
                fields = dict(_FIELD.findall(f.read()))
        except OSError:
            continue
        if fields.get("GPU UUID") and fields.get("Device Minor", "").isdigit():
            out[fields["GPU UUID"]] = int(fields["Device Minor"])
    return out


def device_allow(gpus: Iterable[Mapping[str, Any]], minors: Mapping[str, int]) -> list[str]:
    """``DeviceAllow=`` entries for an allocation's GPUs: each GPU's node plus the control nodes;
    none for no GPU. A MIG instance needs its GPU's node and the MIG capability nodes: this allows
    the whole ``nvidia-caps`` group (the allocation does not say which instance ids it has), so on
    a MIG GPU the device cgroup keeps a server to its GPU, not to its instance."""
    gpus = list(gpus)
    if not gpus:
        return []
    nodes: list[str] = []
    for g in gpus:
        minor = minors.get(str(g.get("uuid", "")))
        if minor is None:
            minor = int(g["index"])
            log.debug("GPU %s: minor number unknown, using its index %d", g.get("uuid"), minor)
        node = f"/dev/nvidia{minor}"
        if node not in nodes:
            nodes.append(node)
    entries = [f"{n} rw" for n in (*CONTROL_NODES, *nodes)]
    if any(g.get("mig_uuid") for g in gpus):
        entries.append(f"{MIG_CAPS} r")
    return entries
