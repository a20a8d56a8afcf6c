"""Issue 27.2 on Slurm: a job is confined to its GPUs by a device cgroup, or the admin says otherwise.

With Slurm and priced GPUs the service refuses to start unless slurm.conf has
``TaskPlugin=task/cgroup`` and the cgroup.conf next to it ``ConstrainDevices=yes``
(without them a server's code can unset ``CUDA_VISIBLE_DEVICES`` and use GPUs
charged to someone else), or ``c.GPUPool.slurm_allow_env_only_gpu_hiding = True``.
The rules are checked on config files written here; the start-up check runs
against the real test cluster, which has no cgroups.
"""

from __future__ import annotations

import textwrap

import pytest

from gpupool_hub.engines.slurm import SlurmError, SlurmInventory, device_confinement_problems
from tests.fixtures.slurm import MODELS
from tests.slurm.test_usage_config import start

pytestmark = pytest.mark.integration

SHOW = "SLURM_CONF              = {conf}\nTaskPlugin              = {task}\nSlurmctld(primary) at vm is UP\n"


def problems(tmp_path, task: str, cgroup: str | None) -> list[str]:
    conf = tmp_path / "etc" / "slurm.conf"
    conf.parent.mkdir(exist_ok=True)
    cgroup_path = conf.parent / "cgroup.conf"
    if cgroup is not None:
        cgroup_path.write_text(cgroup)
    elif cgroup_path.exists():
        cgroup_path.unlink()
    inventory = SlurmInventory(MODELS, runner=lambda argv: SHOW.format(conf=conf, task=task))
    try:
        inventory.check_device_confinement()
    except SlurmError as e:
        return [str(e)]
    return []


@pytest.mark.parametrize("task, cgroup, message", [
    ("task/cgroup,task/affinity", "CgroupPlugin=autodetect\nConstrainCores=yes\nConstrainDevices=yes\n", None),
    ("task/affinity,task/cgroup", "constraindevices=YES  # case does not matter\n", None),
    ("task/none", "ConstrainDevices=yes\n", "TaskPlugin is 'task/none'"),
    ("task/cgroup", "ConstrainCores=yes\n", "does not set ConstrainDevices=yes"),
    ("task/cgroup", "ConstrainDevices=no\n", "does not set ConstrainDevices=yes"),
    ("task/cgroup", "#ConstrainDevices=yes\n", "does not set ConstrainDevices=yes"),
    ("task/cgroup", None, "cannot read"),
])
def test_devices_are_confined_only_with_task_cgroup_and_constrain_devices(tmp_path, task, cgroup, message):
    found = problems(tmp_path, task, cgroup)
    if message is None:
        assert found == []
    else:
        [text] = found
        assert message in text and "slurm_allow_env_only_gpu_hiding = True" in text


def test_pure_rules_name_every_problem():
    found = device_confinement_problems("TaskPlugin = task/none\n", None, "/etc/slurm/cgroup.conf")
    assert found == ["slurm.conf TaskPlugin is 'task/none': devices are confined by task/cgroup "
                     "(e.g. TaskPlugin=task/cgroup,task/affinity)", "cannot read /etc/slurm/cgroup.conf"]


def test_the_service_refuses_a_cluster_without_device_confinement_unless_told(slurm_cluster, tmp_path):
    config = f"""
        c.GPUPool.inventory = "slurm"
        c.GPUPool.slurm_gpu_models = {MODELS!r}
        c.GPUPool.slurm_conf = {str(slurm_cluster.conf)!r}
        c.GPUPool.default_price = 1
    """
    with pytest.raises(SystemExit) as e:
        start(tmp_path, config)
    message = str(e.value)
    assert "only by CUDA_VISIBLE_DEVICES" in message and "TaskPlugin is 'task/none'" in message
    assert f"cannot read {slurm_cluster.conf.parent / 'cgroup.conf'}" in message
    service = start(tmp_path, textwrap.dedent(config) + "c.GPUPool.slurm_allow_env_only_gpu_hiding = True\n")
    assert len(service.manager.pool.nodes) == len(slurm_cluster.nodes)
