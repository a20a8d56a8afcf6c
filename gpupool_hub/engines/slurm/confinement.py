"""Whether Slurm confines a job to the GPUs it was given (a device cgroup), read from
``scontrol show config`` and ``cgroup.conf``; :meth:`SlurmInventory.check_device_confinement`
runs the commands."""

from __future__ import annotations

__all__ = ["device_confinement_problems", "key_values"]


def key_values(text: str, sep: str) -> dict[str, str]:
    """``Key<sep>Value`` lines (``scontrol show config``: ``=``; cgroup.conf: ``=``, ``#`` comments),
    keys lower-cased (Slurm reads its config keys case-insensitively)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, eq, value = line.split("#", 1)[0].partition(sep)
        if eq and key.strip():
            out[key.strip().lower()] = value.strip()
    return out


def device_confinement_problems(show_config: str, cgroup_conf: str | None, cgroup_path: str) -> list[str]:
    """What keeps Slurm from confining a job to the GPUs it was given (a device cgroup).

    Without it a job's GPUs are hidden only by ``CUDA_VISIBLE_DEVICES``, which the
    job's own code may change: a server could use GPUs the pool charged to someone
    else. Slurm confines devices with ``ConstrainDevices=yes`` in ``cgroup.conf``
    (next to slurm.conf), enforced by the ``task/cgroup`` plugin."""
    conf = key_values(show_config, "=")
    problems = []
    task = conf.get("taskplugin", "")
    if "task/cgroup" not in task:
        problems.append(f"slurm.conf TaskPlugin is {task or 'not set'!r}: devices are confined by task/cgroup "
                        "(e.g. TaskPlugin=task/cgroup,task/affinity)")
    if cgroup_conf is None:
        problems.append(f"cannot read {cgroup_path}")
    elif key_values(cgroup_conf, "=").get("constraindevices", "").lower() != "yes":
        problems.append(f"{cgroup_path} does not set ConstrainDevices=yes")
    return problems
