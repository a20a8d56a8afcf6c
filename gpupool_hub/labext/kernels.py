"""The kernel-start check of a GPU server (issue 18.7): no new kernel on GPUs taken back.

A server keeps the ``CUDA_VISIBLE_DEVICES`` it was spawned with. After the
pool took its GPUs back (kernels culled, the allocation released) those GPUs
belong to someone else, yet once the cull's pressure ended nothing stopped its
owner from starting a new kernel on them. In a server the spawner gave GPUs
(``GPUPOOL_ALLOCATION`` set), the server extension makes new kernels start
through :class:`GPUGuardKernelManager`: before each start it asks the pool
(``GET me``, the widget's path) whether the server still holds its allocation;
if not, the kernel starts with no GPU: every variable that selects devices
(``CUDA_VISIBLE_DEVICES``, ``NVIDIA_VISIBLE_DEVICES``, ``ROCR_VISIBLE_DEVICES``, ...:
:data:`gpupool_hub.spawner.devices.DEVICE_SELECTION_VARS`) names none, with the reason in
``GPUPOOL_GPUS_REVOKED`` and a warning in the server's log. Variables only ask
the GPU libraries: the boundary is the device cgroup (``gpupool-systemd``,
Slurm's ``ConstrainDevices``, the Kubernetes device plugin) and the node agent,
which stops GPU processes of users who hold no allocation on that GPU. When the
pool cannot be reached the kernel starts as before (the node agent still stops
GPU work on GPUs the user does not hold).
"""

from __future__ import annotations

import os
from typing import Any

from jupyter_server.services.kernels.kernelmanager import ServerKernelManager

from ..spawner.devices import no_device_env
from .handlers import BalanceUnavailable, ServiceLocator, fetch_me

#: set by the spawner on a server with GPUs: the pool's allocation id
ALLOCATION_ENV = "GPUPOOL_ALLOCATION"
#: set in a kernel started after the server's GPUs were taken back: why it has no GPU
REVOKED_ENV = "GPUPOOL_GPUS_REVOKED"
#: the default kernel manager class of jupyter_server's AsyncMappingKernelManager, which this one extends
DEFAULT_CLASS = "jupyter_server.services.kernels.kernelmanager.ServerKernelManager"
GUARD_CLASS = "gpupool_hub.labext.kernels.GPUGuardKernelManager"

_locator = ServiceLocator()


async def revoked_reason(allocation: str) -> str | None:
    """Why this server no longer holds ``allocation``, or None (held, or the pool did not answer)."""
    try:
        me = await fetch_me(_locator)
    except BalanceUnavailable:
        return None
    if any(a.get("id") == allocation for a in me.get("allocations") or []):
        return None
    latest = next(iter(me.get("notices") or []), None)
    why = f": {latest['title']} ({latest['why']})" if isinstance(latest, dict) and "title" in latest else ""
    return (f"the GPU pool took this server's GPUs back (allocation {allocation} released){why}; "
            "stop the server and start it again to get GPUs")


def revoked_env(env: dict[str, str], why: str) -> dict[str, str]:
    """A kernel's environment once its server's GPUs were taken back: no variable names a device."""
    return {**env, **no_device_env(), REVOKED_ENV: why}


class GPUGuardKernelManager(ServerKernelManager):
    """A kernel manager that starts kernels without GPUs once the server's GPUs were taken back."""

    async def _async_pre_start_kernel(self, **kw: Any) -> Any:
        allocation = os.environ.get(ALLOCATION_ENV, "")
        why = await revoked_reason(allocation) if allocation else None
        if why:
            kw["env"] = revoked_env(dict(kw.get("env") or os.environ), why)
            self.log.warning("gpupool: new kernel without GPUs: %s", why)
        return await super()._async_pre_start_kernel(**kw)


def guard_kernels(serverapp: Any) -> bool:
    """Use the guard for new kernels in a GPU server whose kernel manager class is the default."""
    km = getattr(serverapp, "kernel_manager", None)
    if not os.environ.get(ALLOCATION_ENV) or km is None or getattr(km, "kernel_manager_class", None) != DEFAULT_CLASS:
        return False
    km.kernel_manager_class = GUARD_CLASS  # a traitlet: its observer rebuilds the kernel manager factory
    return True
