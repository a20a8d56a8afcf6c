"""Issue 40.1: Slurm with ``ConstrainDevices=yes``, for real.

``confined_slurm_cluster`` (tests/fixtures/slurm.py) is a second real cluster
with ``ProctrackType=proctrack/cgroup``, ``TaskPlugin=task/cgroup`` and a
``cgroup.conf`` with ``CgroupPlugin=cgroup/v1`` and ``ConstrainDevices=yes``;
its GPUs are character devices of NVIDIA's major 195 made with mknod in the
cluster's folder. There is no driver behind them, so opening a GPU the job
was given fails with ENXIO ("no such device": the device cgroup let the open
through) and opening one of the node's other GPUs with EPERM (the device cgroup
refused it). ``CUDA_VISIBLE_DEVICES`` plays no part in that: each probe runs
again without it.

The cluster needs the kernel's cgroup v1 ``devices`` controller, writable by
root; without it the fixture skips with the reason (an error under
``GPUPOOL_REQUIRE_INTEGRATION=1``).
"""

from __future__ import annotations

import json
import os
import sys
from decimal import Decimal
from pathlib import Path

import pytest

from gpupool_hub.engines.slurm import SlurmInventory
from tests.fixtures.hub import wait_for
from tests.fixtures.slurm import CONFINED_NODES, MODELS, NodeSpec, SlurmCluster, poll
from tests.fixtures.unix_accounts import unix_account  # noqa: F401 (fixture)
from tests.slurm.test_spawner_hub import balance, slurm_calls, slurm_config
from tests.slurm.test_usage_config import start
from tests.spawner.conftest import allocations, server_info, set_balance, spawn, spawner_hub, stop_server
from tests.spawner.conftest import wait_spawned

pytestmark = [pytest.mark.integration, pytest.mark.loaded]

#: opens every device node it is given (read-write, as CUDA does), prints ``{path: errno name}`` as JSON,
#: then once more without CUDA_VISIBLE_DEVICES; with more arguments after ``--`` it then execs them
#: (the server's own process probes before it becomes the server)
PROBE = """\
import errno, json, os, sys

def probe(paths):
    found = {}
    for path in paths:
        try:
            os.close(os.open(path, os.O_RDWR))
            found[path] = "OK"
        except OSError as e:
            found[path] = errno.errorcode[e.errno]
    return found

args = sys.argv[1:]
paths, rest = (args[:args.index("--")], args[args.index("--") + 1:]) if "--" in args else (args, [])
out = {"cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"), "with_env": probe(paths)}
os.environ.pop("CUDA_VISIBLE_DEVICES", None)
out["without_env"] = probe(paths)
out["cgroup"] = open("/proc/self/cgroup").read()
out["pid"] = os.getpid()
report = os.environ.get("PROBE_REPORT")
if report:
    with open(report, "w") as f:
        json.dump(out, f)
else:
    print(json.dumps(out))
if rest:
    sys.stdout.flush()
    os.execv(rest[0], rest)
"""


def node_devices(cluster: SlurmCluster, node: str) -> list[str]:
    """The node's GPU device files in Slurm index order, as its gres.conf lists them."""
    lines = (cluster.root / "etc" / "gres.conf").read_text().splitlines()
    return [line.split("File=")[1] for line in lines if line.startswith(f"NodeName={node} ")]


def expected(devices: list[str], given: list[int]) -> dict[str, str]:
    return {path: "ENXIO" if i in given else "EPERM" for i, path in enumerate(devices)}


