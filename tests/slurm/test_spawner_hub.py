"""gpupool-slurm end to end: a real hub and gpupool service submitting to the real test cluster.

Every hub user here has a real Unix account (``unix_account``): a spawn reaches
the Slurm commands only for a name with one (issue 37.1). The commands run
through a recorder (``exec_prefix``) that writes each argv to a file before it
runs the rest, so a test can say which commands a spawn ran.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
import time
from decimal import Decimal
from pathlib import Path

import pytest
import requests

from gpupool_hub.engines.slurm.inventory import SlurmInventory
from tests.fixtures.hub import wait_for
from tests.fixtures.slurm import MODELS, SlurmCluster
from tests.fixtures.unix_accounts import unix_account  # noqa: F401 (fixture)
from tests.spawner.conftest import (
    TINY, allocations, q, server_info, service_pid, set_balance, spawn, spawner_hub, stop_server, user_model,
    wait_spawned,
)

pytestmark = [pytest.mark.integration, pytest.mark.loaded]

PROFILES = [
    {"slug": "cpu", "display_name": "CPU only", "cpu": 1, "memory": "1G", "default": True},
    {"slug": "a6000", "display_name": "RTX A6000", "gpus": 1, "max_gpus": 4, "models": ["RTX A6000"],
     "cpu": 2, "memory": "2G"},
    {"slug": "3090", "display_name": "RTX 3090", "gpus": 1, "max_gpus": 2, "models": ["RTX 3090"]},
    # a server command that does not exist: the job dies in its first second (issue 29.2)
    {"slug": "broken", "display_name": "Broken", "spawner_override": {"cmd": ["/nonexistent/gpupool-server"]}},
]


#: the exec_prefix's first words: writes its argv (fields split by \x1f, one command a line), then runs it
RECORDER = """#!/bin/sh
log="$1"; shift
printf '%s\\037' "$@" >> "$log"
printf '\\n' >> "$log"
exec "$@"
"""


def slurm_calls(workdir: Path) -> list[list[str]]:
    """Every command the hub's Slurm spawner ran (after the recorder), oldest first."""
    log = workdir / "slurm-calls.log"
    if not log.exists():
        return []
    return [line.split("\x1f")[:-1] for line in log.read_text().splitlines()]


