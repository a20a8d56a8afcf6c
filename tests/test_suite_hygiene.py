"""The suite cleans up after itself, and checks that it did (issue 24, item 2).

* A hub that dies without cleaning up (kill -9) leaves its proxy, its service and
  the user servers running in sessions of their own; ``Hub.stop`` still stops
  every one of them, by PID.
* The end-of-run check (tests/fixtures/processes.py) fails a run that leaves a
  process behind and names it, and passes a run that does not. It is run here
  on a tiny suite of its own, in a pytest subprocess.
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

from tests.fixtures import processes
from tests.fixtures.hub import wait_for

REPO = Path(__file__).resolve().parents[1]

LEAKY = '''
import subprocess
from pathlib import Path


def test_leaks_two_sleeps(tmp_path):
    # one in this test's folder, dropped without a stop
    kept = subprocess.Popen(["sleep", "311"], cwd=tmp_path, start_new_session=True)
    # one orphaned at once, outside any test folder: found only as pytest's (adopted) descendant
    out = subprocess.run(["bash", "-c", "cd / && { setsid sleep 312 </dev/null >/dev/null 2>&1 & echo $!; }"],
                         capture_output=True, text=True, check=True)
    Path(__file__).with_name("pids").write_text(f"{kept.pid} {out.stdout.strip()}")
'''

TIDY = '''
import subprocess


def test_stops_what_it_starts(tmp_path):
    proc = subprocess.Popen(["sleep", "313"], cwd=tmp_path, start_new_session=True)
    proc.terminate()
    proc.wait(10)
'''


def run_suite(tmp_path: Path, source: str, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    """Run a one-file suite with the processes plugin, as a pytest subprocess in a group of its own."""
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_it.py").write_text(textwrap.dedent(source))
    env = {**os.environ, "PYTHONPATH": str(REPO), **env}
    proc = subprocess.Popen([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                             "-p", "tests.fixtures.processes", "--rootdir", str(suite),
                             "--basetemp", str(tmp_path / "basetemp"), *args, str(suite)],
                            cwd=suite, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    out, _ = processes.communicate_or_kill(proc, 120)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, "")


#: a serial run, and one on pytest-xdist workers as scripts/test.sh runs the suite
RUNS = pytest.mark.parametrize("args", [(), ("-n", "2")], ids=["serial", "xdist"])


@RUNS
def test_a_run_that_leaves_processes_fails_and_names_them(tmp_path, args):
    result = run_suite(tmp_path, LEAKY, *args, GPUPOOL_TEST_END_GRACE="1")
    pids = [int(p) for p in (tmp_path / "suite" / "pids").read_text().split()]
    table = processes.process_table()
    try:
        assert result.returncode == 1, result.stdout
        assert "1 passed, 1 error" in result.stdout, result.stdout
        assert "processes left running" in result.stdout
        for pid, command in zip(pids, ("sleep 311", "sleep 312")):
            line = next((line for line in result.stdout.splitlines() if line.startswith(f"pid {pid} ")), None)
            assert line is not None and line.endswith(command), f"pid {pid} not named:\n{result.stdout}"
        assert re.search(rf"pid {pids[0]} \(parent \d+, test dir (popen-gw\d+/)?test_leaks_two_sleeps0\): sleep 311",
                         result.stdout), result.stdout
        # and the check stopped them
        wait_for(lambda: not any(processes.alive(table[pid]) for pid in pids if pid in table), 10,
                 "the leaked sleeps to be stopped")
    finally:
        processes.stop_processes([table[pid] for pid in pids if pid in table], grace=1)


@RUNS
def test_a_run_that_stops_its_processes_passes(tmp_path, args):
    result = run_suite(tmp_path, TIDY, *args)
    assert result.returncode == 0, result.stdout
    assert "left running" not in result.stdout and "1 passed" in result.stdout


def test_hub_stop_stops_the_proxy_service_and_servers_of_a_hub_killed_with_sigkill(hub_factory, tmp_path):
    from tests.spawner.conftest import spawner_config, start_ok

    hub = hub_factory(spawner_config(tmp_path / "hub0"))
    server = start_ok(hub, "alice", {"profile": "cpu"})["pid"]
    below = processes.descendants(hub.proc.pid, processes.process_table())
    commands = {pid: " ".join(processes.cmdline(pid)) for pid in below}
    assert server in below
    assert any("configurable-http-proxy" in c for c in commands.values()), commands
    assert any("gpupool_hub.service" in c for c in commands.values()), commands

    os.kill(hub.proc.pid, signal.SIGKILL)  # no clean-up by the hub
    hub.proc.wait(10)
    # the orphans stay in the suite (pytest is their subreaper), not with PID 1
    orphans = [p for p in below.values() if processes.alive(p)]
    assert orphans and all(processes._stat(p.pid).ppid != 1 for p in orphans)

    hub.stop()
    left = {p.pid: commands[p.pid] for p in below.values() if processes.alive(p)}
    assert not left, f"still running after Hub.stop: {left}"
    assert not processes.processes_in(hub.workdir)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_CHILD_SUBREAPER is Linux's")
def test_pytest_is_the_subreaper_of_its_processes():
    out = subprocess.run(["bash", "-c", "sleep 314 </dev/null >/dev/null 2>&1 & echo $!"], capture_output=True,
                         text=True, check=True)
    orphan = processes._stat(int(out.stdout))
    try:
        assert orphan is not None and orphan.ppid == os.getpid()
    finally:
        processes.stop_processes([orphan], grace=1)
    # and its zombie is reaped, so a check by PID sees it gone
    wait_for(lambda: processes._stat(orphan.pid) is None, 5, "the orphan's zombie to be reaped")


def test_parallel_workers_never_pick_the_same_port(monkeypatch):
    """Two xdist workers draw test ports from disjoint shares, outside the kernel's
    ephemeral range: a port one worker picked and has not bound yet is never another's."""
    from tests.fixtures import ports

    lo, hi = ports.ephemeral_range()
    picked = {}
    for worker in ("gw0", "gw1"):
        monkeypatch.setenv("PYTEST_XDIST_WORKER", worker)
        monkeypatch.setenv("PYTEST_XDIST_WORKER_COUNT", "2")
        picked[worker] = {ports.free_port() for _ in range(200)}
    assert not picked["gw0"] & picked["gw1"]
    assert {p % 2 for p in picked["gw0"]} != {p % 2 for p in picked["gw1"]}
    assert not any(lo <= p <= hi for p in picked["gw0"] | picked["gw1"])
