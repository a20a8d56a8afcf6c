"""What the service checks and builds when the Slurm engine is in use: its start checks (device
confinement, shards for share profiles, share profiles against the 'slurm' usage preset), the
'slurm' usage preset (sacct) and its options, and which hub jobs Slurm still runs (reconcile).
Moved here from the service (issue 49.2): the service asks the engine, naming none."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from collections.abc import Awaitable, Callable
from typing import Any

from ...profiles import Profile
from ...usage.base import UsageConfigError

log = logging.getLogger("gpupool")

#: the spawner names that run servers as Slurm jobs (``engine.ENGINE.spawners``)
SPAWNERS = ("gpupool-slurm", "gpupool_hub.engines.slurm.spawner.GPUPoolSlurmSpawner", "GPUPoolSlurmSpawner")


def _spawns_slurm(service: Any) -> bool:
    """Whether the configuration runs the hub with gpupool-slurm."""
    spawner_class = service.config.get("JupyterHub", {}).get("spawner_class", "")
    name = spawner_class if isinstance(spawner_class, str) else (
        f"{getattr(spawner_class, '__module__', '')}.{getattr(spawner_class, '__name__', '')}")
    return name in SPAWNERS[:2] or "GPUPoolSlurmSpawner" in service.config


def usage_options_check(service: Any, preset: str) -> None:
    """The 'slurm' preset's options given to another preset: a start-up error naming them."""
    if service.charge_batch_jobs and preset != "slurm":
        raise UsageConfigError(
            f"c.GPUPoolService.charge_batch_jobs = True needs usage_preset = 'slurm' (it is {preset!r}): "
            "only Slurm accounting sees jobs the hub did not start")
    if service.slurm_usage_options and preset != "slurm":
        raise UsageConfigError("c.GPUPoolService.slurm_usage_options is only read with usage_preset = 'slurm'")


def check_slurm_gpu_boundary(service: Any, profiles: list[Profile]) -> None:
    """With Slurm and priced GPUs, a job must be confined to its GPUs by a device cgroup
    (ConstrainDevices), or the admin accepts hiding by environment only. slurmctld not
    answering is only a warning, as for the accounting check."""
    from .commands import SlurmCommandError, SlurmError
    from .inventory import SlurmInventory

    s = service.settings_
    slurm = s.inventory == "slurm" or service.usage_preset == "slurm"
    priced = bool(s.prices) or bool(s.mig_prices) or s.default_price is not None
    if not slurm or not priced or not s.slurm_gpu_models or s.slurm_allow_env_only_gpu_hiding:
        return
    try:
        SlurmInventory(s.slurm_gpu_models, env=s.slurm_env()).check_device_confinement()
    except SlurmCommandError as e:
        log.warning("gpupool: could not check that Slurm confines jobs to their GPUs: %s", e)
    except SlurmError as e:
        raise SystemExit(f"gpupool: {e}") from None


def check_slurm_share_charging(service: Any, profiles: list[Profile]) -> None:
    """The 'slurm' usage preset charges sacct's gres/gpu only: a share, a shard job, would be charged
    nothing. Until sacct's gres/shard is read, a gpu_fraction profile with gpupool-slurm is charged
    from the pool's own records (usage_preset 'gpupool', the share held), or the service does not start."""
    shares = [p.slug for p in profiles if p.gpu_milli]
    if shares and service.usage_preset == "slurm" and _spawns_slurm(service):
        problem = (f"profile(s) {', '.join(map(repr, shares))} give a share of a GPU, which gpupool-slurm asks "
                   "of Slurm as shards (gres/shard), but usage_preset = 'slurm' charges only whole GPUs "
                   "from sacct (gres/gpu): these servers would be charged nothing. Leave "
                   "c.GPUPoolService.usage_preset at 'gpupool' (charges the share each allocation held), "
                   "or take the profiles out (docs/slurm.md, 'GPU shares')")
        service.log.critical("%s", problem)
        raise SystemExit(f"gpupool: {problem}")


