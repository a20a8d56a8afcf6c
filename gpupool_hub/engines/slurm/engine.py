"""The Slurm engine: each server a Slurm job on the node and GPUs the pool chose, the pool read from
Slurm, GPU time charged from Slurm accounting (docs/slurm.md)."""

from __future__ import annotations

from typing import Any

from .. import Engine
from .settings import SlurmServiceSettings, SlurmSettings


def _inventory(settings: Any) -> Any:
    from .inventory import SlurmInventorySource

    return SlurmInventorySource(settings.slurm_gpu_models, partitions=settings.slurm_partitions,
                                env=settings.slurm_env(), refresh_interval=settings.slurm_refresh_interval)


def _usage(service: Any, settings: Any, ledger: Any) -> Any:
    from .checks import usage_source

    return usage_source(service, settings, ledger)


def _check(name: str) -> Any:
    def check(service: Any, profiles: list[Any]) -> None:
        from . import checks

        getattr(checks, name)(service, profiles)

    check.__name__ = name
    return check


def _usage_options(service: Any, preset: str) -> None:
    from .checks import usage_options_check

    usage_options_check(service, preset)


def _work_alive(service: Any) -> Any:
    from .checks import hub_jobs_alive

    return hub_jobs_alive(service)


ENGINE = Engine(
    "slurm",
    spawners=("gpupool-slurm", "gpupool_hub.engines.slurm.spawner.GPUPoolSlurmSpawner", "GPUPoolSlurmSpawner"),
    settings=SlurmSettings,
    service_settings=SlurmServiceSettings,
    inventory=_inventory,
    usage=_usage,
    usage_options_check=_usage_options,
    config_checks=(_check("check_slurm_share_charging"),),
    start_checks=(_check("check_slurm_gpu_boundary"), _check("check_slurm_shares")),
    work_alive=_work_alive,
)
