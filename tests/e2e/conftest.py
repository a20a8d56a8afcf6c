"""End-to-end fixtures: a real JupyterHub + gpupool service + real single-user
servers (``jupyterhub-singleuser`` running JupyterLab with the balance widget).

* :class:`ExampleHub`: the hub started from a wrapper config that
  ``load_subconfig``s the repository's ``jupyterhub_config.example.py`` as is
  (like ``scripts/demo.sh``) and overrides only ports, paths, databases and the
  debit intervals; it adds a test-client service ("tester") for the hub API.
* helpers to spawn through the REST API, wait, stop, and clean up servers (the
  single-user servers run in their own sessions, so they must be stopped
  through the hub, and anything left is killed by pid).
"""

from __future__ import annotations

import json
import os
import signal
import textwrap
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
import requests

from tests.fixtures.hub import Hub, require_hub_binaries, wait_for

from ..labext.browser import browser_page, chromium_executable  # noqa: F401 (fixtures)

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_CONFIG = REPO / "jupyterhub_config.example.py"



def q(name: str) -> str:
    return quote(name, safe="")


# ------------------------------------------------------------------ the hub API


def user_model(hub: Hub, name: str) -> dict[str, Any]:
    r = hub.hub_request("GET", f"/users/{q(name)}")
    r.raise_for_status()
    return r.json()


def spawn(hub: Hub, name: str, user_options: dict[str, Any], timeout: float = 90) -> dict[str, Any]:
    """Start ``name``'s default server with ``user_options`` through the REST API; wait until ready."""
    hub.create_user(name)
    r = hub.hub_request("POST", f"/users/{q(name)}/server", json={"user_options": user_options})
    assert r.status_code in (201, 202), f"spawn refused: {r.status_code} {r.text}\n{hub.log_tail(30)}"

    def ready() -> dict[str, Any] | None:
        server = user_model(hub, name).get("servers", {}).get("")
        if server is None:
            raise AssertionError(f"{name}'s server went away while starting:\n{hub.log_tail(40)}")
        return server if server.get("ready") else None

    return wait_for(ready, timeout, f"{name}'s server to be ready")


def stop_server(hub: Hub, name: str, timeout: float = 30) -> None:
    r = hub.hub_request("DELETE", f"/users/{q(name)}/server")
    assert r.status_code in (202, 204, 400, 404), r.text

    def stopped() -> bool:
        server = user_model(hub, name).get("servers", {}).get("")
        return not server

    wait_for(stopped, timeout, f"{name}'s server to stop")


def server_pids(hub: Hub) -> list[int]:
    """Pids of the running single-user servers (SimpleLocalProcessSpawner keeps them in state)."""
    r = requests.get(f"{hub.api}/users", params={"state": "active"},
                     headers={"Authorization": f"token {hub.spawner_token}"}, timeout=30)
    if r.status_code != 200:
        return []
    return [srv["state"]["pid"] for user in r.json() for srv in user.get("servers", {}).values()
            if isinstance(srv.get("state"), dict) and srv["state"].get("pid")]


def shut_down(hub: Hub) -> None:
    """Stop every server through the hub, then the hub; kill any server process left over."""
    pids: list[int] = []
    try:
        if hub.proc is not None and hub.proc.poll() is None:
            pids = server_pids(hub)
            r = hub.hub_request("GET", "/users", params={"state": "active"})
            for user in r.json() if r.status_code == 200 else []:
                for server in user.get("servers", {}):
                    path = f"/users/{q(user['name'])}/servers/{q(server)}" if server else \
                        f"/users/{q(user['name'])}/server"
                    hub.hub_request("DELETE", path)
    except requests.RequestException:
        pass
    finally:
        hub.stop()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass


# ------------------------------------------------------------ single-user Lab


def allow_root() -> str:
    """Config line letting jupyterhub-singleuser run as root (CI containers), else nothing."""
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        return 'c.Spawner.args = ["--allow-root"]  # the tests run as root here'
    return ""


