"""The toy engine: ``c.GPUPool.toy_gpus`` GPUs on one node, no accounting of its own (it charges
nothing), and a start check that refuses a pool of none. Everything an engine can bring, smallest."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from traitlets import HasTraits, Integer

from gpupool_hub.engines import Engine
from gpupool_hub.inventory.sources import ConfigInventory
from gpupool_hub.usage.base import Usage


class ToySettings(HasTraits):
    toy_gpus = Integer(0, help="GPUs of the toy engine's one node.").tag(config=True)


class NoUsage:
    """A usage source that finds no GPU time: the toy engine runs nothing."""

    name = "toy"

    def usage(self, start: datetime, end: datetime) -> list[Usage]:
        return []


def inventory(settings: Any) -> ConfigInventory:
    return ConfigInventory([{"name": "toy-1", "cpu_milli": 8000, "memory_mib": 16384,
                             "gpus": {"count": settings.toy_gpus, "model": "Toy GPU"}}])


def refuse_no_gpus(service: Any, profiles: list[Any]) -> None:
    if service.settings_.toy_gpus < 1:
        raise SystemExit("gpupool: the toy engine needs c.GPUPool.toy_gpus >= 1")


ENGINE = Engine("toy", spawners=("ToySpawner",), settings=ToySettings, inventory=inventory,
                usage=lambda service, settings, ledger: NoUsage(), config_checks=(refuse_no_gpus,))
