"""gpupool node agent: NVML discovery, per-user GPU attribution, metrics and enforcement.

Run one per GPU node: ``python -m gpupool_hub.agent`` (see docs/agent.md).
The submodules import neither pynvml nor a GPU at import time, so the package
can be imported (and tested) on machines without one.
"""

from __future__ import annotations

__all__ = ["GPUPoolAgent", "main"]


def __getattr__(name: str):  # lazy: importing the package must not pull in tornado/prometheus
    if name in __all__:
        from . import app

        return getattr(app, name)
    raise AttributeError(name)
