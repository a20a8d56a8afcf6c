"""Issue 48.9: a gpupool service that refuses to start leaves nothing running.

JupyterHub starts configurable-http-proxy in a session of its own and stops it in its clean-up;
when a managed service exits during the hub's start, JupyterHub 6 calls ``exit(1)`` without that
clean-up. Each refused start of the gpupool service (a bad setting, a ledger schema older than
the code) left the proxy running on the hub's port. The example configuration runs the proxy as
``gpupool-proxy``, which the kernel stops when its hub exits. The hub here is the example
configuration, unchanged but for the wrapper's ports and paths and the one refused setting.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil
import pytest

from gpupool_hub.ledger.migrations import _baseline, legacy
from gpupool_hub.ledger.database import make_engine
from .conftest import ExampleHub, wait_for

pytestmark = pytest.mark.integration


def old_ledger(path: Path) -> None:
    """An SQLite ledger as the releases before Alembic left it (schema version 9)."""
    import sqlalchemy as sa

    engine = make_engine(f"sqlite:///{path}")
    try:
        with engine.begin() as conn:
            legacy.upgrade_to_9(conn, _baseline(), 0, up_to=9)
            conn.execute(sa.text("INSERT INTO gpupool_meta (key, value) VALUES ('schema_version', '9')"))
    finally:
        engine.dispose()


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


@pytest.mark.parametrize("why", ["a bad setting", "an old ledger"])
def test_a_refused_service_start_leaves_no_proxy_running(tmp_path, why):
    workdir = tmp_path / "hub"
    workdir.mkdir()
    extra = 'c.GPUPool.placement_policy = "nonsense"\n' if why == "a bad setting" else ""
    if why == "an old ledger":
        old_ledger(workdir / "gpupool.sqlite")
    hub = ExampleHub(workdir, debit_interval=5, debit_check_interval=1, extra=extra)
    proxy_pid = None
    try:
        with pytest.raises(RuntimeError, match="exited with 1"):
            hub.start(timeout=90, stop_on_failure=False)  # what it leaves is what this test looks at
        log = hub.log_path.read_text()
        assert "Service gpupool exited with status 1" in log, log[-3000:]
        assert ("unknown policy 'nonsense'" if why == "a bad setting" else "gpupool-service upgrade-db") in log
        proxy_pid = int((workdir / "proxy.pid").read_text())
        wait_for(lambda: not alive(proxy_pid), 30, f"the hub's proxy (pid {proxy_pid}) to exit with its hub")
    finally:
        if proxy_pid is not None and alive(proxy_pid):  # the test owns what its hub left behind
            os.kill(proxy_pid, signal.SIGKILL)
        hub.stop()
