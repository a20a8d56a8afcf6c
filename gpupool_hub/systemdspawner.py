"""GPUPoolSystemdSpawner: systemdspawner with gpupool profiles (``pip install gpupool_hub[systemd]``).

Each server runs as a transient systemd unit; like the local spawners it gets
``CUDA_VISIBLE_DEVICES`` / ``NVIDIA_VISIBLE_DEVICES`` with the UUIDs of its
GPUs, and the profile's ``cpu`` / ``memory`` become the unit's CPUQuota and
MemoryMax (systemdspawner's ``cpu_limit`` / ``mem_limit``).
"""

from __future__ import annotations

from .spawner import GPUPoolSpawner

try:
    from systemdspawner import SystemdSpawner
except ImportError as e:  # pragma: no cover - depends on the extra
    raise ImportError(
        "GPUPoolSystemdSpawner needs systemdspawner: pip install 'gpupool_hub[systemd]' "
        "(jupyterhub-systemdspawner>=1)"
    ) from e

__all__ = ["GPUPoolSystemdSpawner"]


class GPUPoolSystemdSpawner(GPUPoolSpawner, SystemdSpawner):
    """SystemdSpawner with GPU profiles; the unit's environment pins its GPUs by UUID."""
