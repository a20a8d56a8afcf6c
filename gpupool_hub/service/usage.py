"""The debit job's usage source, built from the service's settings.

One place decides where GPU-seconds come from (``c.GPUPoolService.usage_preset``
and ``prometheus_url``) and refuses, at start-up, combinations that could
only fail later or silently charge something else than the admin asked for.
"""

from __future__ import annotations

import logging
import os
import shutil
from typing import Any

from ..config import GPUPool
from ..ledger import Ledger
from ..usage import UsageSource
from ..usage.own_records import AllocationRecordsSource

__all__ = ["UsageConfigError", "make_usage_source"]

log = logging.getLogger("gpupool")

class UsageConfigError(ValueError):
    """A usage setting that cannot work; the message names the settings to change."""


def make_usage_source(service: Any, settings: GPUPool, ledger: Ledger) -> UsageSource:
    """``service`` is the GPUPoolService (its usage_* / prometheus_* / slurm_* traits)."""
    preset = service.usage_preset
    explicit = set(service.config.get("GPUPoolService", {}))
    if service.charge_batch_jobs and preset != "slurm":
        raise UsageConfigError(
            f"c.GPUPoolService.charge_batch_jobs = True needs usage_preset = 'slurm' (it is {preset!r}): "
            "only Slurm accounting sees jobs the hub did not start")
    if service.usage_query and preset != "custom":
        raise UsageConfigError(
            f"c.GPUPoolService.usage_query is only read with usage_preset = 'custom' (it is {preset!r})")
    source = _source(service, settings, ledger, preset, explicit)
    factors = {c: f for c, f in settings.price_table().share_factors.items() if f != 1}
    if factors and not isinstance(source, AllocationRecordsSource):
        listed = ", ".join(f"{c}: {f}" for c, f in sorted(factors.items()))
        raise UsageConfigError(
            f"c.GPUPool.share_price_factors ({listed}) prices fractions by their class, which only the service's "
            f"own allocation records know; usage_preset {preset!r} charges from {source.name}, which cannot tell a "
            "share's class, so it would charge less or more than the spawn page says. Leave usage_preset and "
            "prometheus_url unset to charge from the records, or drop the factors.")
    return source


def _source(service: Any, settings: GPUPool, ledger: Ledger, preset: str, explicit: set[str]) -> UsageSource:
    if preset == "slurm":
        return _slurm(service, settings, ledger)
    if service.slurm_usage_options:
        raise UsageConfigError("c.GPUPoolService.slurm_usage_options is only read with usage_preset = 'slurm'")
    if not service.prometheus_url:
        if "usage_preset" in explicit and preset != "gpupool":
            raise UsageConfigError(
                f"c.GPUPoolService.usage_preset = {preset!r} reads Prometheus: set c.GPUPoolService.prometheus_url "
                "(or leave usage_preset unset to charge from the service's own allocation records)")
        return AllocationRecordsSource(ledger)
    from ..usage.prometheus import PrometheusUsageSource

    return PrometheusUsageSource(
        service.prometheus_url, preset, service.usage_query or None, step_seconds=service.prometheus_step,
        settle_seconds=service.prometheus_settle, bearer_token=service.prometheus_token or None,
        **service.prometheus_options,
    )


def _slurm(service: Any, settings: GPUPool, ledger: Ledger) -> UsageSource:
    from ..engines.slurm.accounting import CLIENT_COMMANDS, SlurmUsageSource
    from ..engines.slurm.commands import SlurmCommandError, SlurmError
    from ..engines.slurm.owners import ALLOCATION_COMMENT, HubJobOwners

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
