"""A GPU Slurm gave whole to one job while another holds its shards (Slurm 22.05's lost shards).

Slurm 22.05.8 forgets a GPU's shards in use when one of two shard jobs on it ends: the node
then shows ``GresUsed=…,shard:a6000:0(IDX:N/A)`` while the other job still holds 4 shards of
GPU 0, and the next ``--gres=gpu:a6000:1`` job gets GPU 0 whole (seen here with plain
``sbatch``; issue 48.4). Through the hub, a user paying for a whole GPU shared it with a
half-share user. :func:`shared_whole` finds such GPUs in ``scontrol -d show job``'s running
jobs; the service reads them at every inventory refresh (``SlurmInventorySource``), logs each
once, shows it on the pool map and charges the whole-GPU allocation only what is left of the
GPU. Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from .parse import SlurmJob, allocation_of

__all__ = ["SharedGpu", "shared_whole"]

#: job states in which a job holds its GRES
_HOLDING = ("RUNNING", "COMPLETING", "SUSPENDED")


@dataclass(frozen=True)
class SharedGpu:
    """GPU ``index`` of ``node``: given whole to ``whole_jobs`` while ``shard_jobs`` hold shards of it."""

    node: str
    index: int
    whole_jobs: tuple[int, ...]
    shard_jobs: tuple[int, ...]
    #: the hub allocations of the whole-GPU jobs (their ``gpupool-allocation=`` comment)
    whole_allocations: tuple[str, ...] = ()
    #: how much of the GPU the shard jobs hold, in milli-GPUs (their shards over the GPU's shards)
    shard_milli: int = 0

    @property
    def left_milli(self) -> int:
        """What is left of the GPU beside the shards: what a whole-GPU job on it is charged for."""
        return max(1000 - self.shard_milli, 0)

    def describe(self) -> str:
        whole = ", ".join(map(str, self.whole_jobs))
        shards = ", ".join(map(str, self.shard_jobs))
        return (f"GPU {self.index} was given whole to Slurm job {whole} while job {shards} holds shards of it "
                "(Slurm 22.05 forgets shards when another shard job on the GPU ends; see docs/slurm.md)")


def shared_whole(jobs: Iterable[SlurmJob], shards_per_gpu: Mapping[str, Mapping[str, int]]) -> list[SharedGpu]:
    """Every GPU that a running job holds whole while another running job holds shards of it;
    ``shards_per_gpu``: node -> GRES type -> shards per GPU (``SlurmNode.shards_per_gpu``)."""
    whole: dict[tuple[str, int], list[SlurmJob]] = {}
    shards: dict[tuple[str, int], list[int]] = {}
    milli: dict[tuple[str, int], int] = {}
    for job in jobs:
        if job.state.split()[0] not in _HOLDING:
            continue
        for node in job.nodes:
            for i in job.gpu_indices(node):
                whole.setdefault((node, i), []).append(job)
            for gres_type, (indices, count) in job.shards.get(node, {}).items():
                per = shards_per_gpu.get(node, {}).get(gres_type, 0)
                for i in indices:
                    shards.setdefault((node, i), []).append(job.job_id)
                    if per and len(indices) == 1:
                        milli[(node, i)] = milli.get((node, i), 0) + count * 1000 // per
    out = []
    for (node, i), holders in sorted(whole.items()):
        if (node, i) in shards:
            allocs = tuple(a for j in holders if (a := allocation_of(j.comment)) is not None)
            out.append(SharedGpu(node, i, tuple(sorted(j.job_id for j in holders)),
                                 tuple(sorted(set(shards[(node, i)]))), allocs, milli.get((node, i), 0)))
    return out
