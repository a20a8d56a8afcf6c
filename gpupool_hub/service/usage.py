"""The debit job's usage source, built from the service's settings.

One place decides where GPU-seconds come from (``c.GPUPoolService.usage_preset``
and ``prometheus_url``) and refuses, at start-up, combinations that could
only fail later or silently charge something else than the admin asked for.
"""

from __future__ import annotations

import logging
from typing import Any

from ..config import GPUPool
from ..engines import REGISTRY, engine, engines
from ..ledger import Ledger
from ..usage import UsageSource
from ..usage.base import UsageConfigError
from ..usage.own_records import AllocationRecordsSource

__all__ = ["UsageConfigError", "make_usage_source"]

log = logging.getLogger("gpupool")

def make_usage_source(service: Any, settings: GPUPool, ledger: Ledger) -> UsageSource:
    """``service`` is the GPUPoolService (its usage_* / prometheus_* / slurm_* traits)."""
    preset = service.usage_preset
    explicit = set(service.config.get("GPUPoolService", {}))
    for each in engines():  # an engine's accounting options given to another preset: said, not ignored
        if each.usage_options_check is not None:
            each.usage_options_check(service, preset)
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
    if preset in REGISTRY and (engine_usage := engine(preset).usage) is not None:
        return engine_usage(service, settings, ledger)  # an engine's own accounting ('slurm': sacct)
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
