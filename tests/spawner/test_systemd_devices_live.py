"""Issue 40.2: gpupool-systemd's device cgroup, in a real transient unit where systemd is PID 1.

``test_systemd_units.py`` proves the ``systemd-run`` command line: ``DevicePolicy=closed`` and
a ``DeviceAllow=`` entry for exactly the allocated GPUs. This runs that pair of properties in a
real unit: two character devices of NVIDIA's major 195 are made with mknod in a temporary
folder (no driver behind them), the unit may open the first, and a probe in the unit opens
both. The allowed one fails with ENXIO ("no such device": the device cgroup let the open
through), the other with EPERM (the device cgroup refused it).

It needs systemd as PID 1 (and root, for mknod and a system unit). Where that is missing
(containers, CI machines whose PID 1 is something else) it skips with the reason, and the
skip stays a skip under ``GPUPOOL_REQUIRE_INTEGRATION=1``: the ``systemd_pid1`` marker is
exempt there, as ``gpu`` is (tests/conftest.py). Starting a second systemd to get one is no
option: its boot-time clean-up would delete the machine's temporary files.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.systemd_pid1]

NVIDIA_MAJOR = 195

PROBE = """\
import errno, json, os, sys
found = {}
for path in sys.argv[1:]:
    try:
        os.close(os.open(path, os.O_RDWR))
        found[path] = "OK"
    except OSError as e:
        found[path] = errno.errorcode[e.errno]
print(json.dumps(found))
"""


def missing() -> str:
    """Why this machine cannot run the test ('' when it can)."""
    try:
        pid1 = Path("/proc/1/comm").read_text().strip()
    except OSError as e:
        return f"cannot read /proc/1/comm ({e})"
    if pid1 != "systemd":
        return f"PID 1 is {pid1!r}, not systemd: no real transient unit can run here"
    if shutil.which("systemd-run") is None:
        return "systemd is PID 1 but systemd-run is not on PATH"
    if os.geteuid() != 0:
        return "needs root (mknod of the GPU devices, a system unit)"
    return ""


@pytest.fixture
def gpu_devices(tmp_path) -> list[str]:
    reason = missing()
    if reason:
        pytest.skip(reason)
    folder = tmp_path / "dev"
    folder.mkdir()
    folder.chmod(0o755)
    tmp_path.chmod(0o755)
    paths = []
    for minor in (0, 1):
        path = folder / f"nvidia{minor}"
        os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(NVIDIA_MAJOR, minor))
        paths.append(str(path))
    return paths


def test_a_closed_unit_opens_only_the_device_it_is_allowed(gpu_devices):
    allowed, other = gpu_devices
    argv = ["systemd-run", "--quiet", "--wait", "--pipe", "--collect",
            "-p", "DevicePolicy=closed", "-p", f"DeviceAllow={allowed} rw",
            sys.executable, "-c", PROBE, allowed, other]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, f"{argv}: {done.returncode}\n{done.stdout}\n{done.stderr}"
    found = json.loads(done.stdout.strip().splitlines()[-1])
    assert found == {allowed: "ENXIO", other: "EPERM"}, found
