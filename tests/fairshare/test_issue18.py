"""Issue 18: fair share as users live it (in process: cancelled reclaims, ping-pong, restarts)."""

from __future__ import annotations

import asyncio

import pytest

from gpupool_hub.service.core.admission import parse_request
from gpupool_hub.service.core.errors import Refused
from gpupool_hub.service.jobs.reclaim import ReclaimExecutor

from .conftest import ask, make_manager


class FakeHub:
    def __init__(self):
        self.stopped = []

    async def stop_server(self, user, server=""):
        self.stopped.append((user, server))


def refused(m, user, team_groups, gpus, server=""):
    with pytest.raises(Refused) as e:
        m.admission.admit(user, team_groups, server, parse_request({"gpus": gpus}))
    return e.value


def vision_borrows(m):
    """vision holds four 8-GPU servers (a2, a3 borrowed); 2 GPUs free per node."""
    return [ask(m, f"a{i}", "vision", 8) for i in range(4)]


def run_executor(m, rc):
    hub = FakeHub()
    asyncio.run(ReclaimExecutor(hub, m.reclaims).run(rc))
    return hub


def test_18_2_cancelled_spawn_cancels_its_reclaim(tmp_path):
    m = make_manager(f"sqlite:///{tmp_path / 'l.sqlite'}", preempt_grace=30)
    vision_borrows(m)
    assert refused(m, "b0", ["nlp"], 8).reason == "reclaiming"
    rc = m.reclaims.active[("b0", "")]
    [victim] = rc.victims
    assert m.views.me(victim.user, ["vision"])["cull_warning"] is not None
    # the spawner's stop of the pending spawn cancels it at once
    assert m.reclaims.cancel_pending("b0", "", "the spawn was cancelled") is True
    assert m.reclaims.cancel_pending("b0", "", "again") is False
    assert not m.reclaims.active and victim.id in m.pool
    assert m.views.me(victim.user, ["vision"])["cull_warning"] is None
    # at the deadline the executor stops nobody, and nobody is preempted or cooled down
    m.clock.advance(31)
    assert run_executor(m, rc).stopped == []
    assert m.ledger.allocations.get(victim.id).released_at is None
    assert m.reclaims.team_report()["teams"][1]["cooldown_until"] is None  # vision
    # the GPUs are not reserved for nobody: another nlp user gets its own reclaim, not "0 GPUs free"
    assert refused(m, "b1", ["nlp"], 8).reason == "reclaiming"


def test_18_2_reclaim_nobody_asks_about_ends_before_its_deadline(tmp_path):
    m = make_manager(f"sqlite:///{tmp_path / 'l.sqlite'}", preempt_grace=90)
    vision_borrows(m)
    refused(m, "b0", ["nlp"], 8)
    rc = m.reclaims.active[("b0", "")]
    m.clock.advance(30)
    refused(m, "b0", ["nlp"], 8)  # the spawner's retry keeps it alive
    m.clock.advance(59)
    m.reclaims.expire()
    assert m.reclaims.pending("b0", "") is rc
    m.clock.advance(2)  # the spawn timed out in the hub: no retry for 61 s
    hub = run_executor(m, rc)  # before the deadline too: the executor drops it, stops nobody
    assert hub.stopped == [] and not m.reclaims.active
    assert all(v.id in m.pool for v in rc.victims)


def test_18_2_executor_still_stops_victims_of_a_live_reclaim(tmp_path):
    m = make_manager(f"sqlite:///{tmp_path / 'l.sqlite'}", preempt_grace=30)
    vision_borrows(m)
    refused(m, "b0", ["nlp"], 8)
    rc = m.reclaims.active[("b0", "")]
    m.clock.advance(30)
    assert run_executor(m, rc).stopped == [(rc.victims[0].user, rc.victims[0].server)]
    assert m.admission.admit("b0", ["nlp"], "", parse_request({"gpus": 8})).node == rc.placement.node


def test_18_3_borrowed_server_is_not_preempted_before_min_runtime(tmp_path):
    m = make_manager(f"sqlite:///{tmp_path / 'l.sqlite'}", preempt_min_runtime=300)
    held = vision_borrows(m)  # started one second apart, just now
    assert refused(m, "b0", ["nlp"], 8).reason == "no_capacity"  # nothing old enough to preempt
    m.clock.advance(300)
    assert refused(m, "b0", ["nlp"], 8).reason == "reclaiming"
    assert [v.id for v in m.reclaims.active[("b0", "")].victims] == [held[3].id]


def test_18_3_ping_pong_victim_cooldown_per_server(tmp_path):
    m = make_manager(f"sqlite:///{tmp_path / 'l.sqlite'}", preempt_cooldown=600)
    vision_borrows(m)
    ask(m, "b0", "nlp", 8)  # a3's server preempted
    m.clock.advance(10)
    m.admission.release(m.ledger.allocations.active("b0")[0].id, "server stopped")
    again = ask(m, "a3", "vision", 8)  # a3 restarts at once, borrowed again
    assert again.borrowed
    # another nlp spawn takes a2's (older) borrowed server, never a3's fresh restart
    ask(m, "b1", "nlp", 8)
    assert m.ledger.allocations.get(again.id).released_at is None
    assert [e.user for e in m.ledger.audit.page(limit=10)] == ["a2", "a3"]


def test_18_3_and_18_8_cooldowns_and_counters_survive_a_restart(tmp_path):
    db = f"sqlite:///{tmp_path / 'l.sqlite'}"
    m = make_manager(db, preempt_cooldown=600)
    vision_borrows(m)
    ask(m, "b0", "nlp", 8)
    before = {t["team"]: t for t in m.reclaims.team_report()["teams"]}
    assert before["vision"]["preempted"] == 1 and before["vision"]["cooldown_until"]
    m.close()
    m2 = make_manager(db, preempt_cooldown=600, clock=m.clock)
    m2.restore()
    after = {t["team"]: t for t in m2.reclaims.team_report()["teams"]}
    assert after["vision"]["preempted"] == 1
    assert after["vision"]["cooldown_until"] == before["vision"]["cooldown_until"]
    assert m2.reclaims.victim_cooldown_until[("a3", "")] > m2.clock()


def test_18_8_lowered_quota_reclassifies_held_servers_at_restart(tmp_path):
    db = f"sqlite:///{tmp_path / 'l.sqlite'}"
    m = make_manager(db)
    held = [ask(m, f"a{i}", "vision", 8) for i in range(2)]  # 16 of vision's 20: guaranteed
    assert not any(r.borrowed for r in held)
    m.close()
    # the admin lowers vision's quota to 8 and raises nlp's to 32, then restarts
    m2 = make_manager(db, teams={"vision": {"gpus": 8}, "nlp": {"gpus": 32}}, clock=m.clock)
    m2.restore()
    assert [m2.ledger.allocations.get(r.id).borrowed for r in held] == [False, True]  # oldest stays guaranteed
    assert m2.views.me("a1", ["vision"])["allocations"][0]["borrowed"] is True
    # nlp is owed GPUs: once the free ones are gone, its third server reclaims a1's, now borrowed
    for i in range(3):
        ask(m2, f"b{i}", "nlp", 8)
    assert m2.ledger.allocations.get(held[1].id).released_at is not None
    assert m2.ledger.allocations.get(held[0].id).released_at is None
