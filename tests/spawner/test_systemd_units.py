"""Issue 27.2: gpupool-systemd puts each server's GPUs behind a device cgroup; issue 37.1: only a login
name (with an account, unless systemd makes one: ``dynamic_users``) becomes a unit's name or user.

The real spawner runs its real start: systemdspawner builds the ``systemd-run``
command line, and stand-ins for ``systemd-run`` / ``systemctl`` on ``PATH`` record
the argv they get (no systemd needed: the unit's properties are what
``--property=`` passes). The pool is the real service (in-process, SQLite); the
driver's ``/proc/driver/nvidia/gpus`` is a directory written here, so the UUID ->
minor number mapping is tested too.
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import sys
import textwrap
from datetime import datetime, timezone
from pathlib import Path
from types import SimpleNamespace

import pytest
from traitlets.config import Config

pytest.importorskip("systemdspawner")

from systemdspawner import SystemdSpawner, systemd  # noqa: E402

from gpupool_hub.spawner.devices import CONTROL_NODES  # noqa: E402
from gpupool_hub.service.core.admission import parse_request  # noqa: E402
from gpupool_hub.spawner.errors import GPUPoolRefused, SpawnFailure  # noqa: E402
from gpupool_hub.engines.systemd.spawner import GPUPoolSystemdSpawner  # noqa: E402
from gpupool_hub.identity.unix import RULE  # noqa: E402
from tests.agent.test_service import Service  # noqa: E402
from tests.fixtures.unix_accounts import unix_account  # noqa: E402,F401 (fixture)

STAND_IN = textwrap.dedent("""
    import json, os, sys
    log = os.environ["GPUPOOL_TEST_SYSTEMD_LOG"]
    name = os.path.basename(sys.argv[0])
    with open(log, "a") as f:
        f.write(json.dumps([name] + sys.argv[1:]) + "\\n")
    args = sys.argv[1:]
    if name == "systemd-run":  # the unit runs from now on
        open(log + "." + args[args.index("--unit") + 1], "w").close()
    elif args[:1] == ["--version"]:
        print("systemd 252 (252.22-1)")
    elif args[:1] == ["is-active"]:
        sys.exit(0 if os.path.exists(log + "." + args[1]) else 3)
    elif args[:1] == ["stop"] and os.path.exists(log + "." + args[1]):
        os.remove(log + "." + args[1])
    elif sys.argv[1:2] == ["is-failed"]:
        sys.exit(1)
""")


@pytest.fixture
def systemd_stand_in(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("systemd-run", "systemctl"):
        path = bin_dir / name
        path.write_text(f"#!{sys.executable}\n" + STAND_IN)
        path.chmod(0o755)
    log = tmp_path / "systemd.jsonl"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("GPUPOOL_TEST_SYSTEMD_LOG", str(log))
    monkeypatch.setattr(systemd, "RUN_ROOT", str(tmp_path / "run"))  # the unit's env file goes here, not /run

    def calls(program: str) -> list[list[str]]:
        if not log.exists():
            return []
        return [c[1:] for c in map(json.loads, log.read_text().splitlines()) if c[0] == program]

    return calls


def driver_dir(tmp_path: Path, minors: dict[str, int]) -> str:
    """``/proc/driver/nvidia/gpus`` as the driver writes it: one directory per GPU, by bus id."""
    root = tmp_path / "nvidia-gpus"
    for i, (uuid, minor) in enumerate(minors.items()):
        d = root / f"0000:{0x10 + i:02x}:00.0"
        d.mkdir(parents=True)
        (d / "information").write_text(f"Model: \t\t NVIDIA A100-SXM4-80GB\nIRQ:   \t\t 42\nGPU UUID: \t {uuid}\n"
                                       f"Video BIOS: \t 92.00.36.00.01\nBus Type: \t PCIe\nDevice Minor: \t {minor}\n")
    return str(root)


def make_spawner(tmp_path, svc: Service | None, **traits) -> GPUPoolSystemdSpawner:
    c = Config()
    c.GPUPoolSpawner.profiles = [{"slug": "cpu", "display_name": "CPU", "default": True},
                                 {"slug": "gpu", "display_name": "1 GPU", "gpus": 1}]
    c.SystemdSpawner.dynamic_users = True  # no Unix account needed for the test user
    c.SystemdSpawner.start_timeout = 5
    c.Spawner.cmd = ["/bin/true"]
    for name, value in traits.items():
        setattr(c.GPUPoolSystemdSpawner, name, value)
    if svc is not None:
        c.GPUPoolSpawner.gpupool_api_url = svc.url + "api/v1"
        c.GPUPoolSpawner.gpupool_api_token = "admin-token"
    user = SimpleNamespace(name="gpupool-t1", groups=[], url="/user/gpupool-t1/", escaped_name="gpupool-t1", id=7)
    hub = SimpleNamespace(api_url="http://127.0.0.1:8081/hub/api", base_url="/hub/",
                          url="http://127.0.0.1:8081/hub/", public_host="", host="")
    return GPUPoolSystemdSpawner(user=user, hub=hub, config=c)


def device_properties(argv: list[str]) -> tuple[list[str], list[str]]:
    """(DevicePolicy values, DeviceAllow values) of one systemd-run command line."""
    props = [a.split("=", 1)[1] for a in argv if a.startswith("--property=")]
    policy = [p.split("=", 1)[1] for p in props if p.startswith("DevicePolicy=")]
    allow = [p.split("=", 1)[1] for p in props if p.startswith("DeviceAllow=")]
    return policy, allow


async def start_unit(spawner: GPUPoolSystemdSpawner, allocation) -> None:
    """What the mixin's start does before the wrapped spawner's start: apply the pool's answer."""
    spawner.apply_gpupool_allocation(allocation)
    assert await SystemdSpawner.start(spawner) is not None


