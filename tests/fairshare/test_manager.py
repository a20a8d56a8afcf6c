"""Fair share through the pool manager (the admission path the API calls), in process."""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal

import pytest

from gpupool_hub.service.core.admission import parse_request
from gpupool_hub.service.core.errors import Refused

from .conftest import ask, make_manager


def teams(m):
    return {t["team"]: t for t in m.reclaims.team_report()["teams"]}


def test_greedy_team_cannot_keep_the_other_teams_quota(manager):
    m = manager
    # vision is greedy: 30 of 40 GPUs while nlp is idle; 10 of them are borrowed
    held = [ask(m, f"v{i}", "vision", 5) for i in range(6)]
    assert [r.borrowed for r in held] == [False] * 4 + [True] * 2
    assert teams(m)["vision"]["used_gpus"] == 30 and teams(m)["vision"]["borrowed_gpus"] == 10
    # nlp gets its full 20: 10 free, then the 10 borrowed GPUs are reclaimed
    got = [ask(m, f"n{i}", "nlp", 5) for i in range(4)]
    assert not any(r.borrowed for r in got)
    assert teams(m)["nlp"]["used_gpus"] == 20 and teams(m)["vision"]["used_gpus"] == 20
    # vision's guaranteed servers were never touched; its borrowed ones were, newest first
    active = {r.id for r in m.ledger.allocations.active()}
    assert all(r.id in active for r in held[:4]) and not any(r.id in active for r in held[4:])
    events = m.ledger.audit.page(limit=10)
    assert [e.action for e in events] == ["preempt", "preempt"]
    assert [e.user for e in events] == ["v4", "v5"]  # newest first: v5 first, listed newest event first
    # nlp is now at its quota: any more is borrowed or refused, never a preemption
    with pytest.raises(Refused) as e:
        m.admission.admit("n9", ["nlp"], "", parse_request({"gpus": 1}))
    assert e.value.reason == "no_capacity"


def test_idle_gpus_are_borrowed_and_reclaimed(manager):
    m = manager
    a = [ask(m, f"a{i}", "vision", 8) for i in range(4)]  # 32 of 40: 12 borrowed
    assert [r.borrowed for r in a] == [False, False, True, True]
    me = m.views.me("a3", ["vision"])
    assert me["allocations"][0]["borrowed"] is True
    # nlp asks for 8: only 8 free (on one node? A's 8s filled four nodes: 2 free on each)
    assert m.pool.free_summary().per_model["NVIDIA H100 80GB HBM3"]["largest_whole_block"] == 2
    with pytest.raises(Refused) as e:
        m.admission.admit("b0", ["nlp"], "", parse_request({"gpus": 8}))
    assert e.value.reason == "reclaiming" and e.value.retry_at == m.clock() + timedelta(seconds=1)
    rc = m.reclaims.active[("b0", "")]
    assert [v.user for v in rc.victims] == ["a3"]  # the newest borrowed server, one is enough
    # the victim is warned in GET me; a retry before the grace is over waits
    warning = m.views.me("a3", ["vision"])["cull_warning"]
    assert warning["action"] == "server" and "reclaimed for team nlp" in warning["reason"]
    with pytest.raises(Refused) as e:
        m.admission.admit("b0", ["nlp"], "", parse_request({"gpus": 8}))
    assert e.value.reason == "reclaiming"
    # nobody else can take the reserved GPUs meanwhile
    with pytest.raises(Refused):
        m.admission.admit("x", ["nlp"], "", parse_request({"gpus": 8}))
    m.clock.advance(1)
    m.reclaims.preempt(rc, rc.victims[0])
    record = m.admission.admit("b0", ["nlp"], "", parse_request({"gpus": 8}))
    assert record.node == rc.placement.node and not record.borrowed
    assert m.views.me("a3", ["vision"])["cull_warning"] is None
    assert m.views.me("a3", ["vision"])["allocations"] == []
    assert m.ledger.allocations.get(rc.victims[0].id).release_reason.startswith("preempted")


def test_fragmentation_large_request_still_fits_one_node(manager):
    m = manager
    a = [ask(m, f"a{i}", "vision", 3) for i in range(6)]  # 18 GPUs, all within quota
    assert not any(r.borrowed for r in a)
    full_nodes = sum(1 for ns in m.pool.nodes if ns.n_full == 10)
    assert full_nodes >= 1  # placement packed A's servers, keeping whole nodes free
    b = m.admission.admit("b0", ["nlp"], "", parse_request({"gpus": 8}))
    assert len(b.gpus) == 8 and not b.borrowed
    assert m.ledger.audit.page(limit=5) == []  # nothing was preempted


