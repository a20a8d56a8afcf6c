"""The systemd engine: each server a transient unit with a device cgroup (``engines/systemd/spawner.py``)."""

from .. import Engine

ENGINE = Engine("systemd", spawners=("gpupool-systemd", "GPUPoolSystemdSpawner"))
