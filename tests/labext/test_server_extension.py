"""The ``gpupool_hub.labext`` server extension against real servers.

A real ``jupyter server`` subprocess forwards ``GET {base_url}gpupool/me`` to
a real tornado app standing in for the gpupool service (tests/labext/standin.py).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tornado.httpclient import AsyncHTTPClient

from gpupool_hub.labext import _jupyter_labextension_paths, _jupyter_server_extension_points
from gpupool_hub.labext.handlers import ServiceLocator

from .servers import LABEXTENSION, SERVER_EXTENSION, JupyterProcess, free_port
from .standin import SERVER_TOKEN, StandInService, example_me

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def standin():
    with StandInService() as service:
        yield service


@pytest.fixture(autouse=True)
def _reset(standin):
    standin.me = example_me()
    standin.mode = "ok"
    standin.requests.clear()


@pytest.fixture(scope="module")
def server(standin, tmp_path_factory):
    """A server configured the way the spawner configures it: GPUPOOL_API_URL + token."""
    env = {
        "GPUPOOL_API_URL": standin.api_url,
        "JUPYTERHUB_API_TOKEN": SERVER_TOKEN,
        "GPUPOOL_API_TIMEOUT": "1",
    }
    with JupyterProcess(tmp_path_factory.mktemp("server"), env=env, enable_extension=True,
                        base_url="/user/alice/") as proc:
        yield proc


def test_forwards_me_with_the_server_token(server, standin):
    standin.set_me(balance="12.345")
    status, body = server.get("gpupool/me")
    assert status == 200, body
    # the service's answer as is, plus where the "My GPU usage" page is (the hub prefix is "/" here)
    assert body == {**standin.me, "pages_url": "/services/gpupool/"}
    # Exactly one forwarded call, to the service's `me`, with the server's own token.
    assert standin.requests == [("/services/gpupool/api/v1/me", f"token {SERVER_TOKEN}")]


def test_requires_an_authenticated_user(server, standin):
    status, body = server.get("gpupool/me", token=False)
    assert status == 403
    status, body = server.get("gpupool/me", token="wrong-token")
    assert status == 403
    assert standin.requests == []


def test_service_error_is_balance_unavailable(server, standin):
    standin.mode = "error"
    status, body = server.get("gpupool/me")
    assert status == 502
    assert body == {"error": "balance unavailable", "reason": "gpupool service answered HTTP 500"}


def test_service_garbage_is_balance_unavailable(server, standin):
    standin.mode = "garbage"
    status, body = server.get("gpupool/me")
    assert status == 502
    assert body["error"] == "balance unavailable"
    assert "not JSON" in body["reason"]


def test_service_timeout_is_balance_unavailable(server, standin):
    standin.mode = "slow"
    standin.delay = 3.0  # the server's timeout is 1 s
    status, body = server.get("gpupool/me")
    assert status == 504
    assert body == {"error": "balance unavailable", "reason": "gpupool service timed out"}


def _one_off(tmp_path: Path, env: dict[str, str]) -> tuple[int, dict]:
    with JupyterProcess(tmp_path, env=env, enable_extension=True) as proc:
        return proc.get("gpupool/me")


def test_asks_the_hub_where_the_service_is(tmp_path, standin):
    env = {"JUPYTERHUB_API_URL": standin.hub_api_url, "JUPYTERHUB_API_TOKEN": SERVER_TOKEN}
    status, body = _one_off(tmp_path, env)
    assert status == 200, body
    assert body["balance"] == "46.000"
    assert standin.requests == [
        ("/hub/api/services/gpupool", f"token {SERVER_TOKEN}"),
        ("/services/gpupool/api/v1/me", f"token {SERVER_TOKEN}"),
    ]


def test_service_down_is_balance_unavailable(tmp_path):
    dead = f"http://127.0.0.1:{free_port()}/services/gpupool/api/v1/"
    status, body = _one_off(tmp_path, {"GPUPOOL_API_URL": dead, "JUPYTERHUB_API_TOKEN": SERVER_TOKEN})
    assert status == 502
    assert body["error"] == "balance unavailable"
    assert body["reason"].startswith("gpupool service unreachable")


def test_neither_env_nor_hub_is_503(tmp_path):
    status, body = _one_off(tmp_path, {"JUPYTERHUB_API_TOKEN": SERVER_TOKEN})
    assert status == 503
    assert body == {
        "error": "balance unavailable",
        "reason": "gpupool service not configured (GPUPOOL_API_URL and JUPYTERHUB_API_URL unset)",
    }


def test_no_hub_token_is_503(tmp_path, standin):
    status, body = _one_off(tmp_path, {"GPUPOOL_API_URL": standin.api_url})
    assert status == 503
    assert body["reason"] == "not running under JupyterHub (no JUPYTERHUB_API_TOKEN)"
    assert standin.requests == []


async def test_hub_lookup_builds_the_api_url(standin, monkeypatch):
    """In process: url + prefix + api/v1/, cached; unset url and hub errors explained."""
    monkeypatch.delenv("GPUPOOL_API_URL", raising=False)
    monkeypatch.setenv("JUPYTERHUB_API_URL", standin.hub_api_url)
    locator = ServiceLocator()
    client = AsyncHTTPClient()
    assert await locator.api_url(client, SERVER_TOKEN) == standin.api_url
    assert await locator.api_url(client, SERVER_TOKEN) == standin.api_url
    assert len(standin.requests) == 1  # the second answer came from the cache

    monkeypatch.setenv("GPUPOOL_API_URL", "http://example.invalid/x/api/v1")
    assert await locator.api_url(client, SERVER_TOKEN) == "http://example.invalid/x/api/v1/"

    monkeypatch.delenv("GPUPOOL_API_URL")
    monkeypatch.setenv("GPUPOOL_SERVICE_NAME", "nope")
    locator.forget()
    from gpupool_hub.labext.handlers import BalanceUnavailable

    with pytest.raises(BalanceUnavailable, match="hub did not give the 'nope' service \\(HTTP 404\\)"):
        await locator.api_url(client, SERVER_TOKEN)


def test_extension_hooks():
    assert _jupyter_server_extension_points() == [{"module": SERVER_EXTENSION}]
    (path,) = _jupyter_labextension_paths()
    assert path["dest"] == LABEXTENSION
    built = Path(sys.modules["gpupool_hub.labext"].__file__).parent / path["src"]
    package = json.loads((Path(__file__).parents[2] / "labextension" / "package.json").read_text())
    assert package["name"] == LABEXTENSION
    assert package["jupyterlab"]["outputDir"] == "../gpupool_hub/labext/labextension"
    assert built.name == "labextension"


def test_installed_and_enabled_without_a_separate_step():
    """What `pip install` put in place: the prebuilt extension and the server extension, enabled."""
    jupyter = shutil.which("jupyter", path=str(Path(sys.executable).parent))
    assert jupyter, "jupyter is not installed next to this python"
    lab = subprocess.run([jupyter, "labextension", "list"], capture_output=True, text=True, timeout=120)
    listing = lab.stdout + lab.stderr
    line = next((ln for ln in listing.splitlines() if LABEXTENSION in ln), "")
    assert "enabled" in line and "OK" in line, (
        f"{LABEXTENSION} is not installed and enabled; run `pip install -e .` (it builds labextension/):\n{listing}"
    )
    srv = subprocess.run([jupyter, "server", "extension", "list"], capture_output=True, text=True, timeout=120)
    listing = srv.stdout + srv.stderr
    assert any(SERVER_EXTENSION in ln and "enabled" in ln for ln in listing.splitlines()), listing


def test_a_kernel_started_after_the_gpus_were_taken_back_has_no_device_variable_left(standin, tmp_path):
    """Issue 27.2: the revoked kernel gets none of the server's device selections, not only CUDA's."""
    import urllib.request

    from gpupool_hub.spawner.devices import DEVICE_SELECTION_VARS
    from tests.fixtures.hub import wait_for
    from tests.spawner.conftest import proc_environ

    standin.set_me(allocations=[])  # the pool no longer lists this server's allocation
    env = {"GPUPOOL_API_URL": standin.api_url, "JUPYTERHUB_API_TOKEN": SERVER_TOKEN, "GPUPOOL_API_TIMEOUT": "1",
           "GPUPOOL_ALLOCATION": "a-taken-back"}
    env.update({name: "GPU-2f6c" for name in DEVICE_SELECTION_VARS})  # what the server was spawned with
    with JupyterProcess(tmp_path, env=env, enable_extension=True, base_url="/user/alice/") as server:
        req = urllib.request.Request(server.url + "api/kernels", data=b'{"name": "python3"}', method="POST",
                                     headers={"Authorization": f"token {server.token}",
                                              "Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=60) as resp:  # noqa: S310 (loopback)
            kernel = json.loads(resp.read())["id"]
        pid = wait_for(lambda: next((int(p.name) for p in Path("/proc").glob("[0-9]*")
                                     if _cmdline_has(p, f"kernel-{kernel}.json")), None), 30, "the kernel's process")
        kernel_env = proc_environ(pid)
        status, _ = server.get(f"api/kernels/{kernel}")
        assert status == 200
    assert {name: kernel_env.get(name) for name in DEVICE_SELECTION_VARS} == dict(DEVICE_SELECTION_VARS)
    assert kernel_env["CUDA_VISIBLE_DEVICES"] == "" and kernel_env["NVIDIA_VISIBLE_DEVICES"] == "none"
    assert "took this server's GPUs back" in kernel_env["GPUPOOL_GPUS_REVOKED"]


def _cmdline_has(proc: Path, needle: str) -> bool:
    try:
        return needle.encode() in (proc / "cmdline").read_bytes()
    except OSError:
        return False
