"""The Kubernetes engine: each server a pod on the node the pool chose (``engines/kubernetes/spawner.py``)."""

from .. import Engine

ENGINE = Engine("kubernetes", spawners=("gpupool-kubernetes", "GPUPoolKubeSpawner"))
