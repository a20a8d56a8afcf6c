"""Issue 37.6: who may read the agent's /metrics (every user's GPU use and memory on the node).

Real agent processes (``python -m gpupool_hub.agent``, as deployed; this machine has no GPU,
so NVML fails every tick, which does not matter here) and their real HTTP server:

* by default it needs a token even on 127.0.0.1 (users' servers run on the node), and does not start
  without one (issue 48.5); serving without one is the explicit ``metrics_without_token``, on
  127.0.0.1 only: nothing answers on the machine's other address;
* listening for the network it needs a token: a scrape without it, with a wrong one or
  another scheme gets 401 and ``WWW-Authenticate: Bearer``; with it, the metrics;
* an address other machines reach without a token, or a token file others may read, stop
  the agent at start-up with a message naming the setting;
* the admin guide's scrape job (``authorization: credentials_file``), run by a real
  Prometheus, scrapes it; the same job without the credentials is refused.
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import psutil
import pytest
import requests

from gpupool_hub.agent.scrape import is_loopback
from tests.e2e.conftest import system_python
from tests.fixtures.hub import wait_for
from tests.fixtures.ports import free_port
from tests.fixtures.prometheus import PrometheusServer

REPO = Path(__file__).resolve().parents[2]
TOKEN = "0f6c1c5e-metrics-token"


def start_agent(tmp_path: Path, name: str, *args: str) -> subprocess.Popen[str]:
    log = (tmp_path / f"{name}.log").open("w")
    env = {**os.environ, "PYTHONPATH": str(REPO), "GPUPOOL_SERVICE_URL": "", "GPUPOOL_AGENT_TOKEN": ""}
    return subprocess.Popen([sys.executable, "-m", "gpupool_hub.agent", "--node", "n1", "--interval", "1", *args],
                            stdout=log, stderr=subprocess.STDOUT, text=True, cwd=tmp_path, env=env,
                            start_new_session=True)


def other_address() -> str | None:
    """This machine's first IPv4 address that is not loopback (``hostname -I``), if it has one."""
    for addresses in psutil.net_if_addrs().values():
        for a in addresses:
            if a.family == socket.AF_INET and not is_loopback(a.address):
                return a.address
    return None


def scrape(host: str, port: int, authorization: str | None = None) -> tuple[int, dict[str, str], str]:
    headers = {"Authorization": authorization} if authorization else {}
    try:
        with urllib.request.urlopen(urllib.request.Request(f"http://{host}:{port}/metrics", headers=headers),
                                    timeout=5) as resp:
            return resp.status, dict(resp.headers), resp.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode()


def answers(host: str, port: int) -> bool:
    try:
        return scrape(host, port)[0] in (200, 401)
    except OSError:
        return False


def token_file(tmp_path: Path, text: str = TOKEN + "\n", mode: int = 0o600) -> Path:
    path = tmp_path / "metrics.token"
    path.write_text(text)
    path.chmod(mode)
    return path


def test_48_5_by_default_the_agent_does_not_serve_metrics_without_a_token(tmp_path, agents):
    """Issue 48.5: on 127.0.0.1 without a token, ``nobody`` (or any user's server on the node) read alice's and
    bob's GPU series. By default the agent does not start without a token, and says both ways out."""
    port = free_port()
    agent = start_agent(tmp_path, "agent", "--port", str(port))
    agents.append(agent)
    assert agent.wait(60) != 0
    log = (tmp_path / "agent.log").read_text()
    assert log.startswith("gpupool-agent: c.GPUPoolAgent.metrics_token_file is not set: every process on this "
                          "node, users' servers and kernels included, could read every user's GPU use"), log
    assert "c.GPUPoolAgent.metrics_without_token = True" in log, log
    assert not answers("127.0.0.1", port)  # it never served


def test_48_5_a_local_scrape_needs_the_token_too(tmp_path, agents):
    """The default address with a token: a process on the node itself gets 401 without it, even as ``nobody``."""
    port = free_port()
    agents.append(start_agent(tmp_path, "agent", "--port", str(port),
                              f"--GPUPoolAgent.metrics_token_file={token_file(tmp_path)}"))
    wait_for(lambda: answers("127.0.0.1", port), 60, "the agent to serve /metrics on 127.0.0.1")
    assert scrape("127.0.0.1", port)[0] == 401
    if os.geteuid() == 0:  # the probe: a scrape by ``nobody`` on the node
        as_nobody = subprocess.run(
            ["setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups", system_python(), "-c",
             "import urllib.request, urllib.error\ntry:\n urllib.request.urlopen("
             f"'http://127.0.0.1:{port}/metrics')\nexcept urllib.error.HTTPError as e:\n print(e.code)"],
            capture_output=True, text=True, timeout=60)
        assert as_nobody.stdout.strip() == "401", (as_nobody.stdout, as_nobody.stderr)
    status, _, body = scrape("127.0.0.1", port, f"Bearer {TOKEN}")
    assert status == 200 and "gpupool_agent_nvml_up" in body


def test_37_6_without_a_token_by_choice_metrics_are_served_to_this_machine_only(tmp_path, agents):
    port = free_port()
    agent = start_agent(tmp_path, "agent", "--port", str(port), "--GPUPoolAgent.metrics_without_token=True")
    agents.append(agent)
    wait_for(lambda: answers("127.0.0.1", port), 60, "the agent to serve /metrics on 127.0.0.1")
    status, _, body = scrape("127.0.0.1", port)
    assert status == 200 and "gpupool_agent_nvml_up" in body  # the admin chose: every local process may read
    other = other_address()
    if other is None:
        pytest.skip("this machine has no address but loopback to try from")
    with pytest.raises(ConnectionRefusedError):  # nothing listens there
        socket.create_connection((other, port), timeout=5).close()
    assert agent.poll() is None


