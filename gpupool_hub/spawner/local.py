"""The ready spawners for processes on the hub's machine: the mixin on JupyterHub's local spawners."""

from __future__ import annotations

from jupyterhub.spawner import LocalProcessSpawner, SimpleLocalProcessSpawner

from .base import GPUPoolSpawner

__all__ = ["GPUPoolLocalProcessSpawner", "GPUPoolSimpleSpawner"]


class GPUPoolLocalProcessSpawner(GPUPoolSpawner, LocalProcessSpawner):
    """LocalProcessSpawner with GPU profiles: the server sees only its GPUs (by UUID)."""


class GPUPoolSimpleSpawner(GPUPoolSpawner, SimpleLocalProcessSpawner):
    """SimpleLocalProcessSpawner with GPU profiles (demo and tests; no user isolation)."""
