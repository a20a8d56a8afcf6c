"""The documented Slurm path, followed verbatim (issue 29.1): the example config's Slurm block and
docs/slurm.md's sudoers rule, against the session's real cluster, with real Unix users and the
default ``exec_prefix`` (``sudo -E -u {username}``).

What the test may change is what the block marks ``CHANGE`` (site values: paths, the hub's address,
the GRES map, node addresses), and nothing else of the block: :func:`slurm_block` reads the block
out of ``jupyterhub_config.example.py`` and the test checks that it overrides exactly those names.
Around the block the test hub keeps its own settings (ports, tokens, profiles), and, because the test
cluster runs without cgroups, accepts GPU hiding by environment only.

The servers' Python is what "From zero" asks for: a venv made from the system Python in a folder
every user may enter. Instead of ``pip install`` (no network in CI, and minutes) it reads the
hub's site-packages through a ``.pth`` file; its ``jupyterhub-singleuser`` is the tiny test server.
When the docs change, this test changes with them.
"""

from __future__ import annotations

import grp
import json
import os
import pwd
import re
import secrets
import shutil
import stat
import subprocess
import sysconfig
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.hub import wait_for
from tests.fixtures.slurm import MODELS, SlurmCluster
from tests.fixtures.unix_accounts import remove_account
from tests.slurm.test_spawner_hub import PROFILES
from tests.spawner.conftest import TINY, allocations, server_info, set_balance, spawn, spawner_hub, stop_server

pytestmark = [pytest.mark.integration, pytest.mark.loaded]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "jupyterhub_config.example.py"
SLURM_DOC = REPO / "docs" / "slurm.md"
HUB_GROUP = "jupyterhub-users"


def slurm_block() -> tuple[list[str], set[str]]:
    """The example's commented Slurm block as code lines, and the names its CHANGE lines set."""
    text = EXAMPLE.read_text()
    start = text.index("# ------------------------------------------------------------------ Slurm")
    lines, changes = [], set()
    for raw in text[start:].splitlines()[1:]:
        if not raw.startswith("# "):
            break
        body = raw[2:]
        if not re.match(r"(c\.[A-Za-z_.]+|[A-Z_]+) = ", body):
            continue  # prose
        lines.append(body)
        if re.search(r"#\s*CHANGE\b", body):
            changes.add(body.split(" = ", 1)[0])
    return lines, changes


def sudoers_rule() -> str:
    """The rule docs/slurm.md shows, exactly (the fenced block after "**sudo.**")."""
    text = SLURM_DOC.read_text()
    after = text[text.index("**sudo.**"):]
    m = re.search(r"```\n(.*?)\n\s*```", after, re.S)
    assert m, "docs/slurm.md shows no sudoers rule after **sudo.**"
    return m.group(1).strip()


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Iterator[dict[str, str]]:
    """The servers' Python, the hub group, the sudoers rule: set up as the docs say, removed after."""
    if os.geteuid() != 0 or not shutil.which("sudo") or not shutil.which("useradd"):
        pytest.skip("needs root, sudo and useradd (scripts/system-deps.sh installs them)")
    python = "/usr/bin/python3"
    if not os.access(python, os.X_OK) or not os.stat(os.path.realpath(python)).st_mode & stat.S_IXOTH:
        pytest.skip("needs a system python3 every user may run")
    shared = Path(tempfile.mkdtemp(prefix="gpupool-servers-", dir="/tmp"))
    shared.chmod(0o755)
    made_group = made_user = False
    rule_file = Path(f"/etc/sudoers.d/gpupool-test-{secrets.token_hex(3)}")
    try:
        venv = shared / "venv"
        subprocess.run([python, "-m", "venv", "--without-pip", str(venv)], check=True, capture_output=True)
        site_dir = subprocess.run([str(venv / "bin" / "python"), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                  check=True, capture_output=True, text=True).stdout.strip()
        Path(site_dir, "hub-packages.pth").write_text(sysconfig.get_path("purelib") + "\n")
        bsu = venv / "bin" / "batchspawner-singleuser"
        bsu.write_text(f"#!{venv}/bin/python\nimport sys\nfrom batchspawner.singleuser import main\nsys.exit(main())\n")
        server = venv / "bin" / "jupyterhub-singleuser"  # the test's stand-in: cheap, and what the tests read back
        shutil.copy(TINY, server)
        for f in (bsu, server):
            f.chmod(0o755)
        try:
            grp.getgrnam(HUB_GROUP)
        except KeyError:
            subprocess.run(["groupadd", HUB_GROUP], check=True, capture_output=True)
            made_group = True
        try:
            pwd.getpwnam("jupyterhub")
        except KeyError:
            subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", "jupyterhub"],
                           check=True, capture_output=True)
            made_user = True
        rule_file.write_text(sudoers_rule() + "\n")
        rule_file.chmod(0o440)
        check = subprocess.run(["visudo", "-c", "-f", str(rule_file)], capture_output=True, text=True)
        assert check.returncode == 0, f"visudo refuses the documented rule: {check.stdout}{check.stderr}"
        yield {"bin": str(venv / "bin")}
    finally:
        rule_file.unlink(missing_ok=True)
        if made_user:
            subprocess.run(["userdel", "jupyterhub"], check=False, capture_output=True)
        if made_group:
            subprocess.run(["groupdel", HUB_GROUP], check=False, capture_output=True)
        shutil.rmtree(shared, ignore_errors=True)


