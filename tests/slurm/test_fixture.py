"""The Slurm test cluster itself: it runs jobs on fake GPUs, and leaves nothing behind."""

from __future__ import annotations

import os
import re
import tempfile
import time
from pathlib import Path

import pytest

from tests.fixtures.slurm import NodeSpec, SlurmCluster, _processes_with_env, _skip_reason

pytestmark = pytest.mark.integration


def test_cluster_is_up_with_typed_gpus(slurm: SlurmCluster) -> None:
    out = slurm.run(["sinfo", "--noheader", "--Node", "--format=%N|%T|%G"]).stdout
    rows = {tuple(line.split("|")) for line in out.split()}
    assert ("gpu-a", "idle", "gpu:a6000:4") in rows
    assert ("gpu-b", "idle", "gpu:rtx3090:2") in rows
    assert ("gpu-c", "idle", "gpu:a6000:1,gpu:rtx3090:1") in rows
    assert slurm.run(["scontrol", "ping"]).stdout.count("UP") == 1


def test_foreign_job_as_another_user_holds_its_gpus(slurm: SlurmCluster) -> None:
    job = slurm.submit_foreign_job("gpu-b", "gpu:rtx3090:2", user="daemon")
    detail = slurm.run(["scontrol", "--details", "show", "job", "--oneliner", str(job)]).stdout
    assert "UserId=daemon(" in detail
    assert re.search(r"GRES=gpu:rtx3090:2\(IDX:0-1\)", detail)
    # a second job wanting the same GPUs waits for them
    waiting = slurm.submit(gres="gpu:rtx3090:1", node="gpu-b", wait_running=False)
    slurm.wait_job_state(waiting, {"PENDING"})
    slurm.cancel(job)
    slurm.wait_job_state(waiting, {"RUNNING"})


def test_env_reaches_this_cluster_only(slurm: SlurmCluster) -> None:
    env = slurm.env
    assert env["SLURM_CONF"] == str(slurm.conf)
    assert Path(env["SLURM_CONF"]).is_file()
    out = slurm.run(["scontrol", "show", "config"]).stdout
    assert re.search(rf"ClusterName\s*=\s*{slurm.cluster_name}", out)
    assert str(slurm.munge_socket) in out


def test_a_private_cluster_starts_and_stops_without_leftovers() -> None:
    """Teardown stops every daemon and job process by PID (slurmstepd included) and removes its directory."""
    reason = _skip_reason()
    if reason:
        pytest.skip(reason)
    root = Path(tempfile.mkdtemp(prefix="gpupool-slurm-own-"))
    t0 = time.monotonic()
    cluster = SlurmCluster.start(root, nodes=[NodeSpec("solo", cpus=2, memory_mib=1000, gpus=(("a6000", 1),))],
                                 partitions={"p": ["solo"]}, accounting=False)
    started = time.monotonic() - t0
    pids = [d.proc.pid for d in cluster._daemons]
    try:
        cluster.submit(gres="gpu:a6000:1", node="solo", seconds=600)
        job_processes = _processes_with_env("SLURM_CONF", str(cluster.conf))
        assert job_processes, "the running job's processes should carry the cluster's SLURM_CONF"
    finally:
        t1 = time.monotonic()
        cluster.stop()
        stopped = time.monotonic() - t1
    assert not root.exists()
    assert not _processes_with_env("SLURM_CONF", str(cluster.conf))
    for pid in pids + job_processes:
        assert not _running(pid), f"process {pid} outlived the cluster"
    print(f"private cluster: start {started:.2f}s, stop {stopped:.2f}s")


def _running(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"  # a zombie waiting for init to reap it is not running


def test_missing_binaries_give_a_clear_skip_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    import tests.fixtures.slurm as fixture

    monkeypatch.setattr(fixture.shutil, "which", lambda name, path=None: None if name == "slurmd" else "/x")
    reason = fixture._skip_reason()
    assert reason is not None and "slurmd" in reason and "apt-get install" in reason


def test_startup_was_quick(slurm_cluster: SlurmCluster) -> None:
    # everything, MariaDB and slurmdbd included; ~3-5 s on a loaded 2-core machine
    assert slurm_cluster.startup_seconds < 30
    assert os.path.isdir(slurm_cluster.root)
