"""The spawner's service client: refusal mapping (a table over RefusalReason), the retry loop, HTTP paths."""

from __future__ import annotations

import asyncio
import html
import json
import socket

import pytest
from tornado import web
from tornado.httpserver import HTTPServer

from gpupool_hub.reasons import RefusalReason
from gpupool_hub.spawner import GPUPoolClient, GPUPoolRefused, ServiceError, ServiceUnavailable, SpawnFailure
from gpupool_hub.spawner.client import GENERIC_TITLE, allocation_refusal
from tests.spawner.test_units import dead_url, make

WHAT = "2 GPUs (RTX 3090)"


# ------------------------------------------------------------------ refusals


@pytest.mark.parametrize("reason", list(RefusalReason), ids=lambda r: r.value)
def test_a_known_refusal_takes_status_and_title_from_the_enum(reason):
    data = {"reason": reason.value, "message": "Not <now> & not here.", "details": {"free": 1},
            "retry_at": "2030-01-01T00:00:00Z"}
    e = allocation_refusal(409, data, WHAT)
    assert isinstance(e, GPUPoolRefused)
    assert e.status_code == reason.status and e.reason == reason.value and e.refusal is reason
    assert e.retryable is reason.retryable
    assert e.jupyterhub_message == "Not <now> & not here."
    assert e.jupyterhub_html_message == f"<strong>{html.escape(reason.title)}.</strong> Not &lt;now&gt; &amp; not here."
    assert e.details == {"free": 1} and e.retry_at == "2030-01-01T00:00:00Z"
    assert type(e.reason) is str  # JupyterHub puts it in a metrics label


@pytest.mark.parametrize(
    "data, reason",
    [
        ({"reason": "quota_exceeded", "message": "Your team is over quota."}, "quota_exceeded"),  # a newer service
        ({"message": "No."}, "refused"),
        ({}, "refused"),
    ],
)
def test_an_unknown_refusal_is_a_409_with_a_generic_title(data, reason):
    e = allocation_refusal(409, data, WHAT)
    assert e.status_code == 409 and e.reason == reason and e.refusal is None and not e.retryable
    assert e.jupyterhub_html_message.startswith(f"<strong>{GENERIC_TITLE}.</strong> ")
    assert e.jupyterhub_message == data.get("message", f"The GPU pool refused {WHAT}.")


@pytest.mark.parametrize(
    "status, data, code, reason, needle",
    [
        (401, {"message": "bad token"}, 500, SpawnFailure.AUTH, "misconfigured token"),
        (403, None, 500, SpawnFailure.AUTH, "misconfigured token"),
        (400, {"message": "gpus must be 1-16"}, 400, SpawnFailure.BAD_REQUEST,
         f"The GPU pool cannot place {WHAT}: gpus must be 1-16"),
        (500, {"message": "boom"}, 503, SpawnFailure.UNREACHABLE, "failed (HTTP 500)"),
        (201, {"allocated": False}, 503, SpawnFailure.UNREACHABLE, "failed (HTTP 201)"),
    ],
)
def test_other_answers_are_the_spawners_own_failures(status, data, code, reason, needle):
    e = allocation_refusal(status, data, WHAT)
    assert e.status_code == code and e.reason == reason.value and e.refusal is None
    assert needle in e.jupyterhub_message


# ---------------------------------------------------------------- retry loop


def _refusal(reason: RefusalReason) -> GPUPoolRefused:
    return allocation_refusal(409, {"reason": reason.value, "message": f"{reason.value} now"}, WHAT)


@pytest.mark.parametrize("reason", list(RefusalReason), ids=lambda r: r.value)
def test_the_spawner_retries_exactly_the_retryable_reasons(reason):
    s = make(reclaim_wait=30)
    profile = s.gpupool_profiles[1]
    calls = []

    async def allocate(profile, gpus):  # the one seam: the service's answers, scripted
        calls.append(gpus)
        if len(calls) == 1:
            raise _refusal(reason)
        return {"id": "a1", "node": "n", "gpus": []}

    s.gpupool_allocate = allocate
    if reason.retryable:
        assert asyncio.run(s.waits.run(profile, 2, s.start_timeout, s.reclaim_wait))["id"] == "a1"
        assert len(calls) == 2
        assert [e["message"] for e in s._gpupool_progress.events] == [f"{reason.title}: {reason.value} now"]
    else:
        with pytest.raises(GPUPoolRefused) as e:
            asyncio.run(s.waits.run(profile, 2, s.start_timeout, s.reclaim_wait))
        assert e.value.refusal is reason and len(calls) == 1