def check_slurm_shares(service: Any, profiles: list[Profile]) -> None:
    """With gpupool-slurm, a gpu_fraction profile is asked of Slurm as shards (gres/shard): every
    node with GPUs of its models must have them (slurm/shares.py), else the service does not start,
    naming the profile and the lines to add. slurmctld not answering is only a warning."""
    from .commands import SlurmCommandError, SlurmError
    from .inventory import SlurmInventory
    from .shares import share_problems

    s = service.settings_
    if not any(p.gpu_milli for p in profiles) or not _spawns_slurm(service) or not s.slurm_gpu_models:
        return
    try:
        nodes = SlurmInventory(s.slurm_gpu_models, env=s.slurm_env(), skip_unmapped=True).nodes()
    except SlurmCommandError as e:
        log.warning("gpupool: could not check that Slurm has shards for the GPU-share profiles: %s", e)
        return
    except SlurmError as e:
        raise SystemExit(f"gpupool: {e}") from None
    problems = share_problems(profiles, nodes, s.slurm_gpu_models)
    if problems:
        service.log.critical("%s", "; ".join(problems))
        raise SystemExit("gpupool: " + "; ".join(problems))


def hub_jobs_alive(service: Any) -> Callable[[], Awaitable[set[str]]] | None:
    """With the Slurm spawner (or inventory), the allocations whose job slurmctld still has, read off the
    event loop: reconcile releases a stopped server's allocation once its job is gone (issue 48.2)."""
    s = service.settings_
    if not s.slurm_gpu_models or not (s.inventory == "slurm" or _spawns_slurm(service)):
        return None
    from .inventory import SlurmInventory

    inventory = SlurmInventory(s.slurm_gpu_models, env=s.slurm_env(), skip_unmapped=True)

    async def alive() -> set[str]:
        return await asyncio.get_running_loop().run_in_executor(None, inventory.hub_allocations)

    return alive


def usage_source(service: Any, settings: Any, ledger: Any) -> Any:
    """The 'slurm' usage preset: GPU-seconds from sacct, charged to the hub user each job is for."""
    from .accounting import CLIENT_COMMANDS, SlurmUsageSource
    from .commands import SlurmCommandError, SlurmError
    from .owners import ALLOCATION_COMMENT, HubJobOwners

    if not settings.slurm_gpu_models:
        raise UsageConfigError(
            "usage_preset = 'slurm' needs c.GPUPool.slurm_gpu_models, the GRES type -> GPU model map, "
            "e.g. {'a6000': 'NVIDIA RTX A6000'}")
    env = settings.slurm_env()
    path = (env or {}).get("PATH", os.environ.get("PATH", ""))
    missing = [cmd for cmd in CLIENT_COMMANDS if shutil.which(cmd, path=path) is None]
    if missing:
        raise UsageConfigError(
            f"usage_preset = 'slurm' runs {', '.join(missing)}, not found on PATH ({path}); install the Slurm "
            "client (Debian: slurm-client) where the service runs")
    if settings.slurm_conf and not os.path.isfile(settings.slurm_conf):
        raise UsageConfigError(f"c.GPUPool.slurm_conf: {settings.slurm_conf!r} is not a file")
    options = dict(service.slurm_usage_options)
    for key in ("models", "user_of", "comment_prefix", "runner", "env", "clock"):
        if key in options:
            raise UsageConfigError(
                f"c.GPUPoolService.slurm_usage_options may not set {key!r}: the service sets it "
                "(models from c.GPUPool.slurm_gpu_models, users from charge_batch_jobs)")
    owners = HubJobOwners(ledger, charge_batch_jobs=service.charge_batch_jobs)
    try:
        source = SlurmUsageSource(
            settings.slurm_gpu_models, env=env, user_of=owners,
            # without batch jobs only the servers the hub started (their comment names the allocation)
            comment_prefix=None if service.charge_batch_jobs else ALLOCATION_COMMENT,
            **options,
        )
    except (TypeError, ValueError) as e:
        raise UsageConfigError(f"usage_preset = 'slurm': {e} (c.GPUPool.slurm_gpu_models, "
                               "c.GPUPoolService.slurm_usage_options)") from None
    try:
        source.check_accounting(need_comments=True)
    except SlurmCommandError as e:  # slurmctld away: charging waits for it anyway
        log.warning("usage_preset 'slurm': could not check slurm.conf's accounting settings: %s", e)
    except SlurmError as e:
        raise UsageConfigError(f"usage_preset = 'slurm': {e}") from None
    return source
