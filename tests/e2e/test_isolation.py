"""Item 12.6: the example configuration isolates users from each other and from the service.

A real hub from ``jupyterhub_config.example.py`` (through the e2e wrapper, in
a folder other users may enter, as a hub's working directory usually is),
the real service and its database, and two real Unix users made for the test
(``useradd`` as root). Each user's server runs as that user
(``gpupool-localprocess``); the server is ``probe_server.py``, which runs
with the server's identity, environment and home what code in a kernel
would. Bob's server holds a GPU and writes a file at start. Code in alice's
server tries to read the service's and the hub's environment (the service's
API token), bob's file and the ledger file, and calls the service API with
the server's own token: to read bob's balance and history, list the
allocations and release bob's. All of it must fail; her own balance works.
With ``gpupool-simple`` (the example before this change) alice's code ran as
the hub's user and all of it succeeded.
"""

from __future__ import annotations

import pwd
from pathlib import Path

import pytest
import requests

from tests.spawner.conftest import service_pid

from .conftest import q, spawn

pytestmark = pytest.mark.integration


def test_12_6_alices_server_cannot_read_the_service_token_bobs_files_or_bobs_balance(
        shared_dir, unix_users, probe_cmd, example_hub_factory):
    # (fixtures in this order: the hub stops before the users and its folder are removed)
    alice, bob = unix_users("alice"), unix_users("bob")
    hub = example_hub_factory(workdir=shared_dir / "hub", server_cmd=probe_cmd)
    spawn(hub, bob, {"profile": "1x2080"})
    spawn(hub, alice, {"profile": "cpu"})
    [bob_alloc] = [a for a in hub.service("GET", "/allocations", hub.spawner_token).json()["allocations"]
                   if a["user"] == bob]
    secret = Path(pwd.getpwnam(bob).pw_dir) / "secret.txt"  # written by bob's server at start
    assert secret.stat().st_uid == pwd.getpwnam(bob).pw_uid
    service = service_pid(hub)
    # what is there to steal: as root, the test itself sees the token in the service's environment
    assert b"JUPYTERHUB_API_TOKEN=" in Path(f"/proc/{service}/environ").read_bytes()
    ledger = hub.workdir / "gpupool.sqlite"
    assert ledger.is_file()

    reads = [f"/proc/{service}/environ", f"/proc/{hub.proc.pid}/environ", str(secret), str(ledger)]
    calls = [f"GET:/users/{q(bob)}", f"GET:/users/{q(bob)}/history", "GET:/allocations",
             f"DELETE:/allocations/{bob_alloc['id']}", "GET:/me"]
    r = requests.get(f"{hub.url}/user/{q(alice)}/probe", params={"read": reads, "api": calls}, timeout=60)
    assert r.status_code == 200, r.text
    report = r.json()
    assert report["uid"] == pwd.getpwnam(alice).pw_uid, report  # her code runs as her, not as the hub
    for path in reads:
        assert report["read"][path] == {"ok": False, "error": "PermissionError"}, (path, report["read"][path])
    for call in calls[:-1]:
        assert report["api"][call]["status"] == 403, (call, report["api"][call])
    me = report["api"]["GET:/me"]
    assert me["status"] == 200 and f'"user": "{alice}"' in me["body"], me  # her token works, for her

    # the same with her own API token from the hub
    token = hub.token_for(alice)
    for path in (f"/users/{q(bob)}", f"/users/{q(bob)}/history", "/allocations"):
        assert hub.service("GET", path, token).status_code == 403, path
    assert hub.service("DELETE", f"/allocations/{bob_alloc['id']}", token).status_code == 403
    # bob still holds his GPU
    held = [a["id"] for a in hub.service("GET", "/allocations", hub.spawner_token).json()["allocations"]]
    assert bob_alloc["id"] in held
