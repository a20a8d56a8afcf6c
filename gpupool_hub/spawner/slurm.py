"""Where ``gpupool-slurm`` pointed before the Slurm package (issue 38): the spawner is
:mod:`gpupool_hub.slurm.spawner`. Kept for installs whose entry-point metadata predates it
(an editable install until ``pip install -e .`` runs again) and configurations naming this path."""

from ..slurm.spawner import GPUPoolSlurmSpawner

__all__ = ["GPUPoolSlurmSpawner"]
