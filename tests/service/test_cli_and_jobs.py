"""The admin CLI and the scheduled jobs against a real hub running the service."""

from __future__ import annotations

import csv
import io
import json
import os
import re
import subprocess
import sys

import pytest

from tests.fixtures.hub import wait_for

pytestmark = pytest.mark.integration

EXTRA = """
c.GPUPoolService.replenish_interval = 0.5
c.GPUPoolService.reconcile_interval = 0.5
c.GPUPoolService.reconcile_grace = 5
c.GPUPool.group_credits = {"faculty": {"initial": 500}}
c.JupyterHub.load_groups = {"faculty": {"users": ["prof"]}}
"""


@pytest.fixture(scope="module")
def hub(tmp_path_factory):
    from tests.fixtures.hub import Hub, require_hub_binaries

    require_hub_binaries()
    hub = Hub(tmp_path_factory.mktemp("hub"), extra_config=EXTRA)
    hub.start()
    hub.create_user("admin")
    hub.admin_token = hub.token_for("admin")
    yield hub
    hub.stop()


def gpupool(hub, *args, token=None):
    env = {**os.environ, "GPUPOOL_URL": hub.service_api, "GPUPOOL_TOKEN": token or hub.admin_token}
    return subprocess.run([sys.executable, "-m", "gpupool_hub.cli", *args], env=env, capture_output=True,
                          text=True, timeout=60)


def test_replenish_gives_new_hub_users_their_grant_by_group(hub):
    hub.create_user("dana")  # prof exists from the start, in faculty (load_groups)

    def balances():
        users = {u["name"]: u["balance"] for u in hub.service("GET", "/users", hub.admin_token).json()["users"]}
        return users if {"dana", "prof"} <= set(users) else None

    users = wait_for(balances)
    assert users["dana"] == "100.000" and users["prof"] == "500.000"


def test_cli_balance_grant_history_verify_export(hub):
    hub.create_user("erin")
    r = gpupool(hub, "grant", "erin", "12.5", "--reason", "thesis deadline", "--idempotency-key", "erin-1")
    assert r.returncode == 0, r.stderr
    assert "granted: 12.500 to erin" in r.stdout
    again = gpupool(hub, "grant", "erin", "12.5", "--reason", "thesis deadline", "--idempotency-key", "erin-1")
    assert again.returncode == 0 and "already granted" in again.stdout
    r = gpupool(hub, "balance", "erin")
    assert r.returncode == 0 and "erin: 112.500 tokens" in r.stdout
    r = gpupool(hub, "balance")
    assert r.returncode == 0
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["user", "balance"] and any(l.split() == ["erin", "112.500"] for l in lines)
    r = gpupool(hub, "history", "erin")
    assert r.returncode == 0 and "thesis deadline" in r.stdout.splitlines()[2]  # newest first
    r = gpupool(hub, "verify")
    assert r.returncode == 0 and r.stdout.startswith("ok:")
    r = gpupool(hub, "export", "--csv")
    assert r.returncode == 0
    rows = list(csv.DictReader(io.StringIO(r.stdout)))
    assert any(row["user"] == "erin" and row["amount"] == "12.500" for row in rows)


def test_cli_exit_codes(hub):
    assert gpupool(hub, "grant", "erin", "abc", "--reason", "x").returncode == 1
    assert gpupool(hub, "balance", "nobody-at-all").returncode == 1
    assert gpupool(hub, "grant", "erin", "5").returncode == 2  # --reason missing
    hub.create_user("frank")
    r = gpupool(hub, "pool", token=hub.token_for("frank"))
    assert r.returncode == 1 and "403" in r.stderr
    env = {**os.environ, "GPUPOOL_URL": "http://127.0.0.1:9/nothing", "GPUPOOL_TOKEN": "x"}
    r = subprocess.run([sys.executable, "-m", "gpupool_hub.cli", "verify"], env=env, capture_output=True, text=True)
    assert r.returncode == 4 and "cannot reach" in r.stderr


def test_cli_pool_shows_holders(hub):
    hub.create_user("gina")
    r = hub.service("POST", "/allocations", hub.spawner_token,
                    json={"user": "gina", "server": "", "request": {"gpus": 1, "models": ["RTX A6000"]}})
    assert r.status_code == 201
    out = gpupool(hub, "pool").stdout
    assert any("gina/-" in line and "NVIDIA RTX A6000" in line for line in out.splitlines())


def test_reconcile_releases_allocations_whose_server_is_gone(hub):
    hub.create_user("hank")
    r = hub.service("POST", "/allocations", hub.spawner_token,
                    json={"user": "hank", "server": "ghost", "request": {"gpus": 1}})
    alloc = r.json()["allocation"]["id"]

    def released():
        a = hub.service("GET", f"/allocations/{alloc}", hub.spawner_token).json()["allocation"]
        return a["released_at"]

    assert wait_for(released)
    history = hub.service("GET", "/allocations", hub.spawner_token).json()["allocations"]
    assert alloc not in {a["id"] for a in history}


def test_cli_limit_past_the_apis_page_gives_what_was_asked(hub):
    """``gpupool history --limit 600`` answered HTTP 400 (the API serves at most 500 entries a
    request): the CLI now asks page by page and shows the newest 600, or all there are."""
    from concurrent.futures import ThreadPoolExecutor

    from gpupool_hub.cli import page_max

    hub.create_user("ivy")
    most = page_max("/users/{name}/history")  # 500: openapi.json's maximum, which the service enforces

    def grant(n: int) -> None:
        r = hub.service("POST", "/users/ivy/grant", hub.admin_token, json={"amount": "0.001", "reason": f"g{n}"},
                        headers={"Idempotency-Key": f"ivy-{n}"})
        assert r.status_code in (200, 201), r.text

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(grant, range(most + 20)))
    # ivy's entries: her initial grant (and any daily credit) and these: more than a page, fewer than asked
    r = gpupool(hub, "history", "ivy", "--limit", "600")
    assert r.returncode == 0, r.stderr
    assert len(r.stdout.splitlines()[2:]) > most
    assert {int(n) for n in re.findall(r"\bg(\d+)$", r.stdout, re.M)} == set(range(most + 20))
    assert "initial grant" in r.stdout
    r = gpupool(hub, "--json", "history", "ivy", "--limit", "510")
    assert r.returncode == 0, r.stderr
    entries = json.loads(r.stdout)
    assert len(entries) == 510 and len({e["id"] for e in entries}) == 510  # no entry twice across pages
    r = gpupool(hub, "audit", "--limit", "600")
    assert r.returncode == 0, r.stderr
    for bad in ("0", "-5", "many"):
        r = gpupool(hub, "history", "ivy", "--limit", bad)
        assert r.returncode == 2 and "--limit: must be a whole number of at least 1" in r.stderr, r.stderr