@pytest.fixture(scope="module")
def users(site) -> Iterator[list[str]]:
    """Two real Unix users in the group the sudoers rule names, with homes from useradd."""
    names = [f"slu{secrets.token_hex(3)}" for _ in range(2)]
    try:
        for name in names:
            subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", "-G", HUB_GROUP, name], check=True,
                           capture_output=True)
        yield names
    finally:
        for name in names:
            remove_account(name, home=True)


def documented_config(site: dict[str, str], cluster: SlurmCluster) -> str:
    lines, changes = slurm_block()
    site_values = {
        "SERVERS_PYTHON": repr(site["bin"]),
        "c.JupyterHub.hub_connect_ip": repr("127.0.0.1"),
        "c.GPUPool.slurm_conf": repr(str(cluster.conf)),
        "c.GPUPool.slurm_gpu_models": repr(MODELS),
        "c.GPUPoolSlurmSpawner.node_addresses": json.dumps({n.name: "127.0.0.1" for n in cluster.nodes}),
    }
    assert set(site_values) == changes, f"the block's CHANGE lines are {sorted(changes)}"
    out = []
    for line in lines:
        name = line.split(" = ", 1)[0]
        out.append(f"{name} = {site_values[name]}" if name in site_values else line)
    return "\n".join([
        *out,
        f"c.GPUPoolSpawner.profiles = {PROFILES!r}",
        # the test cluster runs without cgroups (no ConstrainDevices): accept hiding by environment
        "c.GPUPool.slurm_allow_env_only_gpu_hiding = True",
    ]) + "\n"


@pytest.fixture(scope="module")
def hub(tmp_path_factory, slurm_cluster, site, users):
    yield from spawner_hub(tmp_path_factory, "slurmdocs", documented_config(site, slurm_cluster))


def test_the_documented_sudoers_rule_lets_the_hub_account_run_slurm_as_a_user(site, users, slurm):
    """The hub runs as root in these tests (root needs no rule); the rule is checked for the
    account the docs name: it may run Slurm's commands as a member of the group, keeping the
    environment (-E, so SLURM_CONF reaches squeue), and nothing else."""
    def as_hub(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["runuser", "-u", "jupyterhub", "--", "sudo", "-n", *argv], capture_output=True,
                              text=True, timeout=30, env=slurm.env)

    r = as_hub("-E", "-u", users[0], "/usr/bin/squeue", "--noheader", "--user", users[0])
    assert r.returncode == 0, r.stdout + r.stderr
    for argv in (["-u", users[0], "/usr/bin/id"], ["-u", "root", "/usr/bin/squeue"]):
        r = as_hub(*argv)
        assert r.returncode != 0 and "password is required" in r.stderr, r.stdout + r.stderr


def test_a_real_user_spawns_runs_as_themselves_is_accounted_and_stops(hub, slurm, users):
    user = users[0]
    set_balance(hub, user, "100")
    r = spawn(hub, user, {"profile": "a6000"})
    ok, message = wait_for_spawn(hub, user, r)
    assert ok, f"the documented setup did not start a server: {message}\n{hub.log_tail(40)}"
    [alloc] = allocations(hub)
    [job_id] = slurm.job_ids()
    detail = slurm.run(["scontrol", "show", "job", "-o", str(job_id)]).stdout
    assert re.search(rf"UserId={user}\(", detail), detail  # submitted through sudo as the user
    assert f"gpupool-allocation={alloc['id']}" in detail  # what charging reads from sacct
    env = server_info(hub, user)["env"]
    assert env["GPUPOOL_ALLOCATION"] == alloc["id"] and env.get("CUDA_VISIBLE_DEVICES"), env
    pid = server_info(hub, user)["pid"]
    assert Path(f"/proc/{pid}").stat().st_uid == pwd.getpwnam(user).pw_uid  # the server runs as the user
    log = Path(pwd.getpwnam(user).pw_dir) / f"jupyterhub_slurmspawner_{job_id}.log"
    assert log.is_file() and log.stat().st_uid == pwd.getpwnam(user).pw_uid
    stop_server(hub, user)
    wait_for(lambda: not slurm.job_ids(), 30, "stopping the server to scancel its job")
    wait_for(lambda: not allocations(hub), 30, "the allocation to be released")
    if slurm.accounting:  # the record the 'slurm' usage preset charges from
        start, end = slurm.wait_accounted(job_id)
        assert end >= start


def wait_for_spawn(hub, user, response):
    from tests.spawner.conftest import wait_spawned

    return wait_spawned(hub, user, "", response)


def test_hub_users_named_like_uids_are_refused_and_no_job_runs(hub, slurm, users):
    """Issue 37.1: with the documented ``sudo -E -u {username}``, hub user ``#0`` ran its job as root and
    ``#<uid>`` as that uid's owner. Now each gets 403 naming the rule, and Slurm never hears of it."""
    for name in ("#0", f"#{pwd.getpwnam(users[1]).pw_uid}"):
        set_balance(hub, name, "100")
        r = spawn(hub, name, {"profile": "a6000"})
        assert r.status_code == 403, f"{name!r}: {r.status_code} {r.text[:300]}\n{hub.log_tail(30)}"
        assert "must be a Unix login name" in r.json()["message"], r.json()["message"]
    assert slurm.job_ids() == [] and allocations(hub) == []
