"""``gpupool queue`` and ``GET models`` from an in-process service over HTTP (real SQLite ledger,
a stub token checker) while nodes are kept whole for a configured 8-GPU profile (issue 50)."""

from __future__ import annotations

import asyncio
import json
import os
import sys
from datetime import datetime, timezone

import pytest
from tornado.httpclient import AsyncHTTPClient
from tornado.httpserver import HTTPServer
from tornado.testing import bind_unused_port

from gpupool_hub.profiles import parse_profiles
from gpupool_hub.service.common.context import ServiceContext
from gpupool_hub.service.webapp import make_app
from gpupool_hub.spawner.form import form_context
from tests.fixtures.manager import Clock
from tests.service.openapi import check
from tests.service.test_queue import R3090, SIXTEEN_EIGHTS, admit, manager

PREFIX = "/services/gpupool/"
ADMIN = "custom:gpupool:admin"


class StubHubAuth:
    async def user_for_token(self, token, sync=False):
        return {"admin-token": {"kind": "user", "name": "ada", "scopes": [ADMIN]}}.get(token)


@pytest.fixture
async def service(tmp_path):
    """16 nodes of 8 GPUs, profiles of 1, 4 and 8 GPUs; 12 nodes full, so the last four are kept."""
    m = manager(tmp_path, SIXTEEN_EIGHTS, clock=Clock(datetime.now(timezone.utc)))  # the card reads the wall clock
    profiles = parse_profiles([{"slug": "one", "gpus": 1}, {"slug": "four", "gpus": 4}, {"slug": "node", "gpus": 8}])
    m.inventory.expect_profiles(profiles)
    held = [admit(m, f"user{i % 40}", server=f"s{i}") for i in range(12 * 8)]
    sock, port = bind_unused_port()
    server = HTTPServer(make_app(ServiceContext(manager=m, hub_auth=StubHubAuth(), prefix=PREFIX,
                                                admin_scope=ADMIN)))
    server.add_sockets([sock])
    server.url = f"http://127.0.0.1:{port}{PREFIX}api/v1"
    server.kept = sorted(ns.name for ns in m.pool.nodes if ns.n_full == 8)
    server.held, server.profiles = held, profiles
    yield server
    server.stop()


async def gpupool(service, *args):
    """The admin CLI as a user runs it; the service answers on this test's event loop meanwhile."""
    env = {**os.environ, "GPUPOOL_URL": service.url, "GPUPOOL_TOKEN": "admin-token"}
    proc = await asyncio.create_subprocess_exec(sys.executable, "-m", "gpupool_hub.cli", *args, env=env,
                                                stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
                                                start_new_session=True)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    return proc.returncode, out.decode(), err.decode()


async def test_gpupool_queue_names_the_kept_nodes_also_when_nobody_waits(service):
    """Nobody waits yet, but a 1-GPU spawn would: the admin sees which nodes are kept and why."""
    assert len(service.kept) == 4
    rc, out, err = await gpupool(service, "queue")
    assert rc == 0, err
    assert out.strip() == "nobody is waiting for GPUs"
    assert f"kept whole for profiles of several GPUs: {', '.join(service.kept)}" in err


async def test_get_models_gives_each_profile_what_is_kept_from_it_and_what_is_left_open(service):
    resp = await AsyncHTTPClient().fetch(f"{service.url}/models", headers={"Authorization": "token admin-token"})
    body = json.loads(resp.body)
    check("Models", body)
    per = {p["slug"]: (p["kept_whole"], p["open_block"]) for p in body["profiles"]}
    assert per == {"one": ({R3090: 32}, {}), "four": ({R3090: 32}, {R3090: 0}), "node": ({}, {})}
    assert body["models"][0]["largest_whole_block"] == 8  # on a kept node: not the four-GPU card's figure
    # nobody waits, yet a 1-GPU spawn would: the card says so, and for how long, before anyone asks
    assert body["models"][0]["eta_source"] == "typical"
    one = form_context(service.profiles, None, {"balance": "1000.000"}, body)["profiles"][0]
    assert (one.full, one.free) == (True, "full — none waiting, about 4.0 h "
                                          "(32 free GPUs kept whole for servers of more GPUs)")
