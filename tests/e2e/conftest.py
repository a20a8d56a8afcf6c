"""End-to-end fixtures: a real JupyterHub + gpupool service + real single-user
servers (``jupyterhub-singleuser`` running JupyterLab with the balance widget).

* :class:`ExampleHub`: the hub started from a wrapper config that
  ``load_subconfig``s the repository's ``jupyterhub_config.example.py`` as is
  and overrides only ports, paths, databases and the debit intervals, plus
  DummyAuthenticator so that tests log in by name (the example's PAM needs
  real passwords); it adds a test-client service ("tester") for the hub API.
  Nothing tells the service which file to read: it finds the wrapper itself.
* :func:`unix_users`: real Unix accounts (``useradd`` as root, removed at the
  end) for the example's ``gpupool-localprocess`` spawner, which runs each
  server as its user; their servers are ``probe_server.py`` (system Python,
  standard library), since the test's virtual environment may sit where
  other users cannot enter.
* helpers to spawn through the REST API, wait, stop, and clean up servers (the
  single-user servers run in their own sessions, so they must be stopped
  through the hub, and anything left is killed by pid).
"""

from __future__ import annotations

import json
import os
import pwd
import secrets
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
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
PROBE = Path(__file__).with_name("probe_server.py")


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


def shut_down(hub: Hub) -> None:
    """Stop every server through the hub, then the hub; ``Hub.stop`` kills by PID whatever
    of the hub's is left over (servers, and the service and proxy of a hub that could not
    clean up: they run in sessions of their own, so stopping the hub's process group does not
    reach them)."""
    try:
        if hub.proc is not None and hub.proc.poll() is None:
            hub.record_processes()
            r = hub.hub_request("GET", "/users", params={"state": "active"})
            users = r.json() if r.status_code == 200 else []
            for user in users if isinstance(users, list) else []:  # not a hub on the port: nothing
                for server in user.get("servers", {}):
                    path = f"/users/{q(user['name'])}/servers/{q(server)}" if server else \
                        f"/users/{q(user['name'])}/server"
                    hub.hub_request("DELETE", path)
    except requests.RequestException:
        pass
    finally:
        hub.stop()


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
    env = {
        "JUPYTER_CONFIG_DIR": str(dirs["config"]),
        "JUPYTERLAB_SETTINGS_DIR": str(dirs["settings"]),
        "JUPYTERLAB_WORKSPACES_DIR": str(dirs["workspaces"]),
        "JUPYTER_RUNTIME_DIR": str(dirs["runtime"]),
        "JUPYTER_PLATFORM_DIRS": "1",
    }
    build = os.environ.get("GPUPOOL_LABEXTENSION_DIR")
    if build:  # a build of the widget to test instead of the installed one (JUPYTER_PATH comes first)
        link = workdir / "lab" / "jupyter-path" / "labextensions" / "@gpupool" / "hub-balance"
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(Path(build).resolve(), target_is_directory=True)
        env["JUPYTER_PATH"] = str(workdir / "lab" / "jupyter-path")
    return env


def lab_server_config(workdir: Path, profiles: list[dict[str, Any]], poll_seconds: int) -> str:
    """Hub configuration for real JupyterLab single-user servers with the widget: the
    gpupool spawner with ``profiles``, the lab environment above, and the token role
    the servers forward the widget's requests with (as in the example config)."""
    singleuser = Path(sys.executable).with_name("jupyterhub-singleuser")
    return f"""
c.JupyterHub.spawner_class = "gpupool-simple"
c.GPUPoolSpawner.profiles = {profiles!r}
c.Spawner.default_url = "/lab"
c.Spawner.cmd = [{str(singleuser)!r}]
c.Spawner.http_timeout = 90  # jupyterhub-singleuser takes long to answer on the suite's two cores
c.Spawner.environment = {lab_environment(workdir, poll_seconds)!r}
{allow_root()}
c.SimpleLocalProcessSpawner.home_dir_template = {str(workdir / "home") + "/{username}"!r}
c.JupyterHub.load_roles.append({{
    "name": "server",
    "scopes": ["users:activity!user", "access:servers!server", "access:services!service=gpupool"],
}})
"""


# ------------------------------------------------- hub from the example config


