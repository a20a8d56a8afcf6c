"""Busy-machine mode: ``GPUPOOL_TEST_LOAD=N`` runs N busy CPU processes beside the tests marked ``loaded``.

A production hub host is rarely idle, and the races that only show when the
hub, its service and the proxy get less CPU than they would like (a restart
answered 503, a demo that will not stop) hide on a quiet developer machine.
With ``GPUPOOL_TEST_LOAD=2`` (as ``.ci/run`` sets it) every module that holds a
test marked ``loaded`` runs, from its first fixture to its last teardown, with
two busy-loop processes beside it, each in a process group of its
own and at the same priority as the suite; they are killed when the module
ends. Unset or 0: no load, nothing changes.

Under pytest-xdist the N busy processes are shared out among the workers
(each worker starts N / workers of them, at least one), so the machine holds
about N when every worker is in a loaded module, as in a serial run, and each
loaded test still runs beside N other busy processes most of the time.

Mark the tests that start hubs, restart them, run the demo or a Slurm
cluster: ``pytestmark = [pytest.mark.integration, pytest.mark.loaded]``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

ENV = "GPUPOOL_TEST_LOAD"

#: a busy loop that also ends when pytest (argv[1], given before the exec: it may die meanwhile)
#: is gone, killed before its teardown ran
SPIN = "import os, sys\nparent = int(sys.argv[1])\nwhile os.getppid() == parent: pass"


def load_from_env() -> int:
    """The number of busy processes asked for; a clear error for anything but a whole number ≥ 0."""
    raw = os.environ.get(ENV, "").strip()
    if raw == "":
        return 0
    try:
        n = int(raw)
    except ValueError:
        n = -1
    if n < 0:
        raise pytest.UsageError(f"{ENV}={raw!r}: expected a whole number of busy CPU processes (0 for none)")
    return n


def _cmdline(pid: int) -> bytes:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return b""


class CpuLoad:
    """N processes that spin on a core each, until :meth:`stop` (or until pytest dies)."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        for _ in range(self.n):
            self.procs.append(subprocess.Popen(
                [sys.executable, "-c", SPIN, str(os.getpid())],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                start_new_session=True,
            ))
        for proc in self.procs:  # running before the module's first hub starts, not a moment after
            deadline = time.monotonic() + 10
            while SPIN.encode() not in _cmdline(proc.pid) and proc.poll() is None and time.monotonic() < deadline:
                time.sleep(0.01)

    def stop(self) -> None:
        for proc in self.procs:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for proc in self.procs:
            proc.wait(10)
        self.procs = []


def per_worker(n: int, config: pytest.Config) -> int:
    """This process's share of the N busy processes: all of them in a serial run.

    The worker count comes from xdist's own ``workerinput``, not the environment,
    which a pytest run started by a test inherits."""
    workers = int(getattr(config, "workerinput", {}).get("workercount", 1))
    return max(1, -(-n // max(1, workers)))


def pytest_configure(config: pytest.Config) -> None:
    load_from_env()  # a bad value stops the run before any test, naming the variable


def pytest_report_header(config: pytest.Config) -> str | None:
    n = load_from_env()
    return f"{ENV}={n}: {n} busy CPU processes beside the tests marked 'loaded'" if n else None


@pytest.fixture(scope="module", autouse=True)
def cpu_load(request: pytest.FixtureRequest) -> Iterator[CpuLoad | None]:
    """Module-scoped and autouse, so it starts before the module's own hubs and clusters and stops after them."""
    n = load_from_env()
    items = [item for item in request.session.items if getattr(item, "module", None) is request.module]
    if n == 0 or not any(item.get_closest_marker("loaded") for item in items):
        yield None
        return
    load = CpuLoad(per_worker(n, request.config))
    load.start()
    try:
        yield load
    finally:
        load.stop()