def slurm_config(workdir: Path, cluster: SlurmCluster) -> str:
    home = workdir / "home"
    home.mkdir(exist_ok=True)
    recorder = workdir / "record-argv.sh"
    recorder.write_text(RECORDER)
    recorder.chmod(0o755)
    tiny = workdir / "tiny_server.py"  # batchspawner-singleuser runs the command found on PATH
    shutil.copy(TINY, tiny)
    tiny.chmod(0o755)
    singleuser = Path(sys.executable).parent / "batchspawner-singleuser"
    return f"""
c.JupyterHub.spawner_class = "gpupool_hub.engines.slurm.spawner.GPUPoolSlurmSpawner"
c.Spawner.cmd = [{str(tiny)!r}]
c.Spawner.poll_interval = 1
c.Spawner.start_timeout = 60
# these hubs assert the pool's refusals when Slurm's GPUs are taken (the wait queue's own Slurm
# hub, test_spawner_queue.py, turns it back on); with the queue on, such a start would wait an hour
c.GPUPool.queue_enabled = False
c.GPUPool.inventory = "slurm"
c.GPUPool.slurm_gpu_models = {MODELS!r}
c.GPUPool.slurm_conf = {str(cluster.conf)!r}
c.GPUPool.slurm_refresh_interval = 1
# the test cluster runs without cgroups (task/none, proctrack/linuxproc: no cgroup delegation in this
# container), so ConstrainDevices=yes cannot work here: the hub accepts hiding by environment only
c.GPUPool.slurm_allow_env_only_gpu_hiding = True
c.GPUPoolSpawner.profiles = {PROFILES!r}
# the tests run as root: no sudo, but the username still goes through the command line as one
# argument, and the recorder writes down every command (issue 37.1: which names reached one)
c.GPUPoolSlurmSpawner.exec_prefix = "{recorder} {workdir / 'slurm-calls.log'} env GPUPOOL_SUBMITTED_FOR={{username}}"
c.GPUPoolSlurmSpawner.req_srun = ""
c.GPUPoolSlurmSpawner.req_homedir = {str(home)!r}
c.GPUPoolSlurmSpawner.batchspawner_singleuser_cmd = {str(singleuser)!r}
c.GPUPoolSlurmSpawner.startup_poll_interval = 0.3
c.GPUPoolSlurmSpawner.node_addresses = {json.dumps({n.name: "127.0.0.1" for n in cluster.nodes})}
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory, slurm_cluster):
    workdir = tmp_path_factory.mktemp("slurmhub")
    for hub in spawner_hub(tmp_path_factory, "slurmhub", slurm_config(workdir, slurm_cluster)):
        hub.slurm_workdir = workdir
        yield hub


def inventory(cluster: SlurmCluster) -> SlurmInventory:
    return SlurmInventory(MODELS, env=cluster.env)


def pool_gpus(hub) -> dict[str, dict[int, dict]]:
    r = hub.service("GET", "/pool", hub.tester_token)
    r.raise_for_status()
    return {n["node"]: {g["index"]: g for g in n["gpus"]} for n in r.json()["nodes"]}


def held_by(hub, alloc_id: str) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for node, gpus in pool_gpus(hub).items():
        for index, g in gpus.items():
            if any(h["allocation"] == alloc_id for h in g["holders"]):
                out.setdefault(node, []).append(index)
    return out


def test_gpu_spawn_submits_the_pools_choice_and_records_the_bound_gpus(hub, slurm, unix_account):
    sara = unix_account("sara")
    set_balance(hub, sara, "100")
    r = spawn(hub, sara, {"profile": "a6000", "gpus": 2})
    ok, message = wait_spawned(hub, sara, "", r)
    assert ok, f"did not start: {message}\n{hub.log_tail(40)}"
    [alloc] = allocations(hub)
    jobs = slurm.job_ids()
    assert len(jobs) == 1
    job = inventory(slurm).job(jobs[0])
    assert job is not None and job.state == "RUNNING"
    assert job.nodes == (alloc["node"],)
    assert job.name == "gpupool-server"
    assert dict(job.gpus[alloc["node"]]) .keys() == {"a6000"} and len(job.gpu_indices(alloc["node"])) == 2
    detail = slurm.run(["scontrol", "show", "job", "-o", str(jobs[0])]).stdout
    assert "gres/gpu:a6000=2" in detail or "gpu:a6000:2" in detail, detail
    assert re.search(r"NumCPUs=2\b", detail) and "mem=2G" in detail, detail
    # the server (run by the job) sees the GPUs Slurm gave it
    env = server_info(hub, sara)["env"]
    assert env.get("CUDA_VISIBLE_DEVICES"), env
    assert env["GPUPOOL_ALLOCATION"] == alloc["id"]
    # the pool map shows the indices Slurm really bound
    assert held_by(hub, alloc["id"]) == {alloc["node"]: list(job.gpu_indices(alloc["node"]))}
    stop_server(hub, sara)
    wait_for(lambda: not slurm.job_ids(), 30, "the server's job to leave the queue")
    wait_for(lambda: not allocations(hub), 30, "the allocation to be released")


def test_unaffordable_profile_is_refused_before_sbatch(hub, slurm, unix_account):
    poor = unix_account("poor")
    set_balance(hub, poor, "-50")
    ok, message = wait_spawned(hub, poor, "", spawn(hub, poor, {"profile": "a6000"}))
    assert not ok and message
    assert slurm.job_ids() == []
    assert allocations(hub) == []


def outside(hub) -> dict[str, list[int]]:
    r = hub.service("GET", "/pool", hub.tester_token)
    r.raise_for_status()
    return {n["node"]: n["held_outside"] for n in r.json()["nodes"] if n.get("held_outside")}


def test_gpus_held_outside_the_hub_steer_and_refuse_spawns(hub, slurm, unix_account):
    olaf = unix_account("olaf")
    otto = unix_account("otto")
    set_balance(hub, olaf, "100")
    set_balance(hub, otto, "100")
    slurm.submit_foreign_job("gpu-a", "gpu:a6000:4")
    c_job = slurm.submit_foreign_job("gpu-c", "gpu:a6000:1")
    wait_for(lambda: outside(hub) == {"gpu-a": [0, 1, 2, 3], "gpu-c": [0]}, 30, "the pool to see the foreign jobs")
    ok, message = wait_spawned(hub, olaf, "", spawn(hub, olaf, {"profile": "a6000"}))
    assert not ok and "held outside the hub" in message.lower(), message
    assert allocations(hub) == [] and len(slurm.job_ids()) == 2  # no sbatch for the refused spawn
    # the admins' pool map says who holds those GPUs: nobody in the hub
    out = subprocess.run([sys.executable, "-m", "gpupool_hub.cli", "pool"], capture_output=True, text=True,
                         env={**os.environ, "GPUPOOL_URL": hub.service_api, "GPUPOOL_TOKEN": hub.tester_token},
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    held = {(line.split()[0], int(line.split()[1])) for line in out.stdout.splitlines()
            if line.endswith("held outside the hub")}
    assert held == {("gpu-a", i) for i in range(4)} | {("gpu-c", 0)}, out.stdout
    slurm.cancel(c_job)
    wait_for(lambda: outside(hub) == {"gpu-a": [0, 1, 2, 3]}, 30, "the pool to see gpu-c free")
    ok, message = wait_spawned(hub, otto, "", spawn(hub, otto, {"profile": "a6000"}))
    assert ok, message
    [alloc] = allocations(hub)
    assert alloc["node"] == "gpu-c"
    stop_server(hub, otto)
    wait_for(lambda: not allocations(hub), 30, "the allocation to be released")


def test_scancel_from_outside_releases_the_allocation(hub, slurm, unix_account):
    sven = unix_account("sven")
    set_balance(hub, sven, "100")
    ok, message = wait_spawned(hub, sven, "", spawn(hub, sven, {"profile": "3090"}))
    assert ok, message
    [job_id] = slurm.job_ids()
    assert len(allocations(hub)) == 1
    slurm.cancel(job_id)
    wait_for(lambda: not allocations(hub), 30, "the allocation of the cancelled job to be released")


def inventory_refreshes(hub) -> int:
    """How many inventory refreshes the (current) service has finished, from its /metrics."""
    r = requests.get(f"{hub.url}/services/gpupool/metrics", headers={"Authorization": f"token {hub.tester_token}"},
                     timeout=30)
    r.raise_for_status()
    m = re.search(r'^gpupool_job_duration_seconds_count\{job="inventory"\} (\S+)$', r.text, re.MULTILINE)
    return int(float(m.group(1))) if m else 0


def test_a_job_that_dies_at_start_fails_the_spawn_at_once_with_its_output(hub, slurm, unix_account):
    """Issue 29.2: the job dies in its first second; the hub waited start_timeout and never said why."""
    dora = unix_account("dora")
    t0 = time.monotonic()
    ok, message = wait_spawned(hub, dora, "", spawn(hub, dora, {"profile": "broken"}))
    took = time.monotonic() - t0
    assert not ok
    log = "\n".join(ln for ln in hub.log_tail(300).splitlines() if dora in ln or "job 1" in ln.lower())
    assert took <= 15, f"the spawn failed only after {took:.1f} s: {message}\n{log}"
    assert re.search(r"Slurm job \d+ ended \((FAILED|COMPLETED)", message), message
    assert "jupyterhub_slurmspawner_" in message and "Last lines of" in message, message
    assert "Traceback" in message or "Error" in message, message  # batchspawner-singleuser's own error
    assert slurm.job_ids() == []
    wait_for(lambda: not allocations(hub), 30, "nothing to stay allocated")


#: a line of the hub's own logger, as the hub writes it: "[W 2026-11-20 10:00:00.123 JupyterHub slurm:192] …"
HUB_LINE = "[{level} JupyterHub] {text}"
_HUB_RECORD = re.compile(r"^\[([A-Z]) \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} JupyterHub \S+\] (slurmctld [a-z ]+)")


def hub_lines(hub) -> list[str]:
    """The hub logger's records about slurmctld in the log, as HUB_LINE (level, and the words before the colon)."""
    out = []
    for line in hub.log_tail(600).splitlines():
        m = _HUB_RECORD.match(line)
        if m:
            out.append(HUB_LINE.format(level=m.group(1), text=m.group(2).strip()))
    return out


