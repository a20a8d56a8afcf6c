"""GPUPOOL_NOTICE_FILE in a real user server during a countdown (issue 25.5).

A real JupyterHub with the gpupool service and the ``gpupool-simple`` spawner
starts alice's ``jupyterhub-singleuser`` server on the pool's one RTX 3090. Her
GPU idles (the node agent reports 0 %) while bob waits for it, so the pool
announces when her server stops. Code in a kernel of her server, the way a
training loop would, reads ``gpupool_hub.notice.deadline()`` and finds that
same deadline; once bob gives up, the file is gone and ``deadline()`` is None.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from gpupool_hub.notice import parse_instant
from tests.fixtures.hub import wait_for

from .conftest import q, shut_down, spawn
from .test_widget_hub import AGENT_TOKEN, GIB, widget_config

pytestmark = pytest.mark.integration

#: the pool of test_widget_hub (one RTX 3090, idle after 2 s); the server extension
#: looks at the pool every second here (15 s by default)
CONFIG_TAIL = """
c.Spawner.environment["GPUPOOL_NOTICE_INTERVAL"] = "1"
"""

READ_DEADLINE = """
import json, os
from gpupool_hub.notice import deadline
at = deadline()
print(json.dumps({"file": os.environ.get("GPUPOOL_NOTICE_FILE"), "deadline": at.isoformat() if at else None}))
"""


@pytest.fixture
def notice_hub(hub_factory):
    hub = hub_factory(start=False)
    hub.extra_config = widget_config(hub.workdir) + CONFIG_TAIL
    hub.start()
    try:
        yield hub
    finally:
        shut_down(hub)


class KernelOf:
    """A kernel started in a user's server through its REST API, driven over its
    connection file (the server and the test share the runtime directory)."""

    def __init__(self, hub, user: str, token: str, runtime_dir: Path) -> None:
        import requests

        self.url = f"{hub.url}/user/{q(user)}/api/kernels"
        self.headers = {"Authorization": f"token {token}"}
        r = requests.post(self.url, json={"name": "python3"}, headers=self.headers, timeout=60)
        assert r.status_code == 201, r.text
        self.id = r.json()["id"]
        self.requests = requests
        connection = wait_for(lambda: next(runtime_dir.glob(f"kernel-{self.id}.json"), None), 30,
                              "the kernel's connection file")
        from jupyter_client import BlockingKernelClient

        self.client = BlockingKernelClient(connection_file=str(connection))
        self.client.load_connection_file()
        self.client.start_channels(hb=False)  # no heartbeat: its first beats come late on busy cores
        self.client.wait_for_ready(timeout=60)

    def run(self, code: str) -> str:
        out: list[str] = []

        def hook(msg):
            if msg["msg_type"] == "stream":
                out.append(msg["content"]["text"])
            elif msg["msg_type"] == "error":
                out.append("\n".join(msg["content"]["traceback"]))

        reply = self.client.execute_interactive(code, output_hook=hook, timeout=60)
        assert reply["content"]["status"] == "ok", "".join(out)
        return "".join(out)

    def close(self) -> None:
        self.client.stop_channels()
        self.requests.delete(f"{self.url}/{self.id}", headers=self.headers, timeout=30)


def test_a_kernel_reads_the_deadline_the_pool_announced(notice_hub):
    hub = notice_hub
    spawn(hub, "alice", {"profile": "1x3090"})
    alice = hub.token_for("alice")

    def me() -> dict:
        r = hub.service("GET", "/me", alice)
        assert r.status_code == 200, r.text
        return r.json()

    kernel = KernelOf(hub, "alice", alice, hub.workdir / "lab" / "runtime")
    try:
        before = json.loads(kernel.run(READ_DEADLINE))
        assert before["deadline"] is None  # nothing pending yet
        path = Path(before["file"])
        assert path.is_absolute() and path.name == "notice-default.json", before

        # alice's GPU idles while bob waits for it: the pool announces when her server stops
        r = hub.service("PUT", "/nodes/node-a/utilization", AGENT_TOKEN,
                        json={"gpus": {"GPU-widget-0": 0.0}, "memory": {"GPU-widget-0": [GIB, 24 * GIB]}})
        assert r.status_code == 200, r.text
        wait_for(lambda: me()["gpu_servers"][0]["idle_since"], 30, "alice's server to count as idle")
        hub.create_user("bob")
        threading.Thread(target=hub.hub_request, args=("POST", "/users/bob/server"),
                         kwargs={"json": {"user_options": {"profile": "1x3090"}}}, daemon=True).start()
        announced = wait_for(lambda: me()["gpu_servers"][0]["reclaim_deadline"], 60,
                             "the pool to announce alice's stop")

        def kernel_sees() -> dict | None:
            seen = json.loads(kernel.run(READ_DEADLINE))
            return seen if seen["deadline"] else None

        seen = wait_for(kernel_sees, 30, "deadline() in alice's kernel", interval=0.5)
        assert parse_instant(seen["deadline"]) == parse_instant(announced)
        notice = json.loads(path.read_text())
        assert notice["kind"] == "idle" and notice["action"] == "server" and notice["deadline"] == announced

        # bob gives up: alice keeps her GPU, and the file says nothing is pending any more
        hub.hub_request("DELETE", "/users/bob/server")
        wait_for(lambda: json.loads(kernel.run(READ_DEADLINE))["deadline"] is None, 60,
                 "the notice to be withdrawn", interval=0.5)
        assert not path.exists()
    except Exception:
        print(f"--- hub log ---\n{hub.log_tail(80)}")
        raise
    finally:
        kernel.close()