def test_37_6_a_scrape_needs_the_bearer_token(tmp_path, agents):
    port = free_port()
    agent = start_agent(tmp_path, "agent", "--port", str(port), "--GPUPoolAgent.metrics_address=0.0.0.0",
                        f"--GPUPoolAgent.metrics_token_file={token_file(tmp_path)}")
    agents.append(agent)
    wait_for(lambda: answers("127.0.0.1", port), 60, "the agent to serve /metrics")
    hosts = ["127.0.0.1"] + [a for a in [other_address()] if a]
    for host in hosts:
        for authorization in (None, "Bearer wrong-token", f"Bearer {TOKEN}x", f"Basic {TOKEN}", TOKEN):
            status, headers, body = scrape(host, port, authorization)
            assert status == 401, (host, authorization, status)
            assert headers["WWW-Authenticate"].startswith("Bearer"), headers
            assert "gpupool_agent" not in body  # not one series
        for authorization in (f"Bearer {TOKEN}", f"bearer {TOKEN}"):  # the scheme is case-insensitive
            status, _, body = scrape(host, port, authorization)
            assert status == 200 and "gpupool_agent_nvml_up" in body, (host, authorization, status)


@pytest.mark.parametrize("setup,message", [
    (lambda tmp: [], "c.GPUPoolAgent.metrics_address '0.0.0.0' can be reached from other machines, and "
                     "c.GPUPoolAgent.metrics_token_file is not set"),
    (lambda tmp: [f"--GPUPoolAgent.metrics_token_file={token_file(tmp, mode=0o644)}"],
     "may be read by group or others (mode 0644)"),
    (lambda tmp: [f"--GPUPoolAgent.metrics_token_file={token_file(tmp, text=chr(10))}"],
     "must hold the token on one line, found 0 lines"),
    (lambda tmp: [f"--GPUPoolAgent.metrics_token_file={tmp / 'missing.token'}"], "cannot be read: No such file"),
    # choosing no token is for a loopback address only
    (lambda tmp: ["--GPUPoolAgent.metrics_without_token=True"],
     "c.GPUPoolAgent.metrics_address '0.0.0.0' can be reached from other machines"),
], ids=["no token", "token readable by others", "empty token", "no token file", "no token by choice"])
def test_37_6_metrics_open_to_other_machines_without_a_usable_token_stop_the_agent(tmp_path, agents, setup, message):
    port = free_port()
    agent = start_agent(tmp_path, "agent", "--port", str(port), "--GPUPoolAgent.metrics_address=0.0.0.0",
                        *setup(tmp_path))
    agents.append(agent)
    assert agent.wait(60) != 0
    log = (tmp_path / "agent.log").read_text()
    assert log.startswith("gpupool-agent: c.GPUPoolAgent.metrics_") and message in log, log
    assert not answers("127.0.0.1", port)  # it never served


@pytest.mark.parametrize("address,loopback", [
    ("127.0.0.1", True), ("127.0.0.53", True), ("::1", True), ("localhost", True),
    ("0.0.0.0", False), ("", False), ("::", False), ("192.0.2.7", False), ("no-such-host.invalid", False),
])
def test_what_counts_as_this_machine_only(address, loopback):
    assert is_loopback(address) is loopback


def admin_guide_agent_scrape_job() -> str:
    """The scrape configuration the admin guide gives for the node agents, as written there."""
    text = (REPO / "docs" / "admin-guide.md").read_text()
    section = text[text.index("### With the node agent"):]
    return re.search(r"```yaml\n(.*?)```", section, re.S).group(1)


def test_37_6_the_admin_guides_scrape_job_scrapes_the_agent_with_its_token(tmp_path, agents):
    binary = shutil.which("prometheus")
    if not binary:
        pytest.skip("prometheus not installed (Debian package 'prometheus')")
    port = free_port()
    token = token_file(tmp_path)
    agents.append(start_agent(tmp_path, "agent", "--port", str(port), "--GPUPoolAgent.metrics_address=0.0.0.0",
                              f"--GPUPoolAgent.metrics_token_file={token}"))
    wait_for(lambda: answers("127.0.0.1", port), 60, "the agent to serve /metrics")
    job = admin_guide_agent_scrape_job()
    credentials = re.search(r"credentials_file: (\S+)", job).group(1)
    job = re.sub(r"targets: \[.*\]", f'targets: ["127.0.0.1:{port}"]', job)
    job = job.replace(credentials, str(token)).replace("scrape_interval: 60s", "scrape_interval: 1s")
    assert "job_name: gpupool-agent" in job and "authorization:" in job
    # the same job without its credentials, for contrast
    bare = re.sub(r"\n    authorization:\n      credentials_file: .*", "", job).replace(
        "job_name: gpupool-agent", "job_name: no-token")
    (tmp_path / "prom").mkdir()
    server = PrometheusServer(binary, tmp_path / "prom", free_port())
    server.config.write_text(job + bare.split("scrape_configs:\n", 1)[1])
    server.start()
    try:
        def up(job_name: str) -> str | None:
            r = requests.get(f"{server.url}/api/v1/query", params={"query": f'up{{job="{job_name}"}}'}, timeout=5)
            result = r.json()["data"]["result"]
            return result[0]["value"][1] if result else None

        wait_for(lambda: up("gpupool-agent") == "1" and up("no-token") == "0", 60,
                 "Prometheus to scrape the agent with its token, and be refused without")
        r = requests.get(f"{server.url}/api/v1/targets", timeout=5).json()["data"]["activeTargets"]
        refused = next(t for t in r if t["labels"]["job"] == "no-token")
        assert "401" in refused["lastError"], refused
    finally:
        server.stop()