def test_slurmctld_down_gives_503_with_retry_after_and_then_recovers(hub, slurm, unix_account):
    """Issue 29.4: with slurmctld down a spawn was a bare 500, and the log had a traceback per poll."""
    cora = unix_account("cora")
    slurm.stop_slurmctld()
    try:
        hub.create_user(cora)
        r = hub.hub_request("POST", f"/users/{cora}/server", json={"user_options": {"profile": "cpu"}})
        if r.status_code == 202:  # sbatch took longer than the hub's slow_spawn_timeout: the stream says it
            ok, message = wait_spawned(hub, cora, "", r)
            assert not ok
        else:
            assert r.status_code == 503, r.text
            assert int(r.headers["Retry-After"]) > 0
            message = r.json()["message"]
        assert "Slurm does not answer" in message and "sbatch said:" in message, message
        assert "Unable to contact slurm controller" in message or "not responding" in message, message
    finally:
        slurm.start_slurmctld()
    wait_for(lambda: "slurmctld answers again" in hub.log_tail(400), 60, "the service's recovery line")
    assert hub.log_tail(400).count("slurmctld does not answer") <= 2  # hub and service: once each
    ok, message = wait_spawned(hub, cora, "", spawn(hub, cora, {"profile": "cpu"}))
    assert ok, message
    # the hub's own lines, with its level and time: its sbatch failed, and now answered (issue 37.7: the
    # warning came out bare, the recovery not at all)
    assert hub_lines(hub)[-2:] == [HUB_LINE.format(level="W", text="slurmctld does not answer"),
                                   HUB_LINE.format(level="I", text="slurmctld answers again")], hub.log_tail(60)
    stop_server(hub, cora)


