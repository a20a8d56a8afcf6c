"""The service's life: one runner of the periodic jobs per ledger, a prompt stop on
SIGTERM, and a port held by an orphaned service of the same pool taken over.

Real service processes (``python -m gpupool_hub.service``) on one SQLite ledger;
each test starts them in their own process groups and stops the groups.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
import requests

from gpupool_hub.ledger import Ledger
from tests.fixtures.hub import free_port, wait_for

TOKEN = "lifetime-test-token"  # the service's (unreachable) hub token
SPAWNER_TOKEN = "lifetime-spawner-secret-0123456789"  # may read /metrics
NODES = [{"name": "n1", "cpu_milli": 8000, "memory_mib": 32768, "gpus": {"count": 2, "model": "NVIDIA RTX A6000"}}]


class Service:
    def __init__(self, config: Path, log: Path, port: int, extra_env: dict[str, str] | None = None) -> None:
        self.port = port
        self.log_path = log
        env = {**os.environ, "JUPYTERHUB_API_URL": f"http://127.0.0.1:{free_port()}/hub/api",
               "JUPYTERHUB_API_TOKEN": TOKEN, "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{port}",
               **(extra_env or {})}
        self._log = open(log, "ab")
        self.proc = subprocess.Popen([sys.executable, "-m", "gpupool_hub.service", "--config", str(config)],
                                     env=env, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/services/gpupool/api/v1"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def up(self) -> bool:
        try:
            return requests.get(f"{self.url}/", timeout=2).status_code == 200
        except requests.RequestException:
            return False

    def job_runs(self) -> dict[str, float]:
        r = requests.get(f"http://127.0.0.1:{self.port}/services/gpupool/metrics",
                         headers={"Authorization": f"token {SPAWNER_TOKEN}"}, timeout=5)
        r.raise_for_status()
        return {m.group(1): float(m.group(2)) for m in
                re.finditer(r'^gpupool_job_duration_seconds_count\{job="([^"]+)"\} (\S+)$', r.text, re.M)}

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait(10)
        self._log.close()


@pytest.fixture
def services(tmp_path):
    started: list[Service] = []
    db = tmp_path / "gpupool.sqlite"
    # three hours of (empty) history, charged minute by minute: the debit job has work
    Ledger(f"sqlite:///{db}").epoch(datetime.now(timezone.utc).replace(second=0, microsecond=0) - timedelta(hours=3))
    config = tmp_path / "jupyterhub_config.py"
    config.write_text(textwrap.dedent(f"""
        c = get_config()  # noqa
        c.GPUPool.prices = {{"RTX A6000": 4}}
        c.GPUPool.nodes = {NODES!r}
        c.GPUPool.db_url = "sqlite:///{db}"
        c.GPUPoolService.debit_interval = 60
        c.GPUPoolService.debit_check_interval = 0.5
        c.GPUPoolService.reconcile_interval = 0.5
        c.GPUPoolService.queue_interval = 0.5
        c.GPUPoolService.jobs_lease_ttl = 3
        c.GPUPoolService.spawner_token = "{SPAWNER_TOKEN}"
    """))

    def start(port: int | None = None, name: str | None = None, **env: str) -> Service:
        service = Service(config, tmp_path / f"{name or f'service{len(started)}'}.log", port or free_port(), env)
        started.append(service)
        wait_for(lambda: service.up() or service.proc.poll() is not None, 60, "the service to answer")
        return service

    start.config = config  # type: ignore[attr-defined]
    start.db = db  # type: ignore[attr-defined]
    yield start
    for service in started:
        service.stop()


LEASED = ("debit", "reconcile", "queue", "replenish")


def test_two_services_on_one_ledger_exactly_one_runs_the_periodic_jobs(services):
    first, second = services(), services()
    assert first.up() and second.up()
    wait_for(lambda: "now runs the periodic jobs" in first.log() + second.log(), 20, "a jobs lease holder")
    wait_for(lambda: "run in another service" in first.log() + second.log(), 20, "the other service to wait")
    holder, standby = (first, second) if "now runs the periodic jobs" in first.log() else (second, first)
    assert "now runs the periodic jobs" not in standby.log()
    wait_for(lambda: all(holder.job_runs().get(job, 0) >= 2 for job in ("debit", "reconcile", "queue")),
             30, "the holder's jobs to run")
    standby_runs = standby.job_runs()
    assert all(standby_runs.get(job, 0) == 0 for job in LEASED), standby_runs
    assert standby_runs.get("lease", 0) >= 1  # it keeps asking
    # each copies the SQLite write-ahead log that its own writes leave (not a leased job)
    assert standby_runs.get("checkpoint", 0) >= 1 and holder.job_runs().get("checkpoint", 0) >= 1

    # the holder dies without a word: the other takes the jobs over at its next renewal
    os.killpg(holder.proc.pid, signal.SIGKILL)
    holder.proc.wait(10)
    wait_for(lambda: "now runs the periodic jobs" in standby.log(), 10, "the standby to take the jobs over")
    wait_for(lambda: standby.job_runs().get("debit", 0) >= 1, 10, "the standby's first debit run")
    assert Ledger(f"sqlite:///{services.db}").verify().ok


def test_sigterm_stops_the_service_within_5_s_and_frees_the_lease_at_once(services):
    first = services()
    wait_for(lambda: "now runs the periodic jobs" in first.log(), 20, "the lease")
    os.kill(first.proc.pid, signal.SIGTERM)
    started = time.monotonic()
    first.proc.wait(10)
    assert time.monotonic() - started <= 5, first.log()[-2000:]
    assert "jobs lease released" in first.log()
    second = services()
    wait_for(lambda: "now runs the periodic jobs" in second.log(), 5, "the successor to take the lease")


def test_a_port_held_by_another_program_stops_the_service_naming_its_pid(services, tmp_path):
    port = free_port()
    blocker = subprocess.Popen([sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        wait_for(lambda: _answers(port), 20, "the blocker to listen")
        service = services(port=port)
        assert service.proc.wait(30) != 0
        assert f"port {port}" in service.log() and f"PID {blocker.pid}" in service.log(), service.log()[-2000:]
    finally:
        os.killpg(blocker.pid, signal.SIGKILL)
        blocker.wait(10)


def test_an_orphaned_service_of_the_same_pool_is_stopped_and_its_port_taken_over(services):
    # An orphan: a service of this configuration whose parent is not a hub (here: pytest,
    # standing for the init process that adopts a dead hub's children).
    port = free_port()
    orphan = services(port=port, name="orphan")
    assert orphan.up()
    successor = services(port=port, name="successor")
    orphan.proc.wait(10)
    assert "orphaned gpupool service" in successor.log() and f"PID {orphan.proc.pid}" in successor.log()
    wait_for(successor.up, 10, "the successor to answer on the port")
    assert successor.proc.poll() is None


def _answers(port: int) -> bool:
    try:
        requests.get(f"http://127.0.0.1:{port}/", timeout=1)
        return True
    except requests.RequestException:
        return False
