"""The pool's nodes, jobs and queue from a Slurm cluster: :class:`SlurmInventory`, the
inventory source behind ``c.GPUPool.inventory = "slurm"``: :class:`SlurmInventorySource`
(an :class:`~gpupool_hub.inventory.sources.InventorySource`).

What is read:

* ``scontrol -d show node -o``: the nodes (:mod:`gpupool_hub.engines.slurm.scontrol_nodes`).
* ``scontrol -d show job -o <id>``: the GPU indices Slurm really bound on
  each node (``GRES=gpu:a6000:2(IDX:0,2)``).
* ``squeue``: job state and pending reason.
* ``scontrol show config`` and ``cgroup.conf``: whether jobs are confined to
  their GPUs (:mod:`gpupool_hub.engines.slurm.confinement`).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from ...inventory.sources import InventorySource, NodeStatus, SourceDown, SourceIncomplete
from .commands import Runner, SlurmCommandError, SlurmError, SlurmOutputError, controller_unreachable, run_slurm
from .confinement import device_confinement_problems, key_values
from .scontrol_nodes import SlurmNode, check_models, parse_nodes
from .ends import END_STATES
from .parse import SQUEUE_FORMAT, QueueEntry, SlurmJob, allocation_of, job_records, parse_job, parse_squeue
from .shared import SharedGpu, shared_whole

__all__ = ["SlurmInventory", "SlurmInventorySource"]


class SlurmInventory:
    """Reads nodes, jobs and the queue from a Slurm cluster through one runner.

    ``models`` maps GRES types to model names. ``partitions`` limits the nodes
    to those in any of the given partitions (the ones the hub submits to).
    ``runner`` replaces :func:`run_slurm` (tests); ``env`` is passed to it
    (e.g. ``{"SLURM_CONF": ...}`` merged into this process's environment).
    """

    def __init__(self, models: Mapping[str, str], *, partitions: Iterable[str] | None = None,
                 runner: Runner | None = None, env: Mapping[str, str] | None = None,
                 timeout: float = 30, skip_unmapped: bool = False) -> None:
        check_models(models)
        self.models = dict(models)
        self.skip_unmapped = skip_unmapped
        self.partitions = frozenset(partitions) if partitions is not None else None
        if runner is None:
            full_env = {**os.environ, **env} if env is not None else None

            def runner(argv: Sequence[str]) -> str:
                return run_slurm(argv, env=full_env, timeout=timeout)
        self._run = runner

    def check_device_confinement(self) -> None:
        """Start-up check (:func:`device_confinement_problems`); SlurmError naming every problem.
        cgroup.conf is read next to the slurm.conf that ``scontrol show config`` names."""
        show = self._run(["scontrol", "show", "config"])
        slurm_conf = key_values(show, "=").get("slurm_conf") or "/etc/slurm/slurm.conf"
        path = os.path.join(os.path.dirname(slurm_conf), "cgroup.conf")
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                cgroup_conf: str | None = f.read()
        except OSError:
            cgroup_conf = None
        problems = device_confinement_problems(show, cgroup_conf, path)
        if problems:
            raise SlurmError("Slurm jobs are kept from other GPUs only by CUDA_VISIBLE_DEVICES, which a user can "
                             "change: " + "; ".join(problems) + ". Set ConstrainDevices=yes, or accept hiding by "
                             "environment only with c.GPUPool.slurm_allow_env_only_gpu_hiding = True")

    def nodes(self) -> list[SlurmNode]:
        nodes = parse_nodes(self._run(["scontrol", "--details", "show", "node", "--oneliner"]), self.models,
                            self.skip_unmapped)
        if self.partitions is not None:
            nodes = [n for n in nodes if self.partitions & set(n.partitions)]
        return nodes

    def node_configs(self) -> list[dict[str, Any]]:
        """All nodes as ``c.GPUPool.nodes`` entries (state and GPUs in use are not part of it)."""
        return [n.config() for n in self.nodes()]

    def job(self, job_id: int) -> SlurmJob | None:
        """One job with the GPUs bound to it; None when slurmctld no longer knows it."""
        if isinstance(job_id, bool) or not isinstance(job_id, int) or job_id <= 0:
            raise ValueError(f"job id must be a positive integer, got {job_id!r}")
        try:
            text = self._run(["scontrol", "--details", "show", "job", "--oneliner", str(job_id)])
        except SlurmCommandError as e:
            if "Invalid job id" in str(e):
                return None
            raise
        return parse_job(text)

    def jobs(self) -> list[SlurmJob]:
        """Every job slurmctld knows, with its GPUs, start and comment (``scontrol -d show job -o``)."""
        text = self._run(["scontrol", "--details", "show", "job", "--oneliner"])
        if not text.strip() or text.strip().startswith("No jobs"):
            return []
        return [parse_job(record) for record in job_records(text)]

    def hub_allocations(self) -> set[str]:
        """The allocations whose server's job slurmctld still runs or has queued (by the job's
        ``gpupool-allocation=<id>`` comment); a job in an end state counts for nothing."""
        return {alloc for job in self.jobs() if job.state.split()[0] not in END_STATES
                and (alloc := allocation_of(job.comment)) is not None}

    def queue(self, job_ids: Iterable[int] | None = None) -> list[QueueEntry]:
        """Jobs slurmctld knows (all states), optionally only the given ids."""
        argv = ["squeue", "--noheader", "--states=all", f"--format={SQUEUE_FORMAT}"]
        if job_ids is not None:
            ids = sorted(set(job_ids))
            for j in ids:
                if isinstance(j, bool) or not isinstance(j, int) or j <= 0:
                    raise ValueError(f"job id must be a positive integer, got {j!r}")
            if not ids:
                return []
            argv.append("--jobs=" + ",".join(map(str, ids)))
        try:
            return parse_squeue(self._run(argv))
        except SlurmCommandError as e:
            if job_ids is not None and "Invalid job id" in str(e):
                return []
            raise


class SlurmInventorySource(InventorySource):
    dynamic = True
    hardware_hint = ("the pool has what `scontrol show node` lists in c.GPUPool.slurm_partitions, of the GRES "
                     "types c.GPUPool.slurm_gpu_models maps")

    def __init__(self, models: Mapping[str, str], *, partitions: list[str] | None = None,
                 env: Mapping[str, str] | None = None, inventory: SlurmInventory | None = None,
                 refresh_interval: float = 30.0) -> None:
        if not models:
            raise ValueError("c.GPUPool.inventory = 'slurm' needs c.GPUPool.slurm_gpu_models, e.g. "
                             "{'a6000': 'NVIDIA RTX A6000'}")
        # an unmapped GRES type leaves its GPUs out (NodeStatus.problem), never the whole pool
        self.slurm = inventory or SlurmInventory(models, partitions=partitions, env=env, skip_unmapped=True)
        self.refresh_interval = refresh_interval

    def nodes(self) -> list[dict[str, Any]]:
        return self.slurm.node_configs()

    def node_status(self) -> dict[str, NodeStatus]:
        """Each node's state and GPUs in use, and the GPUs Slurm gave whole while shards of them are
        held (:mod:`.shared`): read at every refresh, so seen within one. slurmctld down is
        ``SourceDown``; an answer without GPU indices (as just after a restart) ``SourceIncomplete``."""
        try:
            return self._node_status()
        except SlurmCommandError as e:
            if controller_unreachable(str(e)):
                raise SourceDown(str(e)) from e
            raise
        except SlurmOutputError as e:
            raise SourceIncomplete(str(e)) from e

    def _node_status(self) -> dict[str, NodeStatus]:
        nodes = self.slurm.nodes()
        shared: dict[str, list[SharedGpu]] = {}
        if any(n.shards_per_gpu for n in nodes):  # shards configured: ask for the jobs too
            for gpu in shared_whole(self.slurm.jobs(), {n.name: n.shards_per_gpu for n in nodes}):
                shared.setdefault(gpu.node, []).append(gpu)
        return {n.name: NodeStatus(n.name, n.takes_placements, n.why_not, n.gpus_in_use,
                                   "; ".join([*([n.problem] if n.problem else []),
                                              *(g.describe() for g in shared.get(n.name, []))]) or None,
                                   tuple(shared.get(n.name, ())))
                for n in nodes}
