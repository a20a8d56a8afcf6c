"""Usage sources: who used how many GPU-seconds on which GPU model, per interval. An engine may
bring its own (Slurm's accounting: ``gpupool_hub.engines.slurm.accounting``)."""

from gpupool_hub.usage.base import Usage, UsageNotSettled, UsageSource, UsageUnavailable
from gpupool_hub.usage.prometheus import PrometheusUsageSource

__all__ = ["PrometheusUsageSource", "Usage", "UsageNotSettled", "UsageSource", "UsageUnavailable"]
