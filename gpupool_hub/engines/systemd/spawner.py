"""GPUPoolSystemdSpawner: systemdspawner with gpupool profiles (``pip install gpupool_hub[systemd]``).

Each server runs as a transient systemd unit. The profile's ``cpu`` / ``memory``
become the unit's CPUQuota and MemoryMax (systemdspawner's ``cpu_limit`` /
``mem_limit``), and its GPUs are behind a device cgroup, the boundary the kernel
enforces:

* ``DevicePolicy=closed``: the unit may open systemd's standard pseudo devices
  (``/dev/null``, ``/dev/zero``, ``/dev/full``, ``/dev/random``, ``/dev/urandom``,
  ``/dev/tty``, ``/dev/ptmx`` and the ``/dev/pts`` terminals) and what
  ``DeviceAllow=`` lists, nothing else;
* ``DeviceAllow=``: exactly the allocated GPUs' ``/dev/nvidia<minor>`` plus the
  control nodes CUDA opens (``/dev/nvidiactl``, ``/dev/nvidia-uvm``,
  ``/dev/nvidia-uvm-tools``, ``/dev/nvidia-modeset``; MIG: the ``nvidia-caps``
  group); a CPU-only server gets no entry, so no GPU at all.

The environment still names the GPUs by UUID (``CUDA_VISIBLE_DEVICES``), which
keeps CUDA's numbering to the allowed GPUs; setting it differently opens nothing.

When the pool takes a running server's GPUs back (its kernels culled, its
allocation released), the hub's next ``poll`` of the server sees the allocation
gone and empties the unit's ``DeviceAllow=`` (``systemctl set-property --runtime
<unit> DeviceAllow=``, an argv list, no shell): from then on no process of the
unit can open a GPU. A process that already has a GPU open keeps its open file
descriptors (device cgroups check at open); the node agent stops those, since
their owner no longer holds that GPU.
"""

from __future__ import annotations

import asyncio
from typing import Any

from traitlets import Unicode
from urllib.parse import quote

from ...spawner.devices import NVIDIA_PROC, device_allow, gpu_minors
from ...spawner import GPUPoolSpawner
from ...spawner.errors import require_login_name, require_unix_account

try:
    from systemdspawner import SystemdSpawner
except ImportError as e:  # pragma: no cover - depends on the extra
    raise ImportError(
        "GPUPoolSystemdSpawner needs systemdspawner: pip install 'gpupool_hub[systemd]' "
        "(jupyterhub-systemdspawner>=1)"
    ) from e

__all__ = ["GPUPoolSystemdSpawner"]


class GPUPoolSystemdSpawner(GPUPoolSpawner, SystemdSpawner):
    """SystemdSpawner with GPU profiles; a device cgroup keeps each unit to its allocated GPUs."""

    nvidia_proc_dir = Unicode(
        NVIDIA_PROC,
        help="Where the NVIDIA driver describes each GPU (Device Minor, GPU UUID): how a GPU's UUID becomes "
             "its /dev/nvidia<minor>. Where it is missing, the GPU's index is taken as its minor number.",
    ).tag(config=True)

    def gpupool_check_user(self) -> None:
        """The hub's user name is in the unit's name (``unit_name_template``) and, without
        ``dynamic_users``, names the account the unit runs as (``username_template``): each must be
        an ordinary login name, the account one ``pwd`` finds (unixname.RULE), else 403 before the
        pool is asked for anything."""
        require_login_name(self.user.name)
        if not self.dynamic_users:
            require_unix_account(self._expand_user_vars(self.username_template), self.config)

    def gpupool_unit_properties(self, allocation: dict[str, Any] | None) -> dict[str, Any]:
        """The unit's device properties for ``allocation`` on top of the admin's ``unit_extra_properties``
        (their ``DeviceAllow`` entries are kept, e.g. ``/dev/fuse``; a ``strict`` policy stays strict)."""
        props = dict(self.gpupool_allocation_overrides.base("unit_extra_properties"))
        admin = props.get("DeviceAllow", [])
        admin = [admin] if isinstance(admin, str) else list(admin)
        gpus = (allocation or {}).get("gpus", [])
        props["DeviceAllow"] = admin + device_allow(gpus, gpu_minors(self.nvidia_proc_dir) if gpus else {})
        if not props["DeviceAllow"]:
            del props["DeviceAllow"]  # systemd-run refuses an empty assignment: nothing to allow
        if props.get("DevicePolicy") != "strict":
            props["DevicePolicy"] = "closed"
        return props

    def apply_gpupool_allocation(self, allocation: dict[str, Any] | None) -> None:
        super().apply_gpupool_allocation(allocation)
        self.gpupool_allocation_overrides.set({"unit_extra_properties": self.gpupool_unit_properties(allocation)})

    def _expand_user_vars(self, string: Any) -> Any:
        # systemdspawner expands {USERNAME} in every extra property, lists included (several DeviceAllow=)
        if isinstance(string, list):
            return [super(GPUPoolSystemdSpawner, self)._expand_user_vars(s) for s in string]
        return super()._expand_user_vars(string)

    # ------------------------------------------------------------ revocation

    async def gpupool_allocation_revoked(self) -> bool:
        """Whether the pool released this running server's allocation (kernels culled, GPUs taken back).
        A service that does not answer revokes nothing: the agent still guards the GPUs."""
        alloc = self.gpupool_allocation_id
        if not alloc:
            return False
        try:
            status, body = await self.gpupool_request("GET", f"/allocations/{quote(alloc, safe='')}")
        except Exception as e:  # the service away: ask again at the next poll
            self.log.debug("Could not ask the pool about allocation %s: %s", alloc, e)
            return False
        return status == 404 or (status == 200 and bool((body.get("allocation") or {}).get("released_at")))

    async def gpupool_drop_devices(self) -> bool:
        """Empty the running unit's ``DeviceAllow=``: it can open no GPU any more."""
        argv = ["systemctl", "set-property", "--runtime", self.unit_name, "DeviceAllow="]
        proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.DEVNULL,
                                                    stderr=asyncio.subprocess.PIPE)
        _, err = await proc.communicate()
        if proc.returncode != 0:
            self.log.error("Could not take the GPUs of unit %s away (%s): %s", self.unit_name, argv,
                           err.decode(errors="replace").strip())
            return False
        self.log.warning("The pool took the GPUs of %s back: unit %s may open no GPU any more",
                         self._log_name, self.unit_name)
        return True

    async def poll(self) -> int | None:
        status = await super().poll()
        if status is None and self.gpupool_allocation_id and not self._gpupool_starting \
                and not self._gpupool_devices_dropped and await self.gpupool_allocation_revoked():
            self._gpupool_devices_dropped = await self.gpupool_drop_devices()
        return status

    _gpupool_devices_dropped = False

    async def start(self) -> Any:
        self._gpupool_devices_dropped = False
        return await super().start()
