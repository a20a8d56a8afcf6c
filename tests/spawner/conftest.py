"""A real JupyterHub running GPUPoolSimpleSpawner against the real gpupool service.

The single-user "server" is ``tiny_server.py``: a real process the hub starts,
checks, proxies to and stops, cheap enough for 30 concurrent spawns on two
cores (jupyterhub-singleuser needs ~2-4 s of CPU each).
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import requests

TINY = Path(__file__).with_name("tiny_server.py")

POOL = [
    {"name": "node-a", "cpu_milli": 64000, "memory_mib": 262144,
     "gpus": {"count": 4, "model": "NVIDIA GeForce RTX 3090"},
     "links": [{"gpus": [0, 3], "nvlinks": 4}, {"gpus": [1, 2], "nvlinks": 4}]},
    {"name": "node-b", "cpu_milli": 64000, "memory_mib": 262144,
     "gpus": {"count": 4, "model": "NVIDIA RTX A6000"}},
]

PROFILES = [
    {"slug": "cpu", "display_name": "CPU only", "cpu": 1, "memory": "1G", "default": True},
    {"slug": "1gpu", "display_name": "One GPU (any model)", "gpus": 1},
    {"slug": "2x3090", "display_name": "2x RTX 3090", "gpus": 2, "models": ["RTX 3090"], "cpu": 4, "memory": "8G"},
    {"slug": "4x3090", "display_name": "4x RTX 3090", "gpus": 4, "models": ["RTX 3090"]},
    {"slug": "quarter", "display_name": "1/4 RTX 3090", "gpu_fraction": 0.25, "models": ["RTX 3090"]},
    {"slug": "a6000", "display_name": "RTX A6000", "gpus": 1, "max_gpus": 4, "models": ["RTX A6000"]},
    {"slug": "h100", "display_name": "H100", "gpus": 1, "models": ["H100"]},
]


def spawner_config(workdir: Path) -> str:
    return f"""
import asyncio
c.JupyterHub.spawner_class = "gpupool-simple"
c.JupyterHub.allow_named_servers = True
c.JupyterHub.cleanup_servers = False
c.Spawner.cmd = [sys.executable, {str(TINY)!r}]
c.Spawner.poll_interval = 2  # JupyterHub's is 30 s: test_hub.py waits 20 s for a killed server's GPUs to go back
c.Spawner.http_timeout = 60  # JupyterHub's is 30 s: 30 concurrent spawns on two cores (test_hub.py) answer slower
c.SimpleLocalProcessSpawner.home_dir_template = {str(workdir / "home") + "/{username}"!r}
c.GPUPool.nodes = {json.dumps(POOL)}
c.GPUPoolSpawner.profiles = {PROFILES!r}

async def _slow_for_some(spawner):
    # users named slow-* take the slow path: the spawn page redirects to the
    # progress page before start() has asked the pool
    if spawner.user.name.startswith("slow"):
        await asyncio.sleep(2.5)

c.Spawner.pre_spawn_hook = _slow_for_some
"""


def spawner_hub(tmp_path_factory, name: str, extra: str = "", service_poll: int | None = None):
    """A started hub running tiny servers (``spawner_config`` + ``extra``); yields it, then
    stops every server, kills leftovers and stops the hub. Module fixtures delegate here.
    ``service_poll``: see ``Hub`` (for modules that kill the service)."""
    from tests.fixtures.hub import Hub, require_hub_binaries

    require_hub_binaries()
    workdir = tmp_path_factory.mktemp(name)
    hub = Hub(workdir, spawner_config(workdir) + extra, service_poll=service_poll)
    hub.start()
    try:
        yield hub
    finally:  # also when a caller's setup fails and the generator is closed
        try:
            stop_everything(hub)
        finally:
            kill_leftovers(hub)
            hub.stop()


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    # The wait queue off: test_hub.py checks what a full pool answers without it (no_capacity at
    # once, naming what is free; 30 spawns on 8 GPUs, 22 refused), test_refusal_logs.py how that
    # refusal is logged. The queue has its own hub tests (test_queue_hub.py, test_queue_flood_hub.py).
    yield from spawner_hub(tmp_path_factory, "spawnhub", "c.GPUPool.queue_enabled = False\n")


@pytest.fixture(autouse=True)
def _fresh_outbox(monkeypatch):
    """Spawners in this test process get an empty release outbox of their own (no leftovers of another test)."""
    from gpupool_hub.spawner import release

    monkeypatch.setattr(release, "outbox", release.ReleaseOutbox())


@pytest.fixture(autouse=True)
def _clean_pool(request):
    """After each test: stop every server and check that no GPU stays allocated."""
    yield
    if "hub" not in request.fixturenames:
        return
    hub = request.getfixturevalue("hub")
    if hub.proc is None or hub.proc.poll() is not None:
        return
    stop_everything(hub)
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if not allocations(hub):
            return
        time.sleep(0.3)
    pytest.fail(f"GPUs still allocated after every server stopped: {allocations(hub)}\n{hub.log_tail(80)}")


# ---------------------------------------------------------------- helpers


def q(name: str) -> str:
    return quote(name, safe="")


def server_path(user: str, server: str = "") -> str:
    return f"/users/{q(user)}/servers/{q(server)}" if server else f"/users/{q(user)}/server"


def spawn(hub, user: str, options: dict[str, Any] | None, server: str = "") -> requests.Response:
    hub.create_user(user)
    body = {"user_options": options} if options is not None else {}
    return hub.hub_request("POST", server_path(user, server), json=body)


def user_model(hub, user: str) -> dict[str, Any]:
    """The hub's user model as the gpupool service sees it (its role may read server state)."""
    r = requests.get(f"{hub.api}/users/{q(user)}", headers={"Authorization": f"token {hub.service_token}"},
                     timeout=30)
    r.raise_for_status()
    return r.json()