async def test_a_one_gpu_unit_may_open_exactly_its_gpu_and_a_cpu_only_unit_none(tmp_path, systemd_stand_in):
    svc = Service(tmp_path)
    try:
        record = svc.manager.admission.admit("gpupool-t1", [], "", parse_request({"gpus": 1}))
        gpu = record.gpus[0]
        other = next(u for u in ("GPU-0000-fake", "GPU-0001-fake") if u != gpu["uuid"])
        # the driver numbers this GPU 5 (not its index): the UUID decides, not the order
        minors = {gpu["uuid"]: 5, other: 4}
        spawner = make_spawner(tmp_path, svc, nvidia_proc_dir=driver_dir(tmp_path, minors))
        allocation = {"id": record.id, "node": record.node, "gpus": record.gpus}
        await start_unit(spawner, allocation)
        [run] = systemd_stand_in("systemd-run")
        policy, allow = device_properties(run)
        assert policy == ["closed"]
        assert sorted(allow) == sorted([f"{n} rw" for n in CONTROL_NODES] + ["/dev/nvidia5 rw"])
        assert not any("/dev/nvidia4" in a for a in allow)

        # the same spawner restarted as a CPU-only server: a closed policy and no device at all
        spawner.unit_name = spawner.unit_name + "-cpu"
        await start_unit(spawner, None)
        policy, allow = device_properties(systemd_stand_in("systemd-run")[-1])
        assert policy == ["closed"] and allow == []
    finally:
        svc.stop()


async def test_admin_device_entries_stay_and_the_index_stands_in_for_an_unknown_minor(tmp_path, systemd_stand_in):
    spawner = make_spawner(tmp_path, None, nvidia_proc_dir=str(tmp_path / "no-driver"),
                           unit_extra_properties={"DeviceAllow": "/dev/fuse rw", "Nice": "5"})
    alloc = {"id": "a1", "node": "n1", "gpus": [{"index": 3, "uuid": "GPU-x", "model": "A100", "fraction": "1.000",
                                                 "mig_uuid": "MIG-x-1g"}]}
    await start_unit(spawner, alloc)
    run = systemd_stand_in("systemd-run")[-1]
    policy, allow = device_properties(run)
    assert policy == ["closed"] and "--property=Nice=5" in run
    assert allow[0] == "/dev/fuse rw" and "/dev/nvidia3 rw" in allow and "char-nvidia-caps r" in allow
    await start_unit(spawner, None)
    assert device_properties(systemd_stand_in("systemd-run")[-1]) == (["closed"], ["/dev/fuse rw"])


