"""What the Slurm engine adds to the configuration: ``c.GPUPool.slurm_*`` (read by the hub and the
service) and ``c.GPUPoolService``'s Slurm accounting options. Only traitlets here: these classes join
``GPUPool`` and ``GPUPoolService`` when ``gpupool_hub.config`` is imported (``engines.Engine``)."""

from __future__ import annotations

from traitlets import Bool, Dict, Float, HasTraits, List, Unicode

__all__ = ["SlurmServiceSettings", "SlurmSettings"]


class SlurmSettings(HasTraits):
    """``c.GPUPool``'s Slurm settings."""

    slurm_gpu_models = Dict(
        {},
        help="""Slurm GRES type -> GPU model name, e.g. ``{"a6000": "NVIDIA RTX A6000"}`` (inventory
        'slurm', the gpupool-slurm spawner, the 'slurm' usage preset). A GRES type missing from it
        is a start-up error that names it.""",
    ).tag(config=True)

    slurm_partitions = List(
        Unicode(), default_value=None, allow_none=True,
        help="Only the Slurm nodes in any of these partitions (None: every node).",
    ).tag(config=True)

    slurm_conf = Unicode(
        "", help="Path of slurm.conf given to every Slurm command as SLURM_CONF (empty: Slurm's default).",
    ).tag(config=True)

    slurm_allow_env_only_gpu_hiding = Bool(
        False,
        help="""Accept that Slurm jobs are kept from other GPUs only by ``CUDA_VISIBLE_DEVICES``.
        With Slurm (inventory or usage preset 'slurm') and priced GPUs, the service refuses to
        start unless slurm.conf has ``TaskPlugin=task/cgroup`` and cgroup.conf (next to it)
        ``ConstrainDevices=yes``: without that device cgroup a user's code can unset the variable
        and use GPUs the pool charged to someone else (the node agent then stops it after its
        grace, if it runs on the node). True: start anyway.""",
    ).tag(config=True)

    slurm_refresh_interval = Float(
        30, help="Seconds between re-reads of the Slurm nodes (state, GPUs held outside the hub).",
    ).tag(config=True)

    def slurm_env(self) -> dict[str, str] | None:
        """Extra environment for Slurm commands (SLURM_CONF), or None for this process's own."""
        return {"SLURM_CONF": self.slurm_conf} if self.slurm_conf else None


class SlurmServiceSettings(HasTraits):
    """``c.GPUPoolService``'s options of the 'slurm' usage preset (Slurm accounting)."""

    charge_batch_jobs = Bool(
        False,
        help="""usage_preset 'slurm' only: also charge every GPU job of a hub user that the hub did not
        start (plain ``sbatch``/``srun``), to the job's Slurm user when that name is a hub user with an
        account. Off: only the servers the hub started are charged.""",
    ).tag(config=True)
    slurm_usage_options = Dict(
        help="""More keyword arguments for SlurmUsageSource (usage_preset 'slurm'), e.g.
        ``{"settle_seconds": 60, "check_dbd_queue": True, "timeout": 60}``.""",
    ).tag(config=True)