def progress_events(hub, user: str, server: str = "", timeout: float = 60) -> list[dict[str, Any]]:
    """Every event of ``GET …/progress`` until it ends (ready or failed)."""
    path = f"/users/{q(user)}/servers/{q(server)}/progress" if server else f"/users/{q(user)}/server/progress"
    events = []
    with hub.hub_request("GET", path, stream=True, timeout=timeout) as r:
        assert r.status_code == 200, r.text[:300]
        for line in r.iter_lines(decode_unicode=True):
            if line and line.startswith("data:"):
                event = json.loads(line[5:])
                events.append(event)
                if event.get("ready") or event.get("failed"):
                    break
    return events


def wait_spawned(hub, user: str, server: str, response: requests.Response) -> tuple[bool, str]:
    """Outcome of a spawn request: (ready, failure message)."""
    if response.status_code == 201:
        return True, ""
    if response.status_code >= 400:
        try:
            return False, response.json()["message"]
        except ValueError:
            return False, response.text
    assert response.status_code == 202, response.text
    events = progress_events(hub, user, server)
    last = events[-1] if events else {}
    if last.get("ready"):
        return True, ""
    if last.get("failed"):
        return False, last.get("message", "")
    # the stream ended without a verdict: ask the user model
    model = user_model(hub, user)
    srv = model.get("servers", {}).get(server)
    return bool(srv and srv.get("ready")), json.dumps(events)


def start_ok(hub, user: str, options: dict[str, Any] | None, server: str = "") -> dict[str, Any]:
    ok, message = wait_spawned(hub, user, server, spawn(hub, user, options, server))
    assert ok, f"{user}/{server} did not start: {message}\n{hub.log_tail(30)}"
    return server_info(hub, user, server)


def server_info(hub, user: str, server: str = "") -> dict[str, Any]:
    """What the running server itself reports (pid, GPU environment), fetched through the proxy."""
    path = f"/user/{q(user)}/{q(server) + '/' if server else ''}env"
    r = requests.get(f"{hub.url}{path}", timeout=30)
    assert r.status_code == 200, f"{path}: {r.status_code} {r.text[:200]}"
    return r.json()


def allocations(hub) -> list[dict[str, Any]]:
    r = hub.service("GET", "/allocations", hub.spawner_token)
    r.raise_for_status()
    return r.json()["allocations"]


def stop_server(hub, user: str, server: str = "", timeout: float = 30) -> None:
    r = hub.hub_request("DELETE", server_path(user, server))
    assert r.status_code in (202, 204, 400, 404), r.text
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        srv = user_model(hub, user).get("servers", {}).get(server)
        if not srv or not srv.get("pending") and not srv.get("ready"):
            return
        time.sleep(0.2)
    raise AssertionError(f"{user}/{server} did not stop")


def stop_everything(hub) -> None:
    r = requests.get(f"{hub.api}/users", params={"state": "active"},
                     headers={"Authorization": f"token {hub.tester_token}"}, timeout=30)
    if r.status_code != 200:
        return
    for user in r.json():
        for name in list((user.get("servers") or {})):
            try:
                stop_server(hub, user["name"], name)
            except AssertionError:
                pass


def kill_leftovers(hub) -> None:
    """Last resort: servers that outlived their hub (cleanup_servers is False)."""
    for proc_dir in Path("/proc").glob("[0-9]*"):
        try:
            cmd = (proc_dir / "cmdline").read_bytes().split(b"\0")
            env = (proc_dir / "environ").read_bytes()
        except OSError:
            continue
        if str(TINY).encode() in cmd and f"127.0.0.1:{hub.hub_port}".encode() in env:
            try:
                os.kill(int(proc_dir.name), signal.SIGKILL)
            except OSError:
                pass


def proc_environ(pid: int) -> dict[str, str]:
    raw = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    return dict(item.decode().split("=", 1) for item in raw if b"=" in item)


def set_balance(hub, user: str, amount: str) -> None:
    """Bring a user's balance to ``amount`` tokens with an admin adjustment."""
    from decimal import Decimal

    hub.create_user(user)
    r = hub.service("GET", f"/users/{q(user)}", hub.spawner_token)
    r.raise_for_status()
    delta = Decimal(amount) - Decimal(r.json()["balance"])
    if delta:
        r = hub.service("POST", f"/users/{q(user)}/grant", hub.tester_token,
                        json={"amount": str(delta), "reason": "test: set balance"})
        assert r.status_code == 201, r.text


def service_pid(hub) -> int:
    """The pid of the hub's managed gpupool service: a child of the hub running ``gpupool_hub.service``."""
    for proc_dir in Path("/proc").glob("[0-9]*"):
        try:
            stat = (proc_dir / "stat").read_text()
            cmd = (proc_dir / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        if ppid == hub.proc.pid and b"gpupool_hub.service" in cmd:
            return int(proc_dir.name)
    raise AssertionError(f"no gpupool service running under the hub (pid {hub.proc.pid})")
