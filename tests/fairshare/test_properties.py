"""Property: over random request sequences, reclaim never thrashes and never breaks a guarantee."""

from __future__ import annotations

from datetime import timedelta

from hypothesis import HealthCheck, event, given, settings, strategies as st

from gpupool_hub.service.core.admission import parse_request
from gpupool_hub.service.core.errors import Refused

from .conftest import make_manager

TEAMS = {"vision": {"gpus": 20}, "nlp": {"gpus": 14}, "speech": {"gpus": 6}}
GROUPS = [["vision"], ["nlp"], ["speech"], [], ["vision", "nlp"]]

ops = st.lists(st.one_of(
    st.tuples(st.just("ask"), st.integers(0, len(GROUPS) - 1), st.integers(0, 5),
              st.sampled_from([1, 1, 2, 2, 3, 4, 5, 8, 10])),
    st.tuples(st.just("stop"), st.integers(0, 1000)),
    st.tuples(st.just("wait"), st.integers(1, 900)),
    st.tuples(st.just("fill"), st.integers(0, len(GROUPS) - 1), st.sampled_from([1, 2, 3, 5])),
), max_size=40)


def used(m):
    return {t["team"]: t["used_gpus"] for t in m.reclaims.team_report()["teams"]}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops)
def test_reclaim_never_thrashes(sequence):
    m = make_manager(teams=TEAMS, preempt_cooldown=600)
    quota = {t: q["gpus"] for t, q in TEAMS.items()} | {"default": 0}
    events = []  # (time, preempting team, victim team)
    n = 0
    for op in sequence:
        m.clock.advance(1)
        if op[0] == "wait":
            m.clock.advance(op[1])
            continue
        if op[0] == "fill":  # one team borrows everything that is free
            while True:
                m.clock.advance(1)
                try:
                    m.admission.admit(f"f{op[1]}-{n}", GROUPS[op[1]], str(n), parse_request({"gpus": op[2]}))
                except Refused as e:
                    if e.reason == "reclaiming":  # the spawner gave up: the reclaim is dropped
                        m.reclaims.cancel(m.reclaims.active[(f"f{op[1]}-{n}", str(n))], "test")
                    break
                finally:
                    n += 1
            continue
        if op[0] == "stop":
            active = m.ledger.allocations.active()
            if active:
                m.admission.release(active[op[1] % len(active)].id, "server stopped")
            continue
        _, g, u, gpus = op
        user, server, groups = f"u{g}-{u}", str(n), GROUPS[g]
        n += 1
        try:
            m.admission.admit(user, groups, server, parse_request({"gpus": gpus}))
            continue
        except Refused as e:
            if e.reason != "reclaiming":
                continue
        rc = m.reclaims.active[(user, server)]
        event("reclaim")
        before = used(m)  # reserved GPUs count for the requester; victims no longer
        # only borrowed servers of other teams that were over quota, none below it after
        for v in rc.victims:
            assert v.borrowed
            assert v.request["team"] != rc.team
        for team in {v.request["team"] for v in rc.victims}:
            assert before.get(team, 0) >= quota[team], (team, before)
        # the requester is within its quota with the request
        assert before[rc.team] <= quota[rc.team]
        # no thrashing: a team preempted within the cool-down never preempts
        now = m.clock()
        for t, _, victim in events:
            assert not (victim == rc.team and now - t < timedelta(seconds=600)), (events, rc.team)
        m.clock.advance(m.settings.preempt_grace)
        for v in rc.victims:
            m.reclaims.preempt(rc, v)
            events.append((m.clock(), rc.team, v.request["team"]))
        record = m.admission.admit(user, groups, server, parse_request({"gpus": gpus}))
        assert not record.borrowed and record.node == rc.placement.node
        # and a team preempted cannot immediately take the GPUs back
        victim_team = rc.victims[0].request["team"]
        for vu in range(6):
            for vg, grp in enumerate(GROUPS):
                if grp == [victim_team] or (victim_team == "default" and grp == []):
                    try:
                        back = m.admission.admit(f"u{vg}-{vu}", grp, f"back-{n}", parse_request({"gpus": gpus}))
                    except Refused as e:
                        assert e.reason != "reclaiming", "a preempted team preempted back"
                    else:  # only GPUs left free by the reclaim, never the requester's
                        assert back.node != record.node or not set(g["index"] for g in back.gpus) & set(
                            g["index"] for g in record.gpus)
                        m.admission.release(back.id, "test")
                    break
            break
        # the pool and the ledger agree
        held = sum(sum(gg["milli"] for gg in r.gpus) for r in m.ledger.allocations.active())
        assert m.pool.allocated_gpu_milli == held
    # guaranteed servers are never preempted
    for e in m.ledger.audit.page(limit=500):
        assert m.ledger.allocations.get(e.detail["allocation"]).borrowed
