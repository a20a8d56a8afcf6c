"""Slurm: every ``sacct``/``scontrol``/``squeue``/``sbatch``/``scancel`` command is built here.

Modules: ``commands`` (the runner, :func:`run_slurm`, and the errors), ``parse``
(records, hostlists, GRES, jobs, ``squeue`` lines), ``nodes`` (``scontrol show node``),
``confinement`` (does Slurm confine a job to its GPUs), ``inventory``
(:class:`SlurmInventory`, the inventory source's reader), ``accounting`` (the
``sacct`` usage source), ``owners`` (whose bill a job is on), ``spawner`` and
``job`` (``GPUPoolSlurmSpawner`` on batchspawner, entry point ``gpupool-slurm``).

``accounting``, ``owners`` and ``spawner`` are imported on first use of their names:
the first builds on :mod:`gpupool_hub.usage` (which names it), the last needs
JupyterHub and batchspawner.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

from .commands import (FORCED_ENV, Runner, SlurmCommandError, SlurmError, SlurmOutputError,
    UnmappedGresType, controller_unreachable, run_slurm)
from .confinement import device_confinement_problems
from .inventory import SlurmInventory, SlurmInventorySource
from .scontrol_nodes import SlurmNodeState, SlurmGpu, SlurmNode, parse_node_state, parse_nodes
from .parse import (SQUEUE_FORMAT, QueueEntry, SlurmJob, expand_hostlist, parse_gres, parse_index_list, parse_job,
    parse_record, parse_squeue)

#: names imported from their module on first use
_LAZY = {
    "SlurmUsageSource": "accounting",
    "HubJobOwners": "owners",
    "ALLOCATION_COMMENT": "owners",
    "GPUPoolSlurmSpawner": "spawner",
}

__all__ = [
    "FORCED_ENV", "Runner", "SlurmCommandError", "SlurmError", "SlurmOutputError", "UnmappedGresType",
    "controller_unreachable", "run_slurm", "device_confinement_problems", "SlurmInventory", "SlurmInventorySource", "SlurmNodeState", "SlurmGpu",
    "SlurmNode", "parse_node_state", "parse_nodes", "SQUEUE_FORMAT", "QueueEntry", "SlurmJob", "expand_hostlist",
    "parse_gres", "parse_index_list", "parse_job", "parse_record", "parse_squeue", *_LAZY,
]


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