async def test_a_revoked_allocation_takes_the_running_units_gpus_away(tmp_path, systemd_stand_in):
    svc = Service(tmp_path)
    try:
        record = svc.manager.admission.admit("gpupool-t1", [], "", parse_request({"gpus": 1}))
        spawner = make_spawner(tmp_path, svc, nvidia_proc_dir=str(tmp_path / "no-driver"))
        await start_unit(spawner, {"id": record.id, "node": record.node, "gpus": record.gpus})
        spawner.gpupool_allocation_id = record.id
        assert await spawner.poll() is None
        assert systemd_stand_in("systemctl")[-1] == ["is-active", spawner.unit_name]  # held: nothing changes
        # the pool takes the GPUs back while the server runs (e.g. its kernels were culled)
        code, body = await svc.call("DELETE", f"allocations/{record.id}", "admin-token")
        assert code == 200, body
        assert await spawner.poll() is None
        assert ["set-property", "--runtime", spawner.unit_name, "DeviceAllow="] in systemd_stand_in("systemctl")
        before = len(systemd_stand_in("systemctl"))
        assert await spawner.poll() is None  # once is enough
        assert all(c[0] != "set-property" for c in systemd_stand_in("systemctl")[before:])
    finally:
        svc.stop()


# ------------------------------------------------- issue 37.1: the names that reach systemd

def named_spawner(svc: Service, name: str, dynamic_users: bool) -> GPUPoolSystemdSpawner:
    """The real spawner for hub user ``name``, asking ``svc`` for GPUs (its whole start, the mixin's too)."""
    c = Config()
    c.GPUPoolSpawner.profiles = [{"slug": "gpu", "display_name": "1 GPU", "gpus": 1, "default": True}]
    c.GPUPoolSpawner.gpupool_api_url = svc.url + "api/v1"
    c.GPUPoolSpawner.gpupool_api_token = "admin-token"
    c.SystemdSpawner.dynamic_users = dynamic_users
    c.SystemdSpawner.start_timeout = 5
    c.Spawner.cmd = ["/bin/true"]
    user = SimpleNamespace(name=name, groups=[], url=f"/user/{name}/", escaped_name=name, id=7)
    hub = SimpleNamespace(api_url="http://127.0.0.1:8081/hub/api", base_url="/hub/",
                          url="http://127.0.0.1:8081/hub/", public_host="", host="")
    return GPUPoolSystemdSpawner(user=user, hub=hub, config=c)


def held(svc: Service) -> list:
    return svc.manager.ledger.allocations.overlapping(datetime(2000, 1, 1, tzinfo=timezone.utc),
                                                      datetime(2100, 1, 1, tzinfo=timezone.utc))


@pytest.mark.parametrize("name, dynamic_users", [
    ("#0", False), ("#1001", True), ("-u", True), ("alice bob", False), ("..", True), ("1001", False),
    ("no account", False),  # a good name, but the unit would run as an account pwd does not know
])
async def test_a_name_that_is_no_login_name_or_account_starts_no_unit(tmp_path, systemd_stand_in, name,
                                                                    dynamic_users):
    svc = Service(tmp_path)
    try:
        name = f"noacct{secrets.token_hex(3)}" if name == "no account" else name
        spawner = named_spawner(svc, name, dynamic_users)
        with pytest.raises(GPUPoolRefused) as e:
            await spawner.start()
        assert e.value.status_code == 403 and e.value.reason == SpawnFailure.UNIX_NAME
        assert RULE in e.value.message and repr(name) in e.value.message, e.value.message
        assert systemd_stand_in("systemd-run") == []
        assert [c for c in systemd_stand_in("systemctl") if c != ["--version"]] == []
        assert held(svc) == [] and svc.manager.ledger.history(name) == []  # the pool was never asked
    finally:
        svc.stop()


@pytest.mark.parametrize("dynamic_users", [False, True])
async def test_a_real_account_or_a_good_name_with_dynamic_users_starts_its_unit(tmp_path, systemd_stand_in,
                                                                              dynamic_users, unix_account):
    svc = Service(tmp_path)
    try:
        # an ordinary account (issue 48.1: the runner's own, root, is refused); dynamic users: systemd makes it
        name = unix_account("sysd") if not dynamic_users else "gpupool-t2"
        own = pwd.getpwnam(name) if not dynamic_users else None
        spawner = named_spawner(svc, name, dynamic_users)
        await spawner.start()
        [alloc] = held(svc)
        assert alloc.user == name and alloc.released_at is None
        [run] = systemd_stand_in("systemd-run")
        assert run[run.index("--unit") + 1] == spawner.unit_name == f"jupyter-{name}-singleuser"
        assert (own is not None and f"--uid={own.pw_uid}" in run) == (not dynamic_users), run
        await spawner.stop(now=True)
    finally:
        svc.stop()