# ---------------------------------------------------------------- over HTTP


class _Handler(web.RequestHandler):
    def prepare(self) -> None:
        self.application.settings["seen"].append(
            (self.request.method, self.request.uri, self.request.headers.get("Authorization")))

    def get(self, path: str) -> None:
        if path == "models":
            self.set_status(503)
            self.finish({"message": "starting"})
        else:
            self.finish({"balance": "1.000", "floor": "-10.000"})

    def post(self, path: str) -> None:
        body = json.loads(self.request.body)
        assert body["request"] == {"gpus": 2}
        self.set_status(409)
        self.finish({"reason": "no_capacity", "message": "Nothing free."})

    def delete(self, path: str) -> None:
        self.set_status(404)
        self.finish({"message": "no such allocation"})


def test_client_calls_over_http_with_its_token():
    seen: list = []

    async def run():
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        server = HTTPServer(web.Application([(r"/api/v1/(.*)", _Handler)], seen=seen))
        server.listen(port, "127.0.0.1")
        try:
            client = GPUPoolClient(f"http://127.0.0.1:{port}/api/v1/", "t0ken", timeout=5)
            assert (await client.account("a b/c"))["balance"] == "1.000"
            with pytest.raises(ServiceError) as e:
                await client.catalog()
            assert e.value.status == 503 and e.value.message == "starting"
            with pytest.raises(GPUPoolRefused) as refused:
                await client.allocate("a", "", [], {"gpus": 2}, WHAT)
            assert refused.value.refusal is RefusalReason.NO_CAPACITY and refused.value.status_code == 503
            await client.release("id/1", "stopped")  # unknown to the service: released
            assert await client.ping()
        finally:
            server.stop()

    asyncio.run(run())
    assert [(m, u) for m, u, _ in seen][:4] == [
        ("GET", "/api/v1/users/a%20b%2Fc"), ("GET", "/api/v1/models"), ("POST", "/api/v1/allocations"),
        ("DELETE", "/api/v1/allocations/id%2F1?reason=stopped"),
    ]
    assert {auth for _, _, auth in seen} == {"token t0ken"}


def test_client_without_a_service():
    client = GPUPoolClient(dead_url(), timeout=2)
    with pytest.raises(ServiceUnavailable):
        asyncio.run(client.catalog())
    assert asyncio.run(client.ping()) is False
    with pytest.raises(GPUPoolRefused) as e:
        asyncio.run(client.allocate("a", "", [], {"gpus": 1}, "1 GPU"))
    assert e.value.reason == SpawnFailure.UNREACHABLE.value and e.value.status_code == 503
    assert "(requested 1 GPU)" in e.value.jupyterhub_message


def test_a_new_spawn_after_leaving_the_queue_queues_at_once():
    # Issue 39.1: "Leave the queue", then Start again within a minute: the pool ends the first
    # request after a place was given up (meant for a retry of the left spawn still in flight).
    # A new spawn asks again at once instead of failing with "start the server again".
    s = make()
    profile = s.gpupool_profiles[1]
    answers = [
        GPUPoolRefused("Your place in the GPU queue was given up (the spawn was cancelled); start the server "
                       "again to queue anew.", reason="no_capacity", status_code=503,
                       details={"cancelled_at": "2026-01-01T00:00:00Z"}),
        {"id": "a1", "node": "n", "gpus": []},
    ]

    async def allocate(profile, gpus):
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    s.gpupool_allocate = allocate
    assert asyncio.run(s.waits.run(profile, 1, s.start_timeout, s.reclaim_wait))["id"] == "a1"


def test_a_cancelled_place_later_in_a_wait_still_ends_it():
    s = make()
    profile = s.gpupool_profiles[1]
    gone = GPUPoolRefused("Your place in the GPU queue was given up.", reason="no_capacity", status_code=503,
                          details={"cancelled_at": "2026-01-01T00:00:00Z"})
    answers = [GPUPoolRefused("You are 1st in the queue.", reason="queued", status_code=503,
                              details={"position": 1}, retry_at="2000-01-01T00:00:00Z"), gone]

    async def allocate(profile, gpus):
        raise answers.pop(0)

    s.gpupool_allocate = allocate
    with pytest.raises(GPUPoolRefused) as e:
        asyncio.run(s.waits.run(profile, 1, 600, s.reclaim_wait))
    assert e.value is gone
