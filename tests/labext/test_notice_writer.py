"""The server extension keeps ``GPUPOOL_NOTICE_FILE`` current (issue 25.5).

A real ``jupyter server`` with the variables the spawner sets for a GPU server
(``GPUPOOL_NOTICE_FILE`` under ``~``, ``GPUPOOL_ALLOCATION``) looks at the
stand-in service's ``GET me`` five times a second: a reclaim warning appears in
the file, a service that fails leaves the file as it was, and a withdrawn
warning removes it. A server without GPUs does not ask at all.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpupool_hub.notice import pending_notice
from tests.fixtures.hub import wait_for

from .servers import JupyterProcess
from .standin import SERVER_TOKEN, StandInService, cull_in, example_me

pytestmark = pytest.mark.integration

RECLAIM = "your borrowed GPUs on node-b (server default) are reclaimed for team vision"


@pytest.fixture
def standin():
    with StandInService() as service:
        yield service


def start_server(tmp_path: Path, standin: StandInService, allocation: str) -> JupyterProcess:
    home = tmp_path / "home"
    home.mkdir()
    env = {"GPUPOOL_API_URL": standin.api_url, "JUPYTERHUB_API_TOKEN": SERVER_TOKEN, "GPUPOOL_API_TIMEOUT": "1",
           "HOME": str(home), "GPUPOOL_NOTICE_FILE": "~/.gpupool/notice-default.json",
           "GPUPOOL_NOTICE_INTERVAL": "0.2", "GPUPOOL_ALLOCATION": allocation}
    return JupyterProcess(tmp_path / "server", env=env, enable_extension=True).start()


def polls_after(standin: StandInService, n: int) -> None:
    """Wait until the server has asked ``n`` more times (each look at the pool is one ``GET me``)."""
    seen = len(standin.requests)
    wait_for(lambda: len(standin.requests) >= seen + n, 15, f"{n} more polls of GET me", interval=0.05)


def test_the_file_follows_the_pools_warning(tmp_path, standin):
    server = start_server(tmp_path, standin, "a1b2")
    file = tmp_path / "home" / ".gpupool" / "notice-default.json"
    try:
        polls_after(standin, 2)
        assert not file.exists()  # nothing pending

        standin.set_me(cull_warning=cull_in(5, reason=RECLAIM))
        written = wait_for(lambda: file.exists() and json.loads(file.read_text()), 10, "the notice file")
        assert written == pending_notice(standin.me, "a1b2", "")
        assert written["kind"] == "reclaim" and written["deadline"] == standin.me["cull_warning"]["deadline"]

        standin.mode = "error"  # the pool does not answer: the announced deadline stays
        polls_after(standin, 3)
        assert json.loads(file.read_text()) == written

        standin.mode = "ok"
        standin.me = example_me()  # withdrawn
        wait_for(lambda: not file.exists(), 10, "the notice file to be removed")
        assert not list(file.parent.iterdir())  # no temporary file left behind
        assert "gpupool: this server's GPUs are taken at" in server.log()
    finally:
        server.stop()


def test_a_server_without_gpus_does_not_ask(tmp_path, standin):
    standin.set_me(cull_warning=cull_in(5, reason=RECLAIM))
    server = start_server(tmp_path, standin, "")
    try:
        status, _ = server.get("gpupool/me")  # the widget's path still works
        assert status == 200
        assert len(standin.requests) == 1
        assert not (tmp_path / "home" / ".gpupool").exists()
    finally:
        server.stop()
