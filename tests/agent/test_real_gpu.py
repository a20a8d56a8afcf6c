"""The node agent on a REAL NVIDIA GPU (issue 23 item 6), marked ``gpu``: they run where NVML
finds a GPU and PyTorch has CUDA, and skip elsewhere, CI included (tests/conftest.py does not
turn a ``gpu`` skip into a failure). ``pytest -m gpu`` collects them; scripts/agent-gpu-check.sh
runs them as root with throw-away users (``GPUPOOL_GPU_CHECK_USERS=a,b``); without that
variable they use the suite's test users (root) or skip.

What each check shows with the agent's own code, never a fake:

- a process running matrix products and one that only holds memory are told apart within two
  polls (``nvmlDeviceGetProcessUtilization`` per process, added up per user);
- the memory guard stops a process over its share's limit and leaves one within its share alone;
- where an MPS control daemon runs, a pinned device memory limit refuses a larger allocation.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytestmark = pytest.mark.gpu

TORCH_PYTHON = os.environ.get("TORCH_PYTHON", sys.executable)
WORKER = """
import sys, time, torch
mode, mib = sys.argv[1], int(sys.argv[2])
x = torch.empty(mib << 20, dtype=torch.uint8, device="cuda:0")
a = torch.randn(4096, 4096, device="cuda:0")
torch.cuda.synchronize()
print("ready", flush=True)
end = time.time() + 600
while time.time() < end:
    if mode == "busy":
        a = (a @ a).clamp_(-1, 1)   # matrix products, all the time
        torch.cuda.synchronize()
    else:
        time.sleep(0.5)             # holds its memory, computes nothing
"""


def _gpu_or_skip() -> None:
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            count = pynvml.nvmlDeviceGetCount()
        finally:
            pynvml.nvmlShutdown()
    except Exception as e:  # no driver, no library, no device
        pytest.skip(f"no NVIDIA GPU here (NVML: {e})")
    if not count:
        pytest.skip("no NVIDIA GPU here (NVML lists none)")
    probe = subprocess.run([TORCH_PYTHON, "-c", "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"],
                           capture_output=True, timeout=120)
    if probe.returncode:
        pytest.skip(f"PyTorch with CUDA is not available to {TORCH_PYTHON} (set TORCH_PYTHON)")


@pytest.fixture(scope="module")
def gpu_users(request: pytest.FixtureRequest) -> tuple[str, str]:
    """Two Unix users to run the CUDA processes as: the script's throw-away ones, else the suite's."""
    _gpu_or_skip()
    named = [u for u in os.environ.get("GPUPOOL_GPU_CHECK_USERS", "").split(",") if u]
    if len(named) >= 2:
        return named[0], named[1]
    if os.geteuid() != 0:
        pytest.skip("needs root (to run the CUDA processes as other users) or GPUPOOL_GPU_CHECK_USERS")
    users = list(request.getfixturevalue("test_users"))  # the suite's accounts, made on first use
    return users[0], users[1]


@pytest.fixture
def cuda(request: pytest.FixtureRequest) -> Iterator:
    """Starts workers as a user, each in its own session; kills every one at the end.

    The worker script lives in a folder of its own directly under the temporary folder:
    pytest's ``tmp_path`` sits below ``/tmp/pytest-of-root`` (mode 0700), which the
    other users cannot pass through (seen on a real H100: "Permission denied")."""
    if not os.environ.get("GPUPOOL_GPU_CHECK_USERS"):
        request.getfixturevalue("test_users")
    folder = Path(tempfile.mkdtemp(prefix="gpupool-gpu-"))
    folder.chmod(0o755)
    script = folder / "worker.py"
    script.write_text(WORKER)
    script.chmod(0o644)
    started: list[subprocess.Popen] = []

    def start(user: str, mode: str, mib: int, env: dict[str, str] | None = None) -> subprocess.Popen:
        p = subprocess.Popen([TORCH_PYTHON, str(script), mode, str(mib)], user=user,
                             group=pwd.getpwnam(user).pw_gid, extra_groups=[], cwd="/", start_new_session=True,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             env={**os.environ, **(env or {})})
        started.append(p)
        return p

    try:
        yield start
    finally:
        for p in started:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(30)
        shutil.rmtree(folder, ignore_errors=True)


def ready(p: subprocess.Popen) -> None:
    """Waits for the worker's "ready" line (its CUDA context and memory are in place)."""
    line = p.stdout.readline() if p.stdout else ""
    if "ready" not in line:
        raise AssertionError(f"worker {p.pid} did not start: {p.stderr.read() if p.stderr else ''}")


def nvml_session():
    """The real pynvml with the agent's own session and discovery."""
    import pynvml

    from gpupool_hub.agent.nvml import discover, nvml_session as session

    return pynvml, session, discover


def test_busy_and_memory_holding_processes_are_told_apart_within_two_polls(gpu_users, cuda):
    from gpupool_hub.agent.attribution import take_snapshot

    busy_user, idle_user = gpu_users
    busy, holder = cuda(busy_user, "busy", 256), cuda(idle_user, "hold", 256)
    ready(busy), ready(holder)
    pynvml, session, discover = nvml_session()
    with session(pynvml):
        _, gpus = discover(pynvml, "check")
        last_seen: dict[str, int] = {}
        figures: dict = {}
        for _ in range(2):  # two polls, a second apart
            time.sleep(1.0)
            snap = take_snapshot(pynvml, gpus, last_seen)
            figures = snap.gpus[0].users
    assert figures.get(busy_user) is not None and figures[busy_user] >= 0.05, figures
    assert figures.get(idle_user) is not None and figures[idle_user] < 0.05, figures


def test_the_guard_stops_an_over_limit_process_and_leaves_one_within_its_share(gpu_users, cuda):
    from gpupool_hub.agent.attribution import take_snapshot
    from gpupool_hub.agent.enforce import Enforcer
    from gpupool_hub.agent.memguard import MemoryGuard, Share

    over_user, within_user = gpu_users
    over, within = cuda(over_user, "hold", 2048), cuda(within_user, "hold", 256)
    ready(over), ready(within)
    pynvml, session, discover = nvml_session()
    with session(pynvml):
        _, gpus = discover(pynvml, "check")
        uuid = gpus[0].uuid
        # the smallest share (0.001 of the GPU: 80 MiB of 80 GiB) against 2 GiB; half the GPU against 256 MiB
        shares = [Share(uuid, over_user, "", 1), Share(uuid, within_user, "", 500)]
        guard = MemoryGuard(Enforcer(min_uid=1, grace=5), grace=0)
        snap = take_snapshot(pynvml, gpus)
        now = time.time()
        warned = guard.observe(snap, shares, now)
        assert [w.user for w in warned] == [over_user], warned
        guard.accepted(now)
        done = guard.enforce(snap, now + 1)
    assert {a.pid for _, a in done} >= {over.pid}, done
    over.wait(30)
    assert within.poll() is None  # within its share: untouched


def test_an_mps_memory_cap_refuses_the_allocation(gpu_users, cuda):
    pipe = Path(os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps"))
    if not shutil.which("nvidia-cuda-mps-control") or not (pipe / "control").exists():
        pytest.skip("no NVIDIA MPS control daemon runs here (nvidia-cuda-mps-control -d)")
    capped = cuda(gpu_users[0], "hold", 1024, env={"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=256M",
                                                   "CUDA_MPS_PIPE_DIRECTORY": str(pipe)})
    capped.wait(120)
    assert capped.returncode != 0
    assert "out of memory" in (capped.stderr.read() if capped.stderr else "").lower()
