"""Issue 48.10: the pool map draws the next waiters from rows built once per change of the queue,
not the whole queue's report at every view; and those rows never go stale: a newcomer, a start
and a leaver show on the next view, with the queue's length.
"""

from __future__ import annotations

import pytest

from gpupool_hub.placement import Request
from gpupool_hub.reasons import RefusalReason
from gpupool_hub.service.core.errors import Refused
from gpupool_hub.service.pages import poolmap
from tests.fixtures.manager import Clock, make_manager

from .inprocess import PagesService, attrs, user_model

R3090 = "NVIDIA GeForce RTX 3090"
NODES = [{"name": "node-a", "cpu_milli": 32000, "memory_mib": 131072,
          "gpus": [{"index": i, "uuid": f"GPU-{i}", "model": R3090} for i in range(2)]}]


def queued(m, user: str) -> None:
    with pytest.raises(Refused) as e:
        m.admission.admit(user, [], "", Request(gpus=1), None)
    assert e.value.reason is RefusalReason.QUEUED, e.value.message


@pytest.fixture
async def setup(tmp_path):
    clock = Clock()
    m = make_manager(NODES, {"RTX 3090": 1}, f"sqlite:///{tmp_path}/ledger.sqlite", clock=clock,
                     queue_enabled=True)
    s = PagesService(m, {"admin-token": user_model("admin", admin=True)})
    yield m, s, clock
    s.stop()


async def waiting(service) -> tuple[list[str], str]:
    r = await service.client("admin-token").get("admin/pool")
    assert r.code == 200, r.body[:500]
    body = r.body.decode()
    table = body[body.index('data-gpupool="waiting"'):]
    table = table[:table.index("</table>")]
    note = body[body.index("<h2>Waiting for GPUs</h2>"):body.index('data-gpupool="waiting"')]
    return [row["data-user"] for row in attrs(table, "data-user=")], note


async def test_the_pool_map_shows_the_queue_as_it_changes(setup, monkeypatch):
    m, service, clock = setup
    monkeypatch.setattr(poolmap, "WAITING_SHOWN", 2)  # a queue longer than what the page draws
    held = [m.admission.admit(u, [], "", Request(gpus=1), None) for u in ("alice", "bob")]
    for user in ("carol", "dave", "erin"):
        queued(m, user)
        clock.advance(1)
    rows, note = await waiting(service)
    assert rows == ["carol", "dave"] and "The next 2 of 3." in note
    assert await waiting(service) == (rows, note)  # nothing changed: the same rows

    queued(m, "frank")  # a newcomer, at the end: the count moves, the rows drawn do not
    assert (await waiting(service))[1].count("The next 2 of 4.") == 1

    m.admission.release(held[0].id, "server stopped")  # carol's GPU is reserved: she leads, "reserved"
    m.admission.admit("carol", [], "", Request(gpus=1), None)  # her retry starts her server
    rows, note = await waiting(service)
    assert rows == ["dave", "erin"] and "The next 2 of 3." in note

    assert m.queue.leave("dave", "")  # a leaver
    rows, note = await waiting(service)
    assert rows == ["erin", "frank"] and "The next" not in note  # all of them drawn now


async def test_nobody_waiting_says_so(setup):
    _, service, _ = setup
    rows, _ = await waiting(service)
    assert rows == []
