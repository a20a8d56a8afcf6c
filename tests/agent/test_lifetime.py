"""The node agent's life: one agent per node, a prompt stop, its port taken back from an older one.

* Two agents with the node's token: the first one to call holds the node; the
  second is refused with 409, names the holder, and stops. When the holder
  stops it gives the node up and a successor is served at once; a holder that
  went silent is replaced after ``agent_timeout``.
* A real agent process stops within 5 s of SIGTERM, even with a call to the
  service hanging.
* A second agent started on the first one's metrics port stops the old one and
  takes the port over; a port held by anything else stops the agent at once,
  with a message naming that process.

The process tests run ``python -m gpupool_hub.agent`` as it is deployed; this
machine has no GPU, so its NVML fails every tick, which these tests do not need.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from gpupool_hub.agent.lifecycle import ANOTHER_AGENT_EXIT
from gpupool_hub.service.core.agent_leases import INSTANCE_HEADER
from tests.agent.test_service import TOKENS, Service, make_agent, two_gpus
from tests.fixtures.hub import wait_for
from tests.fixtures.ports import free_port

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
async def service(tmp_path):
    s = Service(tmp_path)
    yield s
    s.stop()


async def test_a_second_agent_for_a_node_is_refused_names_the_first_and_stops(service, make_nvml):
    first = make_agent(make_nvml(two_gpus((), ())), service.url)
    second = make_agent(make_nvml(two_gpus((), ())), service.url)
    assert (await first.tick()).service_ok

    result = await second.tick()
    assert result.service_ok is False and second.exit_status == ANOTHER_AGENT_EXIT
    assert "n1' is served by another agent" in result.service_error
    assert first.instance in result.service_error  # the message names the holder
    assert (await first.tick()).service_ok  # the holder goes on as before

    # an admin's call (no instance) neither takes the node nor is refused
    code, _ = await service.call("GET", "nodes/n1/enforce", "admin-token")
    assert code == 200


async def test_a_stopping_agent_gives_its_node_up_and_its_successor_is_served_at_once(service, make_nvml):
    first = make_agent(make_nvml(two_gpus((), ())), service.url, interval=0.05)
    running = asyncio.ensure_future(first.run())
    await wait_until(lambda: service.manager.agent_leases.holder("n1") is not None)
    first.stop()
    await asyncio.wait_for(running, 10)
    assert service.manager.agent_leases.holder("n1") is None

    successor = make_agent(make_nvml(two_gpus((), ())), service.url)
    assert (await successor.tick()).service_ok
    assert service.manager.agent_leases.holder("n1").instance == successor.instance


async def test_a_silent_holder_is_replaced_after_agent_timeout(service, make_nvml):
    leases = service.manager.agent_leases
    now = [datetime(2026, 11, 26, 12, 0, tzinfo=timezone.utc)]
    leases.clock = lambda: now[0]
    silent = make_agent(make_nvml(two_gpus((), ())), service.url)
    assert (await silent.tick()).service_ok
    now[0] += timedelta(seconds=leases.timeout - 1)
    assert (await make_agent(make_nvml(two_gpus((), ())), service.url).tick()).service_ok is False
    now[0] += timedelta(seconds=1)  # the holder has been silent for agent_timeout
    successor = make_agent(make_nvml(two_gpus((), ())), service.url)
    assert (await successor.tick()).service_ok
    assert leases.holder("n1").instance == successor.instance


@pytest.mark.parametrize("instance", ["x" * 201, "tab\there", "nön-ascii"])
async def test_a_bad_instance_header_is_refused(service, instance):
    resp = await fetch(service, "GET", "nodes/n1/enforce", {INSTANCE_HEADER: instance})
    assert resp.code == 400 and INSTANCE_HEADER in resp.body.decode()
    assert service.manager.agent_leases.holder("n1") is None


# ---------------------------------------------------------------- real agent processes


def start_agent(tmp_path: Path, name: str, *args: str, service_url: str = "") -> subprocess.Popen[str]:
    log = (tmp_path / f"{name}.log").open("w")
    env = {**os.environ, "PYTHONPATH": str(REPO), "GPUPOOL_AGENT_TOKEN": TOKENS["n1"],
           "GPUPOOL_SERVICE_URL": service_url}
    # these tests are about the agent's lifetime, not who reads its metrics: the probe of /metrics brings no
    # token, so the agent serves without one (loopback only) by the explicit setting (issue 48.5)
    return subprocess.Popen([sys.executable, "-m", "gpupool_hub.agent", "--node", "n1",
                             "--GPUPoolAgent.metrics_without_token=True", *args],
                            stdout=log, stderr=subprocess.STDOUT, text=True, cwd=tmp_path, env=env,
                            start_new_session=True)


def serves_metrics(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as resp:
            return b"gpupool_agent_nvml_up" in resp.read()
    except OSError:
        return False


def test_an_agent_stops_within_5_s_of_sigterm_with_a_service_call_hanging(tmp_path, agents):
    callers: list[socket.socket] = []
    with socket.socket() as silent:  # a "service" that takes connections and never answers
        silent.bind(("127.0.0.1", free_port()))
        silent.listen(16)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/services/gpupool/"
        port = free_port()
        agent = start_agent(tmp_path, "agent", "--port", str(port), "--interval", "0.2",
                            "--GPUPoolAgent.request_timeout=60", service_url=url)
        agents.append(agent)
        wait_for(lambda: serves_metrics(port), 60, "the agent to serve /metrics")
        wait_for(lambda: silent_has_a_caller(silent, callers), 30, "the agent's call to hang on the silent service")
        agent.send_signal(signal.SIGTERM)
        started = time.monotonic()
        agent.wait(30)
        took = time.monotonic() - started
        for conn in callers:
            conn.close()
    assert took <= 5.0, f"the agent took {took:.1f} s to stop"
    assert agent.returncode == 0, (tmp_path / "agent.log").read_text()


def silent_has_a_caller(server: socket.socket, callers: list[socket.socket]) -> bool:
    server.settimeout(0.2)
    try:
        conn, _ = server.accept()
    except OSError:
        return False
    callers.append(conn)  # left open and unanswered
    return True


def test_a_new_agent_takes_its_port_over_from_an_older_one(tmp_path, agents):
    port = free_port()
    old = start_agent(tmp_path, "old", "--port", str(port), "--interval", "0.5")
    agents.append(old)
    wait_for(lambda: serves_metrics(port), 60, "the first agent to serve /metrics")
    new = start_agent(tmp_path, "new", "--port", str(port), "--interval", "0.5")
    agents.append(new)
    old.wait(30)  # told to stop by the new one
    wait_for(lambda: serves_metrics(port), 60, "the new agent to serve /metrics")
    assert new.poll() is None
    log = (tmp_path / "new.log").read_text()
    assert f"port {port} is held by an older gpupool agent PID {old.pid}" in log, log


def test_a_port_held_by_another_program_stops_the_agent_naming_it(tmp_path, agents):
    port = free_port()
    holder = subprocess.Popen([sys.executable, "-m", "http.server", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, cwd=tmp_path,
                              start_new_session=True)
    agents.append(holder)
    wait_for(lambda: port_taken(port), 30, "http.server to listen")
    agent = start_agent(tmp_path, "agent", "--port", str(port))
    agents.append(agent)
    assert agent.wait(60) != 0
    log = (tmp_path / "agent.log").read_text()
    assert f"gpupool-agent: port {port} on 127.0.0.1 is in use by PID {holder.pid}" in log, log
    assert "http.server" in log and holder.poll() is None  # named, and left alone


def port_taken(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


# ---------------------------------------------------------------- helpers


async def wait_until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def fetch(service, method, path, headers):
    from tornado.httpclient import AsyncHTTPClient

    return await AsyncHTTPClient().fetch(service.url + "api/v1/" + path, method=method, raise_error=False,
                                         headers={"Authorization": f"token {TOKENS['n1']}", **headers})