#: hub user names that must never reach sudo/runuser: uids, an option, words (issue 37.1, 27.10)
NOT_LOGIN_NAMES = ["#0", "#1001", "-u", "alice bob", "x -u root", "o'neil"]


def balance(hub, user: str) -> Decimal:
    r = hub.service("GET", f"/users/{q(user)}", hub.spawner_token)
    r.raise_for_status()
    return Decimal(r.json()["balance"])


def test_a_name_that_is_no_unix_account_is_refused_before_any_command_runs(hub, slurm, unix_account):
    """Issue 37.1: with ``sudo -E -u {username}`` a hub user ``#0`` ran its job as root. A name that is
    no login name, or has no account, gets 403 naming the rule; no command runs, nothing is held or charged."""
    names = NOT_LOGIN_NAMES + [f"noacct{secrets.token_hex(3)}"]  # a good name, but no account
    for name in names:
        set_balance(hub, name, "100")
        r = spawn(hub, name, {"profile": "a6000"})
        assert r.status_code == 403, f"{name!r}: {r.status_code} {r.text[:300]}\n{hub.log_tail(30)}"
        message = r.json()["message"]
        assert "must be a Unix login name" in message and "not starting with '-' or '#'" in message, message
        assert repr(name) in message, message
        assert balance(hub, name) == Decimal("100")
    assert slurm.job_ids() == [] and allocations(hub) == []
    ran = [argv for argv in slurm_calls(hub.slurm_workdir) if any(n in " ".join(argv) for n in names)]
    assert ran == [], ran

    # a real account goes through, its name one argument of each command
    name = unix_account("acct")
    set_balance(hub, name, "100")
    ok, message = wait_spawned(hub, name, "", spawn(hub, name, {"profile": "a6000"}))
    assert ok, f"{name} did not start: {message}\n{hub.log_tail(30)}"
    assert len(allocations(hub)) == 1 and len(slurm.job_ids()) == 1
    submits = [argv for argv in slurm_calls(hub.slurm_workdir) if "sbatch" in argv]
    assert submits[-1][:3] == ["env", f"GPUPOOL_SUBMITTED_FOR={name}", "sbatch"], submits
    stop_server(hub, name)
    wait_for(lambda: not slurm.job_ids(), 30, f"the job of {name} to leave the queue")
    wait_for(lambda: not allocations(hub), 30, "the allocation to be released")