def lab_environment(workdir: Path, poll_seconds: int) -> dict[str, str]:
    """Environment for the single-user servers: isolated Jupyter dirs, the widget
    polling every ``poll_seconds``, and no news/update checks (nothing outside is reached)."""
    from ..labext.browser import write_lab_settings

    dirs = {name: workdir / "lab" / name for name in ("config", "settings", "workspaces", "runtime")}
    for path in dirs.values():
        path.mkdir(parents=True, exist_ok=True)
    write_lab_settings(dirs["settings"], {
        "@gpupool/hub-balance:plugin": {"pollInterval": poll_seconds},
        "@jupyterlab/apputils-extension:notification": {"fetchNews": "false"},
    })
    (dirs["config"] / "jupyter_server_config.json").write_text(json.dumps({
        "LabApp": {"news_url": None, "check_for_updates_class": "jupyterlab.NeverCheckForUpdate"},
    }))
    return {
        "JUPYTER_CONFIG_DIR": str(dirs["config"]),
        "JUPYTERLAB_SETTINGS_DIR": str(dirs["settings"]),
        "JUPYTERLAB_WORKSPACES_DIR": str(dirs["workspaces"]),
        "JUPYTER_RUNTIME_DIR": str(dirs["runtime"]),
        "JUPYTER_PLATFORM_DIRS": "1",
    }


# ------------------------------------------------- hub from the example config


class ExampleHub(Hub):
    """The hub from ``jupyterhub_config.example.py``, loaded unchanged by a wrapper.

    The wrapper overrides only what must differ per test run: ports (the proxy,
    the hub, the service), paths (databases, cookie secret, pid files, homes),
    ``cleanup_servers`` (as the demo does) and the debit intervals; and it adds
    a "tester" service whose token drives the hub API. The service reads the
    wrapper too (``GPUPOOL_CONFIG_FILE`` puts its path into the service's
    ``--config``), and ``GPUPOOL_API_TOKEN`` fixes the spawner/service secret
    so the test can call the service as the spawner does.
    """

    def __init__(self, workdir: Path, *, debit_interval: int, debit_check_interval: float) -> None:
        super().__init__(workdir)
        self.debit_interval = debit_interval
        self.debit_check_interval = debit_check_interval
        self.env = {"GPUPOOL_CONFIG_FILE": str(self.config_path), "GPUPOOL_API_TOKEN": self.spawner_token}

    def write_config(self) -> None:
        w = self.workdir
        config = f"""
        # Test wrapper: the example configuration plus per-run ports and paths.
        c = get_config()  # noqa
        load_subconfig({str(EXAMPLE_CONFIG)!r})  # noqa
        c.JupyterHub.bind_url = "http://127.0.0.1:{self.port}"
        c.JupyterHub.hub_ip = "127.0.0.1"
        c.JupyterHub.hub_port = {self.hub_port}
        c.ConfigurableHTTPProxy.api_url = "http://127.0.0.1:{self.proxy_api_port}"
        c.ConfigurableHTTPProxy.pid_file = "{w}/proxy.pid"
        c.JupyterHub.db_url = "sqlite:///{w}/jupyterhub.sqlite"
        c.JupyterHub.cookie_secret_file = "{w}/cookie_secret"
        c.JupyterHub.pid_file = "{w}/jupyterhub.pid"
        c.JupyterHub.cleanup_servers = True
        c.GPUPool.db_url = "sqlite:///{w}/gpupool.sqlite"
        c.GPUPoolService.debit_interval = {self.debit_interval}
        c.GPUPoolService.debit_check_interval = {self.debit_check_interval}
        c.SimpleLocalProcessSpawner.home_dir_template = "{w}/home/{{username}}"
        {allow_root()}

        # the service's port: the example's fixed 10101 would collide between runs
        [_gpupool] = [s for s in c.JupyterHub.services if s["name"] == "gpupool"]
        _gpupool["url"] = "http://127.0.0.1:{self.service_port}"
        # a test client for the hub API (not part of the example)
        c.JupyterHub.services.append({{"name": "tester", "api_token": {self.tester_token!r}}})
        c.JupyterHub.load_roles.append({{
            "name": "tester", "services": ["tester"],
            "scopes": ["admin:users", "admin:servers", "tokens", "custom:gpupool:admin", "access:services"],
        }})
        """
        self.config_path.write_text(textwrap.dedent(config))


@pytest.fixture
def example_hub_factory(tmp_path: Path) -> Iterator[Callable[..., ExampleHub]]:
    require_hub_binaries()
    hubs: list[ExampleHub] = []

    def make(*, debit_interval: int = 5, debit_check_interval: float = 1) -> ExampleHub:
        workdir = tmp_path / f"examplehub{len(hubs)}"
        workdir.mkdir()
        hub = ExampleHub(workdir, debit_interval=debit_interval, debit_check_interval=debit_check_interval)
        hubs.append(hub)
        hub.start()
        return hub

    yield make
    for hub in hubs:
        shut_down(hub)
