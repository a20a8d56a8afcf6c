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


async def test_the_pool_map_says_which_nodes_are_kept_whole_while_a_one_gpu_server_waits(tmp_path):
    """The map draws the four kept nodes' GPUs as free while a 1-GPU server waits: the note over
    the queue names them and says why (issue 50's kept nodes, placement/kept.py)."""
    from gpupool_hub.profiles import parse_profiles
    from tests.service.test_queue import SIXTEEN_EIGHTS

    m = make_manager(SIXTEEN_EIGHTS, {"RTX 3090": 1}, f"sqlite:///{tmp_path}/ledger.sqlite", clock=Clock(),
                     queue_enabled=True)
    m.inventory.expect_profiles(parse_profiles([{"slug": "one", "gpus": 1}, {"slug": "node", "gpus": 8}]))
    for i in range(12 * 8):
        m.admission.admit(f"user{i % 40}", [], f"s{i}", Request(gpus=1), None)
    s = PagesService(m, {"admin-token": user_model("admin", admin=True)})
    try:
        rows, note = await waiting(s)
        kept = sorted(ns.name for ns in m.pool.nodes if ns.n_full == 8)
        assert rows == [] and len(kept) == 4
        assert ("Kept whole for profiles of several GPUs (a smaller server waits rather than take their free "
                f"GPUs): {', '.join(kept)}.") in " ".join(note.split())
        queued(m, "alice")
        rows, note = await waiting(s)
        assert rows == ["alice"] and ", ".join(kept) in note
    finally:
        s.stop()


async def test_the_pool_map_names_the_node_held_for_the_head_and_the_one_drained(tmp_path):
    """Two waiters of 2 GPUs on four full nodes of two: once they are old, one node is held for
    the head and another drained for the second (queue.drains). A GPU frees on the drained node
    and a 1-GPU server still waits: the notes over the queue say which nodes, and why."""
    from tests.service.test_queue import FOUR_PAIRS

    clock = Clock()
    m = make_manager(FOUR_PAIRS, {"RTX 3090": 1}, f"sqlite:///{tmp_path}/ledger.sqlite", clock=clock,
                     queue_enabled=True)
    held = [m.admission.admit(f"user{i}", [], "", Request(gpus=1), None) for i in range(8)]

    def two(user):
        with pytest.raises(Refused):
            m.admission.admit(user, [], "", Request(gpus=2), None)

    two("carol")
    clock.advance(10)
    two("erin")
    for _ in range(5):  # 150 s: both waited past queue.order.RESERVE_AFTER; their spawners ask meanwhile
        clock.advance(30)
        two("carol")
        two("erin")
    queued(m, "frank")  # a join: a dispatch pass, now that both are old
    (drained,) = m.queue.order.drained
    m.admission.release(next(a for a in held if a.node == drained).id, "stopped")
    queued(m, "frank")  # a GPU is free on the drained node, not for him
    s = PagesService(m, {"admin-token": user_model("admin", admin=True)})
    try:
        rows, note = await waiting(s)
        note = " ".join(note.split())
        assert rows == ["carol", "erin", "frank"]
        assert f"Held for the first in line: {m.queue.order.reservation[1]}." in note
        assert f"Drained for waiters of several GPUs (only they start there): {drained}." in note
        assert "Kept whole" not in note  # no profile of several GPUs is configured
    finally:
        s.stop()
