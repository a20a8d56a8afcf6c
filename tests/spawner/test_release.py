"""The spawner's release outbox and abandon-by-key, against a stand-in service that is down, then up.

Item 12.7 (a spawn whose request's fate is unknown abandons its attempt by
key) and 12.10 (a release the service could not take is kept and sent with
the time the server stopped) at the level of the spawner and its HTTP calls.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from datetime import datetime, timezone
from typing import Any

import pytest
from tornado import web
from tornado.httpserver import HTTPServer

from gpupool_hub.spawner import GPUPoolRefused
from gpupool_hub.spawner.client import GPUPoolClient
from gpupool_hub.spawner.ends import ProcessEnd
from gpupool_hub.spawner.release import ATTEMPT_KEY, Release, ReleaseOutbox
from tests.spawner.test_units import make
from tests.fixtures.ports import free_port


class StandIn:
    """Records what reaches ``…/api/v1/allocations…``; answers releases with 200."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.calls: list[dict[str, Any]] = []
        self.server: HTTPServer | None = None

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/services/gpupool/api/v1"

    def start(self) -> None:
        calls = self.calls

        class Handler(web.RequestHandler):
            def delete(self, path: str) -> None:
                calls.append({"path": path, "args": {k: self.get_argument(k) for k in self.request.arguments}})
                self.finish({"allocation": None})

            def patch(self, path: str) -> None:
                calls.append({"path": path, "patch": json.loads(self.request.body)})
                self.finish({"allocation": None})

        app = web.Application([(r"/services/gpupool/api/v1/allocations/(.*)", Handler)])
        self.server = HTTPServer(app)
        self.server.listen(self.port, "127.0.0.1")

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()


async def wait_until(predicate, timeout: float = 10) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_12_10_an_undelivered_release_is_kept_and_sent_with_its_stop_time():
    service = StandIn(free_port())  # not started yet: the service is down
    outbox = ReleaseOutbox(retry_interval=0.1)
    stopped = datetime(2026, 11, 22, 10, 0, 5, tzinfo=timezone.utc)
    confirmed: list[str] = []
    release = Release(GPUPoolClient(service.api_url, "t", timeout=2), "alice", "", "server stopped",
                      allocation_id="a1", stopped_at=stopped, on_confirmed=lambda: confirmed.append("a1"))
    assert await outbox.send(release, wait=0.3) is False
    assert outbox.pending_for("alice", "") == [release] and not confirmed
    assert not await outbox.flush("alice", "", wait=0.2)  # a new spawn of this server waits for it
    service.start()  # the service is back: the outbox delivers without being asked again
    try:
        await wait_until(lambda: confirmed)
        assert await outbox.flush("alice", "", wait=1)
    finally:
        service.stop()
    [call] = service.calls
    assert call["path"] == "a1"
    assert call["args"] == {"reason": "server stopped", "at": "2026-11-22T10:00:05Z"}


async def test_12_7_a_spawn_that_gets_no_answer_abandons_its_attempt_by_key():
    service = StandIn(free_port())
    s = make(gpupool_api_url=service.api_url, request_timeout=1, release_retry_interval=0.1)
    s.user_options = {"profile": "2x3090"}
    with pytest.raises(GPUPoolRefused) as e:
        await s.start()  # the POST gets no answer: its fate is unknown
    assert e.value.reason == "gpupool_unreachable"
    key = s.get_state()[ATTEMPT_KEY]
    assert key and s.gpupool_attempt_abandoned
    service.start()
    try:
        await wait_until(lambda: service.calls)
    finally:
        service.stop()
    [call] = service.calls
    assert call["path"] == f"by-key/{key}" and call["args"]["reason"].startswith("spawn abandoned")


async def test_12_7_a_refusal_the_pool_answered_abandons_nothing():
    s = make()

    async def refused(profile, gpus):
        raise GPUPoolRefused("Not enough tokens", reason="insufficient_balance", status_code=403)

    s.gpupool_allocate = refused
    s.user_options = {"profile": "2x3090"}
    with pytest.raises(GPUPoolRefused):
        await s.start()
    assert not s.gpupool_attempt_abandoned


def test_each_spawn_attempt_has_its_own_key_in_the_state():
    s = make()
    first = s.gpupool_new_attempt()
    assert s.get_state()[ATTEMPT_KEY] == first
    assert s.gpupool_new_attempt() != first
    other = make()
    other.load_state({ATTEMPT_KEY: first, "gpupool_allocation": "a9"})
    assert other.gpupool_attempt_key == first and other.gpupool_allocation_id == "a9"


async def test_48_2_a_stopped_servers_gpus_go_back_only_once_its_process_is_gone():
    """Issue 48.2: a release made by a stop waits for the server's work to end: meanwhile the service is told
    the allocation is stopping (held, charged), the engine is asked again, a new spawn of the server is
    refused; once the process is gone the release goes out, its charge ending then."""
    service = StandIn(free_port())
    service.start()
    outbox = ReleaseOutbox(retry_interval=0.1)
    # a server that will not die of SIGTERM: the engine's stop "failed"
    proc = subprocess.Popen([sys.executable, "-c", "import signal, time\nsignal.signal(signal.SIGTERM, "
                             "signal.SIG_IGN)\nprint('up', flush=True)\ntime.sleep(600)"],
                            stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert proc.stdout.readline() == "up\n"
        end = ProcessEnd.of(proc.pid)
        end.stop_again = lambda: _term(proc.pid)  # the engine asked again, and again failing to stop it
        stopped = datetime(2026, 11, 22, 10, 0, 5, tzinfo=timezone.utc)
        release = Release(GPUPoolClient(service.api_url, "t", timeout=2), "alice", "", "server stopped",
                          allocation_id="a1", stopped_at=stopped, end=end)
        assert await outbox.send(release, wait=0.5) is False  # not released: the process runs
        await wait_until(lambda: any(c.get("patch") == {"stopping": True} for c in service.calls))
        assert not any("args" in c for c in service.calls)  # no DELETE yet
        assert not await outbox.flush("alice", "", wait=0.2)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        await wait_until(lambda: release.confirmed)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        service.stop()
    [delete] = [c for c in service.calls if "args" in c]
    assert delete["path"] == "a1" and delete["args"]["at"] > "2026-11-22T10:00:05Z"  # charged until seen gone


async def _term(pid: int) -> None:
    os.kill(pid, signal.SIGTERM)
