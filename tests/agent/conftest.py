"""Real processes under real (test) Unix users, and a fake NVML that lists them.

The tests run as root here, so they create two system accounts for the
session and start sleepers as them: attribution must name the right user, and
enforcement must stop the right processes and nothing else. Everything is
torn down (processes killed, accounts removed) at the end.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import psutil
import pytest

from gpupool_hub.agent.servers import record_server
from tests.agent import fake_pynvml

USERS = ("gpupool-t1", "gpupool-t2")
PYTHON = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable

A100 = "NVIDIA A100-SXM4-80GB"
GIB = 1 << 30

SLEEPER = textwrap.dedent("""
    import signal, sys, time
    if "--ignore-term" in sys.argv:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    print("ready", flush=True)
    time.sleep(600)
""")

SERVER = textwrap.dedent("""
    # Stands in for jupyterhub-singleuser: starts one kernel and stays up.
    import subprocess, sys, time
    kernel = subprocess.Popen([sys.executable, sys.argv[1], "-f", sys.argv[2]], stdout=subprocess.DEVNULL)
    print(kernel.pid, flush=True)
    time.sleep(600)
""")


@pytest.fixture(scope="session")
def test_users() -> Iterator[dict[str, int]]:
    """Two throw-away accounts (uids in the system range, < 1000): name -> uid."""
    if os.geteuid() != 0:
        pytest.skip("needs root to create test users and run processes as them")
    useradd, userdel = shutil.which("useradd"), shutil.which("userdel")
    if not useradd or not userdel:
        pytest.skip("useradd/userdel not available")
    created = []
    for name in USERS:
        try:
            pwd.getpwnam(name)
        except KeyError:
            subprocess.run([useradd, "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", name],
                           check=True, capture_output=True)
            created.append(name)
    uids = {name: pwd.getpwnam(name).pw_uid for name in USERS}
    yield uids
    for name in created:
        # userdel refuses while the account owns a process; a grandchild may still be exiting.
        for _ in range(50):
            left = [p for p in psutil.process_iter(["uids"]) if p.info["uids"] and p.info["uids"].real == uids[name]]
            for p in left:
                try:
                    p.kill()
                except psutil.Error:
                    pass
            if subprocess.run([userdel, name], check=False, capture_output=True).returncode == 0:
                break
            time.sleep(0.1)


@pytest.fixture(scope="session")
def scripts_dir() -> Iterator[Path]:
    """World-readable scripts named like the real programs (the agent looks at command lines)."""
    d = Path(tempfile.mkdtemp(prefix="gpupool-agent-"))
    d.chmod(0o755)
    (d / "sleeper.py").write_text(SLEEPER)
    (d / "ipykernel_launcher.py").write_text(SLEEPER)
    (d / "jupyterhub-singleuser").write_text(SERVER)
    (d / "jupyter-lab").write_text(SERVER)  # the same stand-in, under the name a user can give any script
    for f in d.iterdir():
        f.chmod(stat.S_IRUSR | stat.S_IWUSR | stat.S_IRGRP | stat.S_IROTH)
    yield d
    shutil.rmtree(d, ignore_errors=True)


class Procs:
    """Starts real processes as given users; kills whatever is left at teardown."""

    def __init__(self, scripts: Path) -> None:
        self.scripts = scripts
        self.popens: list[subprocess.Popen] = []

    def _start(self, user: str | None, argv: list[str]) -> subprocess.Popen:
        kw: dict[str, Any] = {"cwd": "/", "stdout": subprocess.PIPE, "stderr": subprocess.DEVNULL,
                              "start_new_session": True, "text": True}
        if user is not None:
            kw.update(user=user, group=pwd.getpwnam(user).pw_gid, extra_groups=[])
        p = subprocess.Popen(argv, **kw)
        self.popens.append(p)
        return p

    def sleeper(self, user: str | None, *, ignore_term: bool = False) -> subprocess.Popen:
        """A plain GPU-less sleeper; ``user=None`` runs it as the test runner (root)."""
        p = self._start(user, [PYTHON, str(self.scripts / "sleeper.py")] + (["--ignore-term"] if ignore_term else []))
        assert p.stdout.readline().strip() == "ready"  # signal handler installed before we go on
        return p

    def orphan_kernel(self, user: str) -> subprocess.Popen:
        """A kernel whose server is gone: its parent is the test runner, not a Jupyter server."""
        p = self._start(user, [PYTHON, str(self.scripts / "ipykernel_launcher.py"),
                               "-f", "/tmp/runtime/kernel-0rphan.json"])
        assert p.stdout.readline().strip() == "ready"
        return p

    def server_with_kernel(self, user: str, records: Path | None = None, *,
                           program: str = "jupyterhub-singleuser") -> tuple[subprocess.Popen, int]:
        """A stand-in single-user server and the pid of the kernel it started. With ``records``
        the server is recorded there as ``gpupool-localprocess`` records the servers it starts;
        without, it is a process that only looks like a server (anyone may name a script so)."""
        p = self._start(user, [PYTHON, str(self.scripts / program),
                               str(self.scripts / "ipykernel_launcher.py"), "/tmp/runtime/kernel-1234-abcd.json"])
        kernel = int(p.stdout.readline())
        _wait_cmdline(kernel, "kernel-1234-abcd.json")
        if records is not None:
            record_server(str(records), p.pid, user)
        return p, kernel

    def cleanup(self) -> None:
        for p in self.popens:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                pass
            if p.stdout:
                p.stdout.close()


def _wait_cmdline(pid: int, needle: str, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if any(needle in a for a in psutil.Process(pid).cmdline()):
                return
        except psutil.Error:
            pass
        time.sleep(0.05)
    raise AssertionError(f"pid {pid} never showed {needle!r} in its command line")


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.fixture
def server_records(tmp_path: Path) -> Path:
    """A directory for the hub's records of its servers, root's and 0755 like /run/gpupool-servers."""
    d = tmp_path / "gpupool-servers"
    d.mkdir(mode=0o755)
    return d


@pytest.fixture
def procs(test_users: dict[str, int], scripts_dir: Path) -> Iterator[Procs]:
    p = Procs(scripts_dir)
    yield p
    p.cleanup()


def gpu(i: int, *, model: str = A100, processes: list[dict[str, Any]] | None = None, **kw: Any) -> dict[str, Any]:
    """One row of the fake NVML table."""
    row = {"uuid": f"GPU-{i:04d}-fake", "name": model, "memory_total": 80 * GIB, "memory_used": 2 * GIB,
           "utilization": 40 + i, "bus_id": f"00000000:{0x10 + i:02X}:00.0", "processes": processes or []}
    row.update(kw)
    return row


@pytest.fixture
def make_nvml() -> Callable[..., fake_pynvml.FakeNVML]:
    def make(gpus: list[dict[str, Any]], **table: Any) -> fake_pynvml.FakeNVML:
        return fake_pynvml.load({"gpus": gpus, **table})

    return make


@pytest.fixture
def agents():
    """Agent processes a test started (each in its own session); killed as groups at the end."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
