"""Engines: what runs a server (a local process, a systemd unit, a Kubernetes pod, a Slurm job).

Each engine is one folder here with an ``engine.py`` whose ``ENGINE`` (:class:`Engine`) says what it
brings: its spawner classes, the settings it adds to ``c.GPUPool`` and ``c.GPUPoolService``, the
inventory source and usage preset of its name, the checks the service makes at start when it is
in use, and how the service asks it which servers' work still runs. The core, ``config.py`` and
the service name no engine: they ask :func:`engines` and :func:`in_use`. A new engine is one
folder and one line of :data:`REGISTRY`; an engine in another package is one entry point of the group
``gpupool_hub.engines`` (``name = "module.with.ENGINE"``), as JupyterHub finds spawners and
authenticators. docs/architecture.md, "Adding an engine".
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
import os
import sys
from importlib import import_module
from typing import Any

__all__ = ["ENTRY_POINT_GROUP", "REGISTRY", "Engine", "engine", "engines", "in_use"]

#: every engine by name, and the module whose ``ENGINE`` describes it (imported on first use)
REGISTRY: dict[str, str] = {
    "local": "gpupool_hub.engines.local.engine",
    "systemd": "gpupool_hub.engines.systemd.engine",
    "kubernetes": "gpupool_hub.engines.kubernetes.engine",
    "slurm": "gpupool_hub.engines.slurm.engine",
}

#: (service, profiles) -> None; a problem stops the start: ``SystemExit("gpupool: …")`` naming it
StartCheck = Callable[[Any, list[Any]], None]


@dataclass(frozen=True)
class Engine:
    """What one engine brings (every part optional but its name)."""

    name: str
    #: the spawner classes' names as ``c.JupyterHub.spawner_class`` gives them: entry point names,
    #: dotted paths, class names
    spawners: tuple[str, ...] = ()
    #: a ``HasTraits`` class whose traits join ``c.GPUPool`` (the hub and the service read them)
    settings: type | None = None
    #: a ``HasTraits`` class whose traits join ``c.GPUPoolService``
    service_settings: type | None = None
    #: ``settings -> InventorySource``, for ``c.GPUPool.inventory = <name>``
    inventory: Callable[[Any], Any] | None = None
    #: ``(service, settings, ledger) -> UsageSource``, for ``c.GPUPoolService.usage_preset = <name>``
    usage: Callable[[Any, Any, Any], Any] | None = None
    #: checks of the configuration alone, made when the engine is in use before the ledger opens and the
    #: usage source is built (``service.settings_``, ``service.usage_preset``, the profiles)
    config_checks: tuple[StartCheck, ...] = ()
    #: checks made once the ledger and the usage source are ready, before the service restores its state
    #: (what the engine's own cluster says: its devices, its shards)
    start_checks: tuple[StartCheck, ...] = ()
    #: ``(service, usage_preset) -> None``: the options of its usage preset given to another preset (an
    #: error naming them); asked whatever the engines in use
    usage_options_check: Callable[[Any, str], None] | None = None
    #: ``service -> (async () -> ids of the allocations whose work still runs) | None``: reconcile
    #: releases a stopped server's allocation only once its work is gone
    work_alive: Callable[[Any], Callable[[], Awaitable[set[str]]] | None] | None = None

    def spawns(self, spawner_class: Any) -> bool:
        """Whether ``c.JupyterHub.spawner_class`` names one of this engine's spawners."""
        if not isinstance(spawner_class, str):
            spawner_class = f"{getattr(spawner_class, '__module__', '')}.{getattr(spawner_class, '__name__', '')}"
        return any(spawner_class == s or spawner_class.endswith("." + s) for s in self.spawners)


#: the entry point group through which another package adds an engine (its value: the module of ``ENGINE``)
ENTRY_POINT_GROUP = "gpupool_hub.engines"

_loaded: dict[str, Engine] = {}
_plugins_read = False


def _declared() -> bool:
    """Whether an installed distribution on ``sys.path`` declares an engine in its ``entry_points.txt``.

    Why look before asking ``importlib.metadata``: its scan parses every installed distribution's
    metadata and imports about a hundred modules (9,500 objects here), at each start of the hub and the
    service, for a plug-in most installations never have. Reading the files for the group's name costs a
    few milliseconds and imports nothing."""
    marker = f"[{ENTRY_POINT_GROUP}]"
    for folder in sys.path:
        try:
            names = os.listdir(folder or ".")
        except OSError:
            continue
        for name in names:
            if not name.endswith((".dist-info", ".egg-info")):
                continue
            try:
                with open(os.path.join(folder or ".", name, "entry_points.txt"), encoding="utf-8") as f:
                    if marker in f.read():
                        return True
            except OSError:
                continue
    return False


def _read_plugins() -> None:
    """Add the installed packages' engines to :data:`REGISTRY` once (a built-in name is not replaced)."""
    global _plugins_read
    if _plugins_read:
        return
    _plugins_read = True
    if not _declared():
        return
    from importlib.metadata import entry_points

    for point in entry_points(group=ENTRY_POINT_GROUP):
        REGISTRY.setdefault(point.name, point.value)


def engine(name: str) -> Engine:
    """The engine of that name (KeyError for none), its module imported on first use."""
    _read_plugins()
    if name not in _loaded:
        found = import_module(REGISTRY[name]).ENGINE
        if found.name != name:
            raise ValueError(f"{REGISTRY[name]}.ENGINE is named {found.name!r}, registered as {name!r}")
        _loaded[name] = found
    return _loaded[name]


def engines() -> list[Engine]:
    """Every registered engine, in the registry's order (the built-in ones first)."""
    _read_plugins()
    return [engine(name) for name in REGISTRY]


def in_use(config: Any, inventory: str, usage_preset: str = "") -> list[Engine]:
    """The engines a configuration uses: the hub's spawner class is one of theirs, or the pool's
    inventory or the service's usage preset is named after them."""
    spawner_class = config.get("JupyterHub", {}).get("spawner_class", "") if config else ""
    return [e for e in engines() if e.spawns(spawner_class) or inventory == e.name or usage_preset == e.name
            or any(s.rsplit(".", 1)[-1] in config for s in e.spawners if s[:1].isupper() or "." in s)]
