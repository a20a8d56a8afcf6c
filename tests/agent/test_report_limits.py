"""What one node agent's request may cost a real ``python -m gpupool_hub.service``
process: an inventory is checked for size before anything is built from it, so the
10⁹-GPU report of issue 27 is refused at once and the service's memory stays put."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import requests

from tests.fixtures.hub import wait_for
from tests.fixtures.ports import free_port as _free_port

TOKENS = {"n1": "secret-n1", "n2": "secret-n2"}
MIB = 1 << 20
A100 = "NVIDIA A100-SXM4-80GB"


class ServiceProcess:
    """The service as the hub starts it, in a process group of its own; no hub needed
    for agent calls (their tokens are the service's own)."""

    def __init__(self, workdir: Path, extra_config: str = "", db_url: str | None = None) -> None:
        self.workdir = workdir
        self.db_url = db_url or f"sqlite:///{workdir / 'gpupool.sqlite'}"
        self.port = _free_port()
        self.config = workdir / "jupyterhub_config.py"
        self.config.write_text(textwrap.dedent(f"""
            c = get_config()  # noqa
            c.GPUPool.inventory = "agents"
            c.GPUPool.prices = {{"A100": 2}}
            c.GPUPool.db_url = {self.db_url!r}
            c.GPUPoolService.agent_tokens = {TOKENS!r}
            c.GPUPoolService.run_jobs = False
        """) + textwrap.dedent(extra_config))
        self.url = f"http://127.0.0.1:{self.port}/services/gpupool/api/v1/"
        self.log = workdir / "service.log"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        env = {**os.environ, "JUPYTERHUB_API_URL": f"http://127.0.0.1:{_free_port()}/hub/api",
               "JUPYTERHUB_API_TOKEN": "unused", "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{self.port}"}
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "gpupool_hub.service", "--config", str(self.config)],
                                         env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

        def up() -> bool:
            assert self.proc is not None and self.proc.poll() is None, self.log.read_text()
            try:
                return requests.get(self.url + "nodes/n1/enforce", headers=self.auth("n1"), timeout=1).ok
            except requests.ConnectionError:
                return False

        wait_for(up, 30, "the service to answer")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.proc = None

    def rss(self) -> int:
        assert self.proc is not None
        return psutil.Process(self.proc.pid).memory_info().rss

    @staticmethod
    def auth(node: str) -> dict[str, str]:
        return {"Authorization": f"token {TOKENS[node]}"}

    def put(self, path: str, node: str, body: object, timeout: float = 10) -> requests.Response:
        data = body if isinstance(body, (bytes, str)) else json.dumps(body)
        return requests.put(self.url + path, data=data, headers=self.auth(node), timeout=timeout)


@pytest.fixture
def service_process(tmp_path: Path) -> Iterator[ServiceProcess]:
    service = ServiceProcess(tmp_path)
    service.start()
    yield service
    service.stop()


def inventory(gpus: object, **extra: object) -> dict:
    return {"cpu_milli": 32000, "memory_mib": 131072, "gpus": gpus, **extra}


def test_a_billion_gpu_inventory_is_refused_at_once_and_costs_no_memory(service_process):
    s = service_process
    ok = s.put("nodes/n1/inventory", "n1", inventory({"count": 2, "model": A100}))
    assert ok.status_code == 200, ok.text
    before = s.rss()
    started = time.monotonic()
    r = s.put("nodes/n1/inventory", "n1", inventory({"count": 1_000_000_000, "model": A100}), timeout=2)
    elapsed = time.monotonic() - started
    grown = s.rss() - before
    assert r.status_code == 400, r.text
    assert r.json()["message"] == ("invalid inventory: inventory.gpus.count is 1000000000; "
                                   "at most 64 GPUs per node")
    assert elapsed < 0.1, f"refused after {elapsed * 1000:.0f} ms"
    assert grown < 50 * MIB, f"the service grew by {grown / MIB:.0f} MiB"
    # the node's last good report still stands
    r = requests.get(s.url + "nodes/n1/inventory", headers=s.auth("n1"), timeout=5)
    assert len(r.json()["inventory"]["gpus"]) == 2


def _big_lists() -> dict[str, object]:
    """Inventories of (nearly) the largest body the endpoint reads, each with one list or
    map far past its bound: the worst a node's agent can send."""
    gpu = {"index": 0, "uuid": "GPU-x", "model": A100}
    link = [0, 1, 0]
    return {
        "gpus": inventory([gpu] * 15_000),
        "links": inventory([{**gpu, "index": i, "uuid": f"GPU-{i}"} for i in range(2)], links=[link] * 90_000),
        "mig": inventory([{**gpu, "mig": [{"profile": "1g.10gb"}] * 40_000}]),
        "labels": inventory([gpu], labels={f"k{i}": "v" for i in range(60_000)}),
        "empty lists": b"[" + b"[]," * 340_000 + b"[]]",
    }


@pytest.mark.parametrize("what", list(_big_lists()))
def test_the_largest_reports_are_refused_without_building_them(service_process, what):
    s = service_process
    body = _big_lists()[what]
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    assert 512 * 1024 < len(data) <= MIB  # under the endpoint's limit: parsed, then refused
    before = s.rss()
    r = s.put("nodes/n1/inventory", "n1", data)
    assert r.status_code == 400, r.text
    assert len(r.text) < 1000  # the answer does not echo the body
    grown = s.rss() - before
    assert grown < 100 * MIB, f"{what}: the service grew by {grown / MIB:.0f} MiB"
    too_big = s.put("nodes/n1/inventory", "n1", data + b" " * MIB)
    assert too_big.status_code == 413, too_big.text
    assert s.rss() - before < 100 * MIB