def report(path: Path) -> dict | None:
    """The probe's JSON line, once the job has written it."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def bound_gpus(cluster: SlurmCluster, job_id: int, node: str) -> list[int]:
    """The one GPU index Slurm bound to the job on ``node``."""
    job = SlurmInventory(MODELS, env=cluster.env).job(job_id)
    assert job is not None
    given = list(job.gpu_indices(node))
    assert len(given) == 1, given
    return given


def held_outside(hub) -> dict[str, list[int]]:
    r = hub.service("GET", "/pool", hub.tester_token)
    r.raise_for_status()
    return {n["node"]: n["held_outside"] for n in r.json()["nodes"] if n.get("held_outside")}


def write_probe(directory: Path) -> Path:
    probe = directory / "probe_devices.py"
    probe.write_text(PROBE)
    probe.chmod(0o755)
    return probe


def test_a_batch_job_opens_only_its_own_device_even_without_cuda_visible_devices(confined_slurm_cluster):
    cluster = confined_slurm_cluster
    node = CONFINED_NODES[0]
    assert sum(c for _, c in node.gpus) == 4
    devices = node_devices(cluster, node.name)
    assert all(os.major(os.stat(d).st_rdev) == 195 for d in devices)
    probe = write_probe(cluster.root)
    cluster.reset()
    # another job holds the node's first GPU, so the probing job's is not simply the first device file
    cluster.submit(gres="gpu:a6000:1", node=node.name, name="holder")
    output = cluster.root / "probe-job.out"
    job_id = int(cluster.run([
        "sbatch", "--parsable", "--gres=gpu:a6000:1", f"--nodelist={node.name}", f"--output={output}",
        "--chdir=/tmp", "--cpus-per-task=1", "--mem=100M",
        "--wrap", f"exec {sys.executable} {probe} {' '.join(devices)} -- /bin/sleep 300",
    ]).stdout.strip().split(";")[0])
    try:
        cluster.wait_job_state(job_id, {"RUNNING"})
        found = poll(lambda: report(output), 30, "the probe's report")
        given = bound_gpus(cluster, job_id, node.name)  # asked while the job runs: Slurm names the index
    finally:
        cluster.reset()
    assert given != [0]
    assert found["with_env"] == expected(devices, given), found
    assert found["without_env"] == expected(devices, given), found
    assert f"devices:/slurm_{node.name}/" in found["cgroup"], found["cgroup"]


def test_device_confinement_start_check_accepts_the_confined_cluster_and_refuses_the_plain_one(
        confined_slurm_cluster, slurm_cluster, tmp_path):
    SlurmInventory(MODELS, env=confined_slurm_cluster.env).check_device_confinement()  # raises if not
    config = f"""
        c.GPUPool.inventory = "slurm"
        c.GPUPool.slurm_gpu_models = {MODELS!r}
        c.GPUPool.slurm_conf = {str(confined_slurm_cluster.conf)!r}
        c.GPUPool.default_price = 1
    """
    service = start(tmp_path, config)  # no slurm_allow_env_only_gpu_hiding
    assert {n.name for n in service.manager.pool.nodes} == {n.name for n in CONFINED_NODES}
    plain = config.replace(str(confined_slurm_cluster.conf), str(slurm_cluster.conf))
    (tmp_path / "plain").mkdir()
    with pytest.raises(SystemExit) as e:
        start(tmp_path / "plain", plain)
    assert "TaskPlugin is 'task/none'" in str(e.value)


@pytest.fixture(scope="module")
def confined_hub(tmp_path_factory, confined_slurm_cluster):
    """A real hub and service on the confined cluster, without slurm_allow_env_only_gpu_hiding (the
    service's start-up check must accept the cluster, or the hub does not start); each server's
    command first probes the node's device files, in its own process, then becomes the tiny server."""
    cluster = confined_slurm_cluster
    workdir = tmp_path_factory.mktemp("confinedhub")
    reports = workdir / "probes"
    reports.mkdir()
    reports.chmod(0o1777)  # the servers run as their users
    probe = write_probe(workdir)
    devices = node_devices(cluster, CONFINED_NODES[0].name)
    # batchspawner-singleuser runs the command as Python, in its own process (runpy): so this runs the
    # probe in the server's process, then the tiny server (slurm_config copies it into workdir)
    wrapper = workdir / "probing_server.py"
    wrapper.write_text(f"""\
import os, runpy, sys
cuda = os.environ.get("CUDA_VISIBLE_DEVICES")
os.environ["PROBE_REPORT"] = os.path.join({str(reports)!r}, os.environ["JUPYTERHUB_USER"] + ".json")
argv, sys.argv = sys.argv, [{str(probe)!r}, *{devices!r}]
runpy.run_path({str(probe)!r})
sys.argv = argv
if cuda is not None:
    os.environ["CUDA_VISIBLE_DEVICES"] = cuda
runpy.run_path({str(workdir / "tiny_server.py")!r}, run_name="__main__")
""")
    wrapper.chmod(0o755)
    config = slurm_config(workdir, cluster) + (
        "c.GPUPool.slurm_allow_env_only_gpu_hiding = False\n"
        f"c.Spawner.cmd = [{str(wrapper)!r}]\n"
    )
    for hub in spawner_hub(tmp_path_factory, "confinedhub", config):
        hub.probe_reports = reports
        hub.slurm_workdir = workdir
        yield hub


@pytest.mark.parametrize("name", ["root", "daemon", "nobody"])
def test_a_system_account_gets_no_job_no_gpu_and_no_charge(confined_hub, confined_slurm_cluster, name):
    """Issue 48.1: ``root``, ``daemon`` and ``nobody`` are login names with accounts on every machine, and
    with ``sudo -E -u {username}`` a job of ``root`` ran as uid 0 with a GPU. Each gets 403 naming why,
    before the pool is asked or any Slurm command runs: no job, no allocation, no charge."""
    cluster, hub = confined_slurm_cluster, confined_hub
    cluster.reset()
    set_balance(hub, name, "100")
    r = spawn(hub, name, {"profile": "a6000"})
    assert r.status_code == 403, f"{name}: {r.status_code} {r.text[:300]}\n{hub.log_tail(30)}"
    message = r.json()["message"]
    assert f"{name!r} is " in message and "never as root, a system account" in message, message
    assert ("superuser" in message) if name == "root" else ("outside the ordinary accounts' uids" in message)
    assert balance(hub, name) == Decimal("100")
    assert cluster.job_ids() == [] and allocations(hub) == []
    ran = [argv for argv in slurm_calls(hub.slurm_workdir) if f"GPUPOOL_SUBMITTED_FOR={name}" in argv]
    assert ran == [], ran


def test_a_gpupool_slurm_server_opens_only_its_own_device(confined_hub, confined_slurm_cluster, unix_account):
    cluster, hub = confined_slurm_cluster, confined_hub
    cluster.reset()
    node = CONFINED_NODES[0].name
    devices = node_devices(cluster, node)
    user = unix_account("devtest")
    set_balance(hub, user, "100")
    # the a6000 profile may land on either node: fill cgpu-b's A6000 so the server gets one of cgpu-a's four
    cluster.submit_foreign_job("cgpu-b", "gpu:a6000:1")
    wait_for(lambda: held_outside(hub) == {"cgpu-b": [0]}, 30, "the pool to see the foreign job")
    try:
        ok, message = wait_spawned(hub, user, "", spawn(hub, user, {"profile": "a6000"}))
        assert ok, f"did not start: {message}\n{hub.log_tail(40)}"
        [alloc] = allocations(hub)
        assert alloc["node"] == node
        info = server_info(hub, user)
        inventory = SlurmInventory(MODELS, env=cluster.env)
        [job_id] = [j for j in cluster.job_ids() if inventory.job(j).name == "gpupool-server"]
        given = bound_gpus(cluster, job_id, node)
        found = json.loads((hub.probe_reports / f"{user}.json").read_text())
        assert found["with_env"] == expected(devices, given), found
        assert found["without_env"] == expected(devices, given), found
        # the process that probed is the server, and it sits in the job's device cgroup
        assert found["pid"] == info["pid"]
        with open(f"/proc/{info['pid']}/cgroup") as f:
            assert f"devices:/slurm_{node}/" in f.read()
        assert f"devices:/slurm_{node}/" in found["cgroup"]
        stop_server(hub, user)
        wait_for(lambda: not allocations(hub), 30, "the allocation to be released")
    finally:
        cluster.reset()


def test_device_cgroups_are_removed_at_teardown(tmp_path):
    """The fixture's teardown on a cluster of its own: no ``slurm_<node>`` cgroup is left for its nodes."""
    from tests.fixtures.slurm import running_cluster

    nodes = (NodeSpec("cgpu-t", cpus=2, memory_mib=4000, gpus=(("a6000", 2),)),)
    gen = running_cluster(nodes, {"gpu": ["cgpu-t"]}, constrain_devices=True, accounting=False)
    cluster = next(gen)
    cluster.submit(gres="gpu:a6000:1", node="cgpu-t")  # a running job: its cgroups exist now
    assert any(p.name.startswith("job_") for p in cluster.cgroups()), cluster.cgroups()
    root = cluster.root
    with pytest.raises(StopIteration):
        next(gen)
    assert cluster.cgroups() == []
    assert not list(Path("/sys/fs/cgroup").glob("*/slurm_cgpu-t"))
    assert not root.exists()


def test_docs_show_the_device_confinement_lines_the_confined_cluster_runs():
    """docs/slurm.md gives admins the slurm.conf and cgroup.conf lines this module's cluster runs with."""
    from tests.fixtures.slurm import CGROUP_CONF, CONFINED_TASK_LINES

    text = (Path(__file__).parents[2] / "docs" / "slurm.md").read_text()
    blocks = ["\n".join(line.split("#")[0].strip() for line in b.split("```")[0].splitlines())
              for b in text.split("```ini\n")[1:]]
    assert any(all(line in b.splitlines() for line in CONFINED_TASK_LINES) for b in blocks)
    assert any(all(line in b.splitlines() for line in CGROUP_CONF.splitlines()) for b in blocks)