def test_a_slurmctld_restart_with_a_server_running_logs_no_traceback(hub, slurm, unix_account):
    """Issue 48.9: after each slurmctld restart the service logged an ERROR with a traceback (and again at
    every refresh until slurmctld answered in full): a restarted slurmctld answers for a few seconds
    without GPU indices. That is a warning, once, and the pool keeps Slurm's last word meanwhile."""
    user = unix_account("rest")
    set_balance(hub, user, "100")
    ok, message = wait_spawned(hub, user, "", spawn(hub, user, {"profile": "a6000"}))
    assert ok, message
    before = len(hub.log_path.read_text().splitlines())
    try:
        for _ in range(2):
            slurm.stop_slurmctld()
            wait_for(lambda: "slurmctld does not answer" in "\n".join(
                hub.log_path.read_text().splitlines()[before:]) or None, 30, "the service to see the outage")
            slurm.start_slurmctld()
            seen = inventory_refreshes(hub)
            wait_for(lambda: inventory_refreshes(hub) > seen + 5, 60, "five refreshes after the restart")
    finally:
        stop_server(hub, user)
    lines = hub.log_path.read_text().splitlines()[before:]
    service = [line for line in lines if " gpupool" in line]
    assert not [line for line in service if line.startswith("[E ") or "Traceback" in line], "\n".join(service)
    wait_for(lambda: not allocations(hub), 30, "the allocation to be released")


def test_hub_restart_keeps_the_server_its_job_and_its_gpus(hub, slurm, unix_account):
    """Issue 13.4. Last in this module: it restarts the module's hub."""
    rita = unix_account("rita")
    set_balance(hub, rita, "100")
    ok, message = wait_spawned(hub, rita, "", spawn(hub, rita, {"profile": "a6000", "gpus": 2}))
    assert ok, message
    [alloc] = allocations(hub)
    [job_id] = slurm.job_ids()
    bound = {alloc["node"]: list(inventory(slurm).job(job_id).gpu_indices(alloc["node"]))}
    wait_for(lambda: held_by(hub, alloc["id"]) == bound, 30, "the pool to show the GPUs Slurm bound")
    server_pid = server_info(hub, rita)["pid"]
    old_service = service_pid(hub)

    hub.stop(keep_servers=True)  # the hub and the service it manages (one process group); the Slurm job is Slurm's
    assert slurm.job_state(job_id) == "RUNNING"
    hub.start()
    assert service_pid(hub) != old_service

    server = user_model(hub, rita)["servers"][""]
    assert server["ready"] and not server["pending"], server
    assert server_info(hub, rita)["pid"] == server_pid  # the same process, reached through the new proxy
    assert slurm.job_ids() == [job_id] and slurm.job_state(job_id) == "RUNNING"
    assert [a["id"] for a in allocations(hub)] == [alloc["id"]]
    # after a refresh from Slurm the job's GPUs are still the server's, not "held outside the hub"
    wait_for(lambda: inventory_refreshes(hub) >= 2, 30, "the restarted service to re-read Slurm")
    assert held_by(hub, alloc["id"]) == bound
    assert outside(hub) == {}
    out = subprocess.run([sys.executable, "-m", "gpupool_hub.cli", "pool"], capture_output=True, text=True,
                         env={**os.environ, "GPUPOOL_URL": hub.service_api, "GPUPOOL_TOKEN": hub.tester_token},
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    rows = [line.split() for line in out.stdout.splitlines() if f"{rita}/" in line]  # node, gpu, model, ...
    assert {(r[0], int(r[1])) for r in rows} == {(alloc["node"], i) for i in bound[alloc["node"]]}, out.stdout

    stop_server(hub, rita)
    wait_for(lambda: not slurm.job_ids(), 30, "stopping the server to scancel its job")
    wait_for(lambda: not allocations(hub), 30, "the allocation to be released")
