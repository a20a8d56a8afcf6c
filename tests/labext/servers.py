"""Real Jupyter servers in subprocesses, for the widget's tests.

:class:`JupyterProcess` starts ``python -m jupyter_server`` or
``python -m jupyterlab`` on a free loopback port with token auth and isolated
config/data/runtime/settings directories, and waits until it answers.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from tests.fixtures import processes
from tests.fixtures.ports import free_port

SERVER_EXTENSION = "gpupool_hub.labext"
LABEXTENSION = "@gpupool/hub-balance"
PLUGIN_ID = f"{LABEXTENSION}:plugin"


class JupyterProcess:
    """A real ``jupyter server`` / ``jupyter lab`` in a subprocess.

    ``env`` is added to a copy of this process's environment with every
    ``GPUPOOL_*`` / ``JUPYTERHUB_*`` variable removed first, so the caller
    decides exactly what the server sees. ``enable_extension`` enables the
    server extension in the server's own config dir (for tests of the handler that must
    not depend on the installed ``jupyter_server_config.d`` file); without it
    the server relies on what ``pip install`` put in place.
    """

    def __init__(
        self,
        tmp_path: Path,
        *,
        app: str = "server",
        env: dict[str, str] | None = None,
        enable_extension: bool = False,
        settings: dict[str, dict[str, Any]] | None = None,
        base_url: str = "/",
    ) -> None:
        self.tmp_path = tmp_path
        self.app = app
        self.port = free_port()
        self.token = "lab-token-" + os.urandom(8).hex()
        self.base_url = base_url
        self.root = tmp_path / "root"
        self.log_path = tmp_path / f"jupyter-{app}.log"
        self._env = env or {}
        self._enable = enable_extension
        self._settings = settings or {}
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}{self.base_url}"

    def _environ(self) -> dict[str, str]:
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("GPUPOOL_", "JUPYTERHUB_", "JUPYTER_", "JUPYTERLAB_"))
        }
        dirs = {
            "JUPYTER_CONFIG_DIR": "config",
            "JUPYTER_DATA_DIR": "data",
            "JUPYTER_RUNTIME_DIR": "runtime",
            "JUPYTERLAB_SETTINGS_DIR": "lab-settings",
            "JUPYTERLAB_WORKSPACES_DIR": "lab-workspaces",
        }
        for var, name in dirs.items():
            path = self.tmp_path / name
            path.mkdir(parents=True, exist_ok=True)
            env[var] = str(path)
        env["JUPYTER_PLATFORM_DIRS"] = "1"
        build = os.environ.get("GPUPOOL_LABEXTENSION_DIR")
        if build:  # a build of the widget to test instead of the installed one (JUPYTER_PATH comes first)
            link = self.tmp_path / "jupyter-path" / "labextensions" / "@gpupool" / "hub-balance"
            if not link.exists():
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(Path(build).resolve(), target_is_directory=True)
            env["JUPYTER_PATH"] = str(self.tmp_path / "jupyter-path")
        env.update(self._env)
        return env

    def _write_settings(self, settings_dir: Path) -> None:
        for plugin_id, values in self._settings.items():
            package, _, plugin = plugin_id.partition(":")
            target = settings_dir.joinpath(*package.split("/"), f"{plugin}.jupyterlab-settings")
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(json.dumps(values))

    def start(self, timeout: float = 90) -> JupyterProcess:
        self.root.mkdir(parents=True, exist_ok=True)
        env = self._environ()
        self._write_settings(Path(env["JUPYTERLAB_SETTINGS_DIR"]))
        module = {"server": "jupyter_server", "lab": "jupyterlab"}[self.app]
        cmd = [
            sys.executable, "-m", module,
            "--no-browser",
            "--ServerApp.ip=127.0.0.1",
            f"--ServerApp.port={self.port}",
            "--ServerApp.port_retries=0",
            f"--ServerApp.base_url={self.base_url}",
            f"--ServerApp.root_dir={self.root}",
            f"--IdentityProvider.token={self.token}",
            "--ServerApp.open_browser=False",
        ]
        if hasattr(os, "geteuid") and os.geteuid() == 0:
            cmd.append("--allow-root")  # CI containers run as root
        if self._enable:
            config = {"ServerApp": {"jpserver_extensions": {SERVER_EXTENSION: True}}}
            Path(env["JUPYTER_CONFIG_DIR"], "jupyter_server_config.json").write_text(json.dumps(config))
        if self.app == "lab":
            # No news / update checks: nothing outside may be reached.
            cmd += ["--LabApp.news_url=", "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate"]
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=self.root)
        log.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"jupyter {self.app} exited with {self.proc.returncode}:\n{self.log()}")
            try:
                status, _ = self.get("api/status")
                if status == 200:
                    return self
            except OSError:
                pass
            time.sleep(0.25)
        self.stop()
        raise RuntimeError(f"jupyter {self.app} did not answer within {timeout} s:\n{self.log()}")

    def stop(self) -> None:
        """Stop the server, then by PID its kernels (each in a session of its own) if it left any."""
        if self.proc is None or self.proc.poll() is not None:
            return
        kernels = processes.descendants(self.proc.pid, processes.process_table())
        self.proc.terminate()
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        processes.stop_processes(kernels.values())

    def __enter__(self) -> JupyterProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-6000:]
        except OSError:
            return ""

    def get(self, path: str, *, token: str | None | bool = True, timeout: float = 30) -> tuple[int, Any]:
        """GET ``{url}{path}``; returns (status, parsed JSON or text). token=False: no token."""
        headers = {}
        if token is True:
            token = self.token
        if token:
            headers["Authorization"] = f"token {token}"
        req = urllib.request.Request(self.url + path, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 (loopback)
                status, body, ctype = resp.status, resp.read(), resp.headers.get("Content-Type", "")
        except urllib.error.HTTPError as e:
            status, body, ctype = e.code, e.read(), e.headers.get("Content-Type", "")
        if "json" in ctype:
            return status, json.loads(body)
        return status, body.decode(errors="replace")
