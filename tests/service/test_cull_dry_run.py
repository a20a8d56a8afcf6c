"""Dry-run culling: everything is decided and audited, nothing is done."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from tests.fixtures.hub import wait_for
from tests.spawner.conftest import set_balance, spawner_hub, start_ok, user_model

pytestmark = pytest.mark.integration

EXTRA = """
c.Culler.dry_run = True
c.Culler.interval = 0.5
c.Culler.grace_period = 1
c.Culler.pressure_allocated_fraction = 0.0
c.Culler.exempt_groups = {"staff"}
c.JupyterHub.load_groups = {"staff": {"users": ["sam"]}}
c.GPUPoolService.reconcile_interval = 3600
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    yield from spawner_hub(tmp_path_factory, "dryhub", EXTRA)


def audit(hub, user):
    """What culling did to ``user`` (the grants that set up each balance are audited too: left out)."""
    events = hub.service("GET", f"/audit?user={user}", hub.tester_token).json()["events"]
    return [e for e in events if e["action"] != "grant"][::-1]


def test_dry_run_audits_but_stops_warns_and_releases_nothing(hub):
    for user in ("floored", "negative", "sam"):
        hub.create_user(user)
        start_ok(hub, user, {"profile": "quarter"})
    set_balance(hub, "floored", "-10")
    set_balance(hub, "negative", "-1")
    set_balance(hub, "sam", "-50")  # in an exempt group

    events = wait_for(lambda: [e for e in audit(hub, "floored") if e["action"] == "stop_server"], 20,
                      "a dry-run stop in the audit log")
    assert events[0]["dry_run"] is True and "floor" in events[0]["reason"]
    actions = wait_for(lambda: [e["action"] for e in audit(hub, "negative") if e["action"] == "cull_kernels"]
                       and [e["action"] for e in audit(hub, "negative")], 20, "a dry-run kernel cull")
    assert actions[:2] == ["warn", "cull_kernels"]
    assert all(e["dry_run"] for e in audit(hub, "negative"))
    time.sleep(1.5)
    # nothing was done: servers run, GPUs held, users see no warning
    for user in ("floored", "negative", "sam"):
        assert "" in user_model(hub, user)["servers"], user
        me = hub.service("GET", f"/users/{user}", hub.spawner_token).json()
        assert me["allocations"] and me["cull_warning"] is None, user
    # the exempt group member is not even considered
    assert audit(hub, "sam") == []


def test_gpupool_audit_command_lists_what_culling_did(hub):
    """`gpupool audit` (issue 18.6): the admin reads the audit log from the command line."""
    hub.create_user("floored2")
    start_ok(hub, "floored2", {"profile": "quarter"})
    set_balance(hub, "floored2", "-10")
    wait_for(lambda: audit(hub, "floored2"), 20, "floored2's dry-run stop")
    env = {**os.environ, "GPUPOOL_URL": hub.service_api, "GPUPOOL_TOKEN": hub.tester_token}
    run = subprocess.run([sys.executable, "-m", "gpupool_hub.cli", "audit", "--user", "floored2", "--action",
                          "stop_server"], env=env, capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    lines = [line for line in run.stdout.splitlines() if "floored2" in line]
    assert lines and "stop_server (dry run)" in lines[0] and "floor" in lines[0]
    bad = subprocess.run([sys.executable, "-m", "gpupool_hub.cli", "audit", "--action", "explode"], env=env,
                         capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "invalid choice" in bad.stderr