class ExampleHub(Hub):
    """The hub from ``jupyterhub_config.example.py``, loaded unchanged by a wrapper.

    The wrapper overrides only what must differ per test run: ports (the proxy,
    the hub, the service), paths (databases, cookie secret, pid files),
    ``cleanup_servers`` (as the demo does), the debit intervals and the
    authenticator (DummyAuthenticator: tests log in by name); and it adds a
    "tester" service whose token drives the hub API. The service finds the
    wrapper by itself (the example passes the hub's own ``-f`` to it).
    ``GPUPOOL_API_TOKEN`` fixes the service's hub token, and the spawner's
    secret is put where the example's hub and service look for it
    (``gpupool_spawner_token`` in the hub's working directory, mode 0600), so
    the test can call the hub as the service and the service as the spawner. With ``server_cmd`` the single-user
    servers run that command (e.g. the probe server for Unix users) instead of
    ``jupyterhub-singleuser``; ``extra`` is appended to the wrapper.
    """

    def __init__(self, workdir: Path, *, debit_interval: int, debit_check_interval: float,
                 server_cmd: list[str] | None = None, extra: str = "") -> None:
        super().__init__(workdir)
        self.debit_interval = debit_interval
        self.debit_check_interval = debit_check_interval
        self.server_cmd = server_cmd
        self.extra = extra
        self.env = {"GPUPOOL_API_TOKEN": self.service_token}
        secret = workdir / "gpupool_spawner_token"
        secret.touch(mode=0o600)
        secret.write_text(self.spawner_token + "\n")

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
        # tests log in by name; the example's PAM would need real passwords
        c.JupyterHub.authenticator_class = "dummy"
        c.Authenticator.allow_all = True
        {allow_root() if self.server_cmd is None else ""}
        {f"c.Spawner.cmd = {self.server_cmd!r}" if self.server_cmd else ""}

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
        self.config_path.write_text(textwrap.dedent(config) + textwrap.dedent(self.extra))
        self.config_path.chmod(0o600)  # it holds the tester's token: for the hub (root) only


@pytest.fixture
def example_hub_factory(tmp_path: Path) -> Iterator[Callable[..., ExampleHub]]:
    require_hub_binaries()
    hubs: list[ExampleHub] = []

    def make(*, debit_interval: int = 5, debit_check_interval: float = 1, workdir: Path | None = None,
             server_cmd: list[str] | None = None, extra: str = "") -> ExampleHub:
        if workdir is None:
            workdir = tmp_path / f"examplehub{len(hubs)}"
        workdir.mkdir()
        hub = ExampleHub(workdir, debit_interval=debit_interval, debit_check_interval=debit_check_interval,
                         server_cmd=server_cmd, extra=extra)
        hubs.append(hub)
        hub.start()
        return hub

    yield make
    for hub in hubs:
        shut_down(hub)


# ------------------------------------------------------------------ Unix users


def require_root(what: str) -> None:
    """Skip (CI, which runs as root, turns the skip into a failure) unless this runs as root."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip(f"{what} needs root (useradd, and a hub that runs servers as other Unix users); "
                    "CI runs as root")
    if shutil.which("useradd") is None or shutil.which("userdel") is None:
        pytest.skip(f"{what} needs useradd and userdel (apt-get install passwd)")


def system_python() -> str:
    """A Python every Unix user may run (the test's venv may live under a private /root)."""
    for candidate in ("/usr/bin/python3", "/usr/local/bin/python3"):
        if os.access(candidate, os.X_OK) and os.stat(os.path.realpath(candidate)).st_mode & stat.S_IXOTH:
            return candidate
    pytest.skip("no system python3 that other Unix users may run (apt-get install python3)")


@pytest.fixture
def shared_dir() -> Iterator[Path]:
    """A folder other Unix users may enter (0755), outside pytest's private tmp tree: the
    probe server lives here, and hubs whose files other users must not read, to prove they cannot."""
    path = Path(tempfile.mkdtemp(prefix="gpupool-e2e-", dir="/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def probe_cmd(shared_dir: Path) -> list[str]:
    """The single-user command for Unix users' servers: the probe server, readable by everyone."""
    python = system_python()
    probe = shared_dir / PROBE.name
    shutil.copyfile(PROBE, probe)
    probe.chmod(0o644)
    return [python, str(probe)]


def _pids_of_uid(uid: int) -> list[int]:
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if proc.stat().st_uid == uid:
                pids.append(int(proc.name))
        except OSError:
            continue
    return pids


@pytest.fixture
def unix_users() -> Iterator[Callable[[str], str]]:
    """``make(prefix)``: a new Unix account (and hub user name) ``prefix`` + 6 hex digits, with a
    home made by ``useradd --create-home`` (the system's defaults). Removed at the end, after
    any process still running as it is killed by pid. Names never pass through a shell."""
    require_root("a test with real Unix users")
    created: list[str] = []

    def make(prefix: str) -> str:
        name = f"{prefix}{secrets.token_hex(3)}"
        subprocess.run(["useradd", "--create-home", "--shell", "/bin/sh", name], check=True,
                       capture_output=True, timeout=60)
        created.append(name)
        return name

    yield make
    for name in created:
        try:
            uid = pwd.getpwnam(name).pw_uid
        except KeyError:
            continue
        for pid in _pids_of_uid(uid):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        subprocess.run(["userdel", "--remove", name], check=False, capture_output=True, timeout=60)
