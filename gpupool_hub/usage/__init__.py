"""Usage sources: who used how many GPU-seconds on which GPU model, per interval."""

from gpupool_hub.usage.base import Usage, UsageNotSettled, UsageSource, UsageUnavailable
from gpupool_hub.usage.prometheus import PrometheusUsageSource
from gpupool_hub.usage.slurm import SlurmUsageSource

__all__ = ["PrometheusUsageSource", "SlurmUsageSource", "Usage", "UsageNotSettled", "UsageSource", "UsageUnavailable"]
