"""Issue 18.5-18.7 in process: notices after GPUs were taken back (kept across a restart,
dismissed per user), the cull warning after the cull, reconcile quiet about the service's own
cull, and the node agents' list after a reclaim."""

from __future__ import annotations

import asyncio
import logging
from datetime import timedelta

from gpupool_hub.ledger import AuditEvent
from gpupool_hub.reasons import AuditAction
from gpupool_hub.service.core.enforcement import TAKEN_WATCH
from gpupool_hub.takeback.cull import CullWarning
from gpupool_hub.service.jobs.reconcile import ReconcileJob
from gpupool_hub.service.core.takeback_notices import KEPT_KERNELS, KEPT_SERVER

from .conftest import ask, make_manager


def preempted(m):
    """vision borrows; nlp's b0 reclaims a3's 8-GPU server."""
    victims = [ask(m, f"a{i}", "vision", 8) for i in range(4)]
    ask(m, "b0", "nlp", 8)
    return victims[3]


def test_18_5_a_preempted_user_is_told_until_dismissed_even_after_a_restart(tmp_path):
    db = f"sqlite:///{tmp_path / 'l.sqlite'}"
    m = make_manager(db)
    a3 = preempted(m)
    me = m.views.me("a3", ["vision"])  # (cached views are forgotten by the preempt event)
    [n] = me["notices"]
    assert n["kind"] == "preempted" and n["server"] == "" and "reclaimed for another team" in n["title"]
    assert "team nlp" in n["why"] and n["kept"] == KEPT_SERVER
    assert m.views.me("b0", ["nlp"])["notices"] == []  # bob never sees alice's notice
    assert m.notices.dismiss("b0", n["id"]) is False  # nor may he dismiss it (the API answers 404)
    assert m.notices.dismiss("a3", 10**9) is False
    m.close()
    m2 = make_manager(db, clock=m.clock)  # a restart keeps it
    m2.restore()
    assert [x["id"] for x in m2.views.me("a3", ["vision"])["notices"]] == [n["id"]]
    assert m2.notices.dismiss("a3", n["id"]) is True
    assert m2.views.me("a3", ["vision"])["notices"] == []
    assert m2.notices.dismiss("a3", n["id"]) is True  # twice is harmless
    # the node agents treat a3's processes on GPUs a3 no longer holds as stray, for a while
    assert "a3" in m2.enforcement.stray_users()
    assert m2.enforcement.agent_list({})["allowed"]["a3"] == []
    assert a3.id not in m2.pool


def test_18_5_cull_floor_stop_and_idle_reclaim_are_notices(tmp_path):
    m = make_manager(f"sqlite:///{tmp_path / 'l.sqlite'}")
    ask(m, "u", None, 1)
    m.views.me("u")  # cached: the next events must forget it
    now = m.clock()
    for action in (AuditAction.WARN, AuditAction.CULL_KERNELS, AuditAction.STOP_SERVER, AuditAction.IDLE_RECLAIM):
        m.notices.record(AuditEvent(now, "u", "gpu", action.value, f"{action.value} because"))
    m.notices.record(AuditEvent(now, "u", "gpu", AuditAction.STOP_SERVER.value, "dry", dry_run=True))
    notices = m.views.me("u")["notices"]
    assert [x["kind"] for x in notices] == ["idle_reclaim", "floor_stop", "kernels_stopped"]  # newest first
    assert notices[2]["kept"] == KEPT_KERNELS and all(x["server"] == "gpu" for x in notices)


def test_18_6_a_carried_out_cull_warning_says_so_instead_of_counting_down(tmp_path):
    m = make_manager(f"sqlite:///{tmp_path / 'l.sqlite'}")
    e = m.enforcement
    e.warnings["u"] = CullWarning("kernels", "balance below zero", m.clock() + timedelta(seconds=60))
    assert m.views.me("u")["cull_warning"]["done_at"] is None
    m.clock.advance(61)
    e.kernels_culled("u", "", m.clock())
    first = m.views.me("u")["cull_warning"]["done_at"]
    assert first is not None and first > m.views.me("u")["cull_warning"]["deadline"]
    m.clock.advance(60)
    e.kernels_culled("u", "", m.clock())  # the next cull run: still the first time it was done
    assert m.views.me("u")["cull_warning"]["done_at"] == first


class Hub:
    """The hub as reconcile sees it: one running server whose state names an allocation."""

    def __init__(self, user, alloc):
        self.model = {"name": user, "servers": {"": {"state": {"gpupool_allocation": alloc}}}}

    async def users(self, state=None):
        yield self.model


def test_18_6_reconcile_is_quiet_about_the_services_own_cull(tmp_path, caplog):
    m = make_manager(f"sqlite:///{tmp_path / 'l.sqlite'}")
    culled = ask(m, "u", None, 1)
    m.admission.release(culled.id, "cull_kernels: balance below zero past the grace period")
    job = ReconcileJob(Hub("u", culled.id), m.records, m.admission, grace=0)
    with caplog.at_level(logging.DEBUG, "gpupool.reconcile"):
        asyncio.run(job())
    assert job.report() == [] and not [r for r in caplog.records if r.levelno >= logging.WARNING]
    # an allocation the pool never made is still an error
    job = ReconcileJob(Hub("u", "no-such-allocation"), m.records, m.admission, grace=0)
    with caplog.at_level(logging.ERROR, "gpupool.reconcile"):
        asyncio.run(job())
    assert [f["allocation"] for f in job.report()] == ["no-such-allocation"]
    assert "the pool does not know" in caplog.text
    m.close()


def test_18_7_released_gpus_stay_off_limits_for_a_while(tmp_path):
    m = make_manager(f"sqlite:///{tmp_path / 'l.sqlite'}")
    preempted(m)
    again = ask(m, "a3", "vision", 1)  # a3 starts anew elsewhere: those GPUs are allowed
    held = {"a3": [g["uuid"] for g in again.gpus]}
    assert m.enforcement.agent_list(held)["allowed"] == {"a3": sorted(held["a3"])}
    m.clock.advance(TAKEN_WATCH.total_seconds() + 1)
    assert "a3" not in m.enforcement.stray_users()