def test_fragmented_borrowers_are_reclaimed_on_one_node(tmp_path):
    """Even when placement could not keep a node whole, borrowed servers on one node make room."""
    m = make_manager(f"sqlite:///{tmp_path / 'l.sqlite'}", placement_policy="first-fit")
    guaranteed = [ask(m, f"g{i}", "vision", 2) for i in range(10)]  # node-0 and node-1
    ask(m, "n0", "nlp", 3)
    ask(m, "n1", "nlp", 3)                                          # node-2: 6
    b2 = [ask(m, f"v{i}", "vision", 2) for i in range(2)]           # node-2: full
    ask(m, "n2", "nlp", 3)                                          # node-3: 3
    b3 = [ask(m, f"w{i}", "vision", 2) for i in range(3)]           # node-3: 9
    assert not any(r.borrowed for r in guaranteed) and all(r.borrowed for r in b2 + b3)
    assert {r.node for r in b2} == {"node-2"} and {r.node for r in b3} == {"node-3"}
    rec = ask(m, "n9", "nlp", 4)  # 1 GPU free in the whole pool; nlp at 9 of 20
    assert len(rec.gpus) == 4 and not rec.borrowed
    gone = [e for e in m.ledger.audit.page(limit=10) if e.action == "preempt"]
    # two 2-GPU servers on the request's node, the newest borrowed ones: w2 and w1
    assert sorted(e.user for e in gone) == ["w1", "w2"]
    assert {e.detail["node"] for e in gone} == {rec.node} == {"node-3"}
    assert teams(m)["vision"]["used_gpus"] == 26  # still above its quota


def test_preempted_team_pays_only_for_the_time_used(manager):
    m = manager
    ask(m, "a0", "vision", 10)
    ask(m, "a1", "vision", 10)
    start = m.clock()
    borrowed = [ask(m, f"a{i}", "vision", 10) for i in (2, 3)]
    assert all(r.borrowed for r in borrowed)
    m.clock.advance(600)
    ask(m, "b0", "nlp", 10)  # preempts a3 (newest), after the 1 s grace
    record = m.ledger.allocations.get(borrowed[1].id)
    assert record.released_at == m.clock()  # released when stopped, after the grace
    ran = (record.released_at - record.created_at).total_seconds()
    assert 600 < ran < 610
    usage = {(u.user, u.model): u.gpu_seconds for u in m.debits.usage_source.usage(start, start + timedelta(hours=1))}
    assert usage[("a3", "NVIDIA H100 80GB HBM3")] == Decimal(int(ran) * 10)  # nothing after the release


def test_cooldown_and_no_preempt_back(manager):
    m = manager
    for i in range(4):
        ask(m, f"a{i}", "vision", 10)      # vision holds all 40, 20 borrowed
    ask(m, "b0", "nlp", 10)                # reclaims one of vision's borrowed servers
    assert teams(m)["vision"]["cooldown_until"] is not None
    # vision is still at least at its quota and cannot preempt nlp back
    with pytest.raises(Refused) as e:
        m.admission.admit("a9", ["vision"], "", parse_request({"gpus": 1}))
    assert e.value.reason == "no_capacity"


def test_without_teams_nothing_is_borrowed(tmp_path):
    m = make_manager(f"sqlite:///{tmp_path / 'l.sqlite'}", teams={})
    records = [ask(m, f"u{i}", None, 10) for i in range(4)]
    assert not any(r.borrowed for r in records) and "team" not in records[0].request
    with pytest.raises(Refused) as e:
        m.admission.admit("x", [], "", parse_request({"gpus": 1}))
    assert e.value.reason == "no_capacity"
    assert m.reclaims.team_report() == {"enabled": False, "default_team": "default", "preempt_grace_seconds": 1.0,
                               "teams": [], "reclaims": []}


def test_unclaimed_reservation_lapses_and_cancel_gives_gpus_back(manager):
    m = manager
    for i in range(4):
        ask(m, f"a{i}", "vision", 10)
    with pytest.raises(Refused):
        m.admission.admit("b0", ["nlp"], "", parse_request({"gpus": 10}))
    rc = m.reclaims.active[("b0", "")]
    victim = rc.victims[0]
    assert victim.id not in m.pool
    # a different request from the same server drops the reclaim (the victim gets its
    # GPUs back) and starts a new one
    with pytest.raises(Refused) as e:
        m.admission.admit("b0", ["nlp"], "", parse_request({"gpus": 9}))
    assert e.value.reason == "reclaiming"
    rc2 = m.reclaims.active[("b0", "")]
    assert rc2 is not rc and rc2.request.gpus == 9
    # nobody claims it: it lapses, every borrowed server keeps running with its GPUs
    m.clock.advance(10_000)
    m.reclaims.expire()
    assert not m.reclaims.active and len(m.pool) == 4
    assert m.views.me(victim.user, ["vision"])["cull_warning"] is None
