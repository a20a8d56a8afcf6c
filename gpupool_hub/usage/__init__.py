"""Usage sources: who used how many GPU-seconds on which GPU model, per interval.

The Slurm accounting source lives in :mod:`gpupool_hub.slurm.accounting`; ``SlurmUsageSource``
is still importable from here (on first use: that module builds on this package's ``base``).
"""

from typing import Any

from gpupool_hub.usage.base import Usage, UsageNotSettled, UsageSource, UsageUnavailable
from gpupool_hub.usage.prometheus import PrometheusUsageSource

__all__ = ["PrometheusUsageSource", "SlurmUsageSource", "Usage", "UsageNotSettled", "UsageSource", "UsageUnavailable"]


def __getattr__(name: str) -> Any:
    if name == "SlurmUsageSource":
        from gpupool_hub.slurm.accounting import SlurmUsageSource

        return SlurmUsageSource
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
