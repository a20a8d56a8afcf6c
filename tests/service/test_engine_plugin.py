"""An engine from outside the package (issue 49.2): ``tests/toy_engine/`` is one folder, and one entry
point line (group ``gpupool_hub.engines``) installs it. Nothing in gpupool_hub names it, yet its
setting joins ``c.GPUPool``, its inventory and usage preset are chosen by name and its start check
can refuse a start, in a real service process.

The plug-in is "installed" the way pip leaves one: a ``*.dist-info`` folder with ``entry_points.txt``
on the service's ``PYTHONPATH``.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import requests

from tests.fixtures.hub import free_port, wait_for

ROOT = Path(__file__).resolve().parents[2]
SPAWNER_TOKEN = "engine-plugin-spawner-secret-0123456789"


def _install_toy(site: Path) -> None:
    info = site / "gpupool_toy_engine-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: gpupool-toy-engine\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[gpupool_hub.engines]\ntoy = tests.toy_engine.engine\n")


def _env(site: Path | None, port: int) -> dict[str, str]:
    path = [str(ROOT)] + ([str(site)] if site else [])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(path),
            "JUPYTERHUB_API_URL": f"http://127.0.0.1:{free_port()}/hub/api",  # no hub: none is needed here
            "JUPYTERHUB_API_TOKEN": "engine-plugin-test", "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{port}"}


def _config(tmp_path: Path, gpus: int) -> Path:
    config = tmp_path / f"config{gpus}.py"
    config.write_text(textwrap.dedent(f"""
        c = get_config()  # noqa
        c.GPUPool.prices = {{"Toy GPU": 2}}
        c.GPUPool.db_url = "sqlite:///{tmp_path}/gpupool{gpus}.sqlite"
        c.GPUPool.inventory = "toy"
        c.GPUPool.toy_gpus = {gpus}
        c.GPUPoolService.usage_preset = "toy"
        c.GPUPoolService.spawner_token = "{SPAWNER_TOKEN}"
    """))
    return config


def _start(config: Path, env: dict[str, str], log: Path) -> subprocess.Popen:
    with open(log, "wb") as out:
        return subprocess.Popen([sys.executable, "-m", "gpupool_hub.service", "--config", str(config)], env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=config.parent)


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait(10)


@pytest.fixture
def site(tmp_path):
    site = tmp_path / "site"
    _install_toy(site)
    return site


def test_an_installed_engine_brings_its_setting_inventory_and_usage_to_a_real_service(tmp_path, site):
    port = free_port()
    proc = _start(_config(tmp_path, 3), _env(site, port), tmp_path / "service.log")
    try:
        def metrics() -> str | None:
            try:
                r = requests.get(f"http://127.0.0.1:{port}/services/gpupool/metrics",
                                 headers={"Authorization": f"token {SPAWNER_TOKEN}"}, timeout=2)
            except requests.RequestException:
                return None
            return r.text if r.status_code == 200 else None

        wait_for(lambda: metrics() is not None or proc.poll() is not None, 60, "the service to answer")
        assert proc.poll() is None, (tmp_path / "service.log").read_text()
        text = metrics()
        assert re.search(r'^gpupool_capacity_gpus\{model="Toy GPU"\} 3\.0$', text or "", re.M), text
    finally:
        _stop(proc)


def _refused(tmp_path: Path, gpus: int, site: Path | None) -> str:
    """The log of a service start that must fail (its exit status checked here)."""
    proc = _start(_config(tmp_path, gpus), _env(site, free_port()), tmp_path / "service.log")
    try:
        proc.wait(60)
    finally:
        _stop(proc)
    assert proc.returncode != 0
    return (tmp_path / "service.log").read_text()


def test_an_installed_engine_start_check_refuses_a_start_naming_why(tmp_path, site):
    log = _refused(tmp_path, 0, site)
    assert "the toy engine needs c.GPUPool.toy_gpus >= 1" in log
    assert "Traceback" not in log


def test_without_the_plugin_its_names_are_refused_with_the_choices(tmp_path):
    log = _refused(tmp_path, 3, None)
    # the first name refused (the usage preset, an Enum of the engines'), with the choices it has
    assert "'toy'" in log and "'slurm'" in log and "Traceback" not in log, log
