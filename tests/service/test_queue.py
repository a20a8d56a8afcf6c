"""The wait queue in the service core (in-process, manual clock): fair order, one
entry per server, leaving, expiry, a restart that loses nobody's place, backfill
for newcomers, and pressure from waiters (never from a user's own entry)."""

from __future__ import annotations

import sqlite3

import pytest

from gpupool_hub.ledger import LedgerBusy
from gpupool_hub.placement import Request
from gpupool_hub.placement.request import normalize_model
from gpupool_hub.reasons import RefusalReason
from gpupool_hub.service.core.errors import Refused
from tests.fixtures.manager import Clock, make_manager, units_for

R3090 = "NVIDIA GeForce RTX 3090"
ONE = [{"name": "node-a", "cpu_milli": 32000, "memory_mib": 131072,
        "gpus": [{"index": 0, "uuid": "GPU-0", "model": R3090}]}]
TWO_NODES = ONE + [{"name": "node-b", "cpu_milli": 32000, "memory_mib": 131072,
                    "gpus": [{"index": i, "uuid": f"GPU-b{i}", "model": R3090} for i in range(2)]}]
PRICES = {"RTX 3090": 1}


def manager(tmp_path, nodes=ONE, clock=None, **kw):
    kw.setdefault("queue_enabled", True)
    return make_manager(nodes, PRICES, f"sqlite:///{tmp_path}/ledger.sqlite", clock=clock or Clock(), **kw)


def admit(m, user, gpus=1, server=""):
    return m.admission.admit(user, [], server, Request(gpus=gpus), None)


def queued(m, user, gpus=1, server=""):
    with pytest.raises(Refused) as e:
        admit(m, user, gpus, server)
    assert e.value.reason is RefusalReason.QUEUED, e.value.message
    return e.value


def test_three_users_get_one_gpu_in_fair_order_and_a_leaver_loses_the_place(tmp_path):
    clock = Clock()
    m = manager(tmp_path, clock=clock)
    held = admit(m, "alice")
    for i, user in enumerate(("bob", "carol", "dave"), 1):
        r = queued(m, user)
        assert r.details["position"] == i and r.details["queue_length"] == i
        assert f"{['1st', '2nd', '3rd'][i - 1]} in the queue" in r.message
        assert (r.retry_at - clock.now).total_seconds() == 2  # the spawner asks again in 2 s
        clock.advance(1)
    # a retry answers the same place, never a second entry
    assert queued(m, "carol").details["position"] == 2 and len(m.queue.entries) == 3
    # estimates: alice's typical session (4 h) ends, then bob's, then carol's
    etas = [queued(m, u).details["eta"] for u in ("bob", "carol", "dave")]
    assert etas == ["2025-03-03T13:00:00Z", "2025-03-03T17:00:00Z", "2025-03-03T21:00:00Z"]
    assert "about 4.0 hours" in queued(m, "bob").message

    m.admission.release(held.id, "server stopped")
    got = admit(m, "bob")  # his GPU was reserved by the release; his retry claims it
    assert got.user == "bob" and got.gpus[0]["uuid"] == "GPU-0"
    assert queued(m, "carol").details["position"] == 1

    # carol stops retrying: after queue_poll_timeout her place is gone, dave moves up
    clock.advance(30)
    queued(m, "dave")
    clock.advance(40)
    assert queued(m, "dave").details["position"] == 1
    assert ("carol", "") not in m.queue.entries
    assert queued(m, "carol").details["position"] == 2  # back at the end
    # dave cancels (the spawner's stop): carol is first again
    assert m.queue.leave("dave", "")
    with pytest.raises(Refused) as e:  # his spawner's next retry ends the spawn, saying why
        admit(m, "dave")
    assert e.value.reason is RefusalReason.NO_CAPACITY and "was given up" in e.value.message
    m.admission.release(got.id, "server stopped")
    assert admit(m, "carol").user == "carol"


def test_a_restart_loses_nobodys_place(tmp_path):
    clock = Clock()
    m = manager(tmp_path, clock=clock)
    admit(m, "alice")
    for user in ("bob", "carol", "dave"):
        queued(m, user)
        clock.advance(1)
    # the process dies without closing anything (kill -9): a new core on the same database
    m2 = manager(tmp_path, clock=clock)
    assert m2.restore() == 1
    assert [queued(m2, u).details["position"] for u in ("bob", "carol", "dave")] == [1, 2, 3]
    m2.admission.release(m2.ledger.allocations.active()[0].id, "stopped")
    assert admit(m2, "bob").user == "bob"


def test_newcomers_queue_behind_waiters_unless_backfill_lets_them_start(tmp_path):
    clock = Clock()
    m = manager(tmp_path, TWO_NODES, clock=clock)
    a = admit(m, "alice")        # node-a's only GPU (fgd packs the small node first)
    b = admit(m, "bob")          # one of node-b's
    assert {a.node, b.node} == {"node-a", "node-b"}
    queued(m, "carol", gpus=2)   # needs both of node-b: head, node-b held for her
    clock.advance(1)
    m.admission.release(a.id, "stopped")  # node-a free: dave may backfill there
    assert admit(m, "dave").node == "node-a"
    # erin wants one GPU; node-b has one free but it is held for carol
    queued(m, "erin")
    # a request no node can ever take is refused, never queued
    with pytest.raises(Refused) as e:
        admit(m, "fred", gpus=3)
    assert e.value.reason is RefusalReason.MODEL_UNAVAILABLE
    m.admission.release(b.id, "stopped")
    assert admit(m, "carol", gpus=2).node == "node-b"


def test_pressure_comes_from_other_users_waiting_for_what_a_user_holds(tmp_path):
    m = manager(tmp_path)
    admit(m, "alice")
    assert m.queue.demand_for("alice", {R3090}) is None
    queued(m, "alice", server="second")  # alice's own entry is no pressure on alice
    assert m.queue.demand_for("alice", {R3090}) is None
    queued(m, "bob")
    assert m.queue.demand_for("alice", {R3090}) is not None
    assert m.queue.demand_for("bob", {R3090}) is not None  # alice's entry waits for what bob would hold
    assert m.queue.demand_for("alice", {"NVIDIA RTX A6000"}) is None


def test_waiting_can_be_turned_off_and_max_wait_ends_it(tmp_path):
    m = manager(tmp_path, queue_enabled=False)
    admit(m, "alice")
    with pytest.raises(Refused) as e:
        admit(m, "bob")
    assert e.value.reason is RefusalReason.NO_CAPACITY

    clock = Clock()
    m = make_manager(ONE, PRICES, "sqlite://", clock=clock, max_wait=30, queue_enabled=True)
    admit(m, "alice")
    queued(m, "bob")
    clock.advance(20)
    queued(m, "bob")
    clock.advance(20)
    with pytest.raises(Refused) as e:  # past max_wait: the final refusal says why
        admit(m, "bob")
    assert e.value.reason is RefusalReason.NO_CAPACITY and "within 0.5 minutes of waiting" in e.value.message
    assert queued(m, "bob").details["position"] == 1  # asking again queues anew


def test_own_queue_entry_never_warns_but_another_users_does(tmp_path):
    import asyncio
    from decimal import Decimal

    from gpupool_hub.takeback.cull import Culler
    from gpupool_hub.service.jobs.cull import CullJob

    from datetime import datetime, timezone

    m = manager(tmp_path, clock=Clock(datetime.now(timezone.utc)))  # the cull job reads the real time
    admit(m, "alice")
    queued(m, "alice", server="second")  # alice herself waits for a GPU: no pressure on alice
    m.accounts.grant("alice", Decimal(-105), "test: below zero, above the floor", "test", None)
    culler = Culler(pressure_allocated_fraction=2.0)  # only waiters make pressure here

    async def no_groups(user):
        return []

    async def no_utilization(records):
        return None

    job = CullJob(None, culler, no_groups, no_utilization, **units_for(CullJob, m))  # warnings need no hub
    asyncio.run(job())
    assert m.enforcement.warnings == {} and m.warning_for("alice") is None
    queued(m, "bob")
    asyncio.run(job())
    warning = m.warning_for("alice")
    assert warning is not None and "waits for GPUs like these" in warning.reason


def test_idle_rule_table():
    from datetime import datetime, timedelta, timezone

    from gpupool_hub.reasons import AuditAction
    from gpupool_hub.takeback.cull import CullWarning
    from gpupool_hub.takeback.idle import IdleServer, decide_idle

    now = datetime(2025, 3, 3, 12, 0, tzinfo=timezone.utc)
    old = now - timedelta(hours=3)

    def server(idle=True, wanted=True, idle_long=False, started=old):
        return IdleServer("alice", "", "a1", started, idle, idle_long, wanted)

    def run(s, warning=None, max_idle=0):
        warnings = {("alice", ""): warning} if warning else {}
        return [d.action for d in decide_idle([s], warnings, now, grace=900, min_runtime=900, idle_after=3600,
                                              max_idle=max_idle)]

    due = CullWarning("server", "idle", now - timedelta(seconds=1))
    later = CullWarning("server", "idle", now + timedelta(seconds=60))
    assert run(server()) == [AuditAction.IDLE_WARN]
    assert run(server(), later) == []
    assert run(server(), due) == [AuditAction.IDLE_RECLAIM]
    assert run(server(wanted=False)) == []                           # nobody waits: left alone
    assert run(server(wanted=False), later) == [AuditAction.CLEAR_WARNING]
    assert run(server(idle=False), later) == [AuditAction.CLEAR_WARNING]  # busy again
    assert run(server(started=now - timedelta(seconds=60))) == []     # min_runtime protects new servers
    assert run(server(wanted=False, idle_long=True), max_idle=7200) == [AuditAction.IDLE_WARN]


def test_reported_utilization_needs_the_whole_window():
    import asyncio
    from datetime import datetime, timedelta, timezone

    from gpupool_hub.usage.utilization import ReportedUtilization

    src = ReportedUtilization(0.05)
    now = datetime.now(timezone.utc)
    src.report({"g0": 0.0, "g1": 0.0, "g2": 0.0}, now - timedelta(seconds=100))
    src.report({"g1": 0.5}, now - timedelta(seconds=10))
    src.report({"g2": 0.0}, now - timedelta(seconds=5))
    peak = asyncio.run(src.peak(["g0", "g1", "g2", "g3"], 60))
    assert peak == {"g0": 0.0, "g1": 1.0, "g2": 0.0}  # g3 unknown: never idle
    assert asyncio.run(src.peak(["g0"], 200)) == {}      # not known for 200 s


def test_spawn_form_says_full_with_waiters_and_estimate():
    from datetime import datetime, timezone

    from gpupool_hub.profiles import parse_profiles
    from gpupool_hub.spawner.form import form_context
    from gpupool_hub.spawner.wait_rules import full_text

    now = datetime(2025, 3, 3, 9, 0, tzinfo=timezone.utc)
    assert full_text([{"waiting": 0, "eta": None}], now) == "full"
    assert full_text([{"waiting": 2, "eta": "2025-03-03T09:20:00Z"}], now) == "full — 2 waiting, about 20 min"
    assert full_text([{"waiting": 1, "eta": None}], now) == "full — 1 waiting"
    assert full_text([{"waiting": 3, "eta": "2025-03-03T13:00:00Z"}], now) == "full — 3 waiting, about 4.0 h"
    profiles = parse_profiles([{"slug": "two", "display_name": "2 GPUs", "gpus": 2, "models": ["RTX 3090"]}])
    catalog = {"models": [{"model": R3090, "price_per_gpu_hour": "1", "gpus": 2, "whole_free": 1,
                           "largest_whole_block": 1, "waiting": 2, "eta": None}], "min_start_hours": "1"}
    choice = form_context(profiles, profiles[0], None, catalog)["profiles"][0]
    assert choice.free == "full — 2 waiting"


def test_one_user_waits_in_at_most_two_places_and_others_are_not_pushed_back(tmp_path):
    clock = Clock()
    m = manager(tmp_path, clock=clock)
    held = admit(m, "alice")
    for i in range(2):
        queued(m, "mallory", server=f"s{i}")
        clock.advance(1)
    # a third waiting place is refused at once, naming the two that wait; nothing is queued
    with pytest.raises(Refused) as e:
        admit(m, "mallory", server="s2")
    assert e.value.reason is RefusalReason.QUEUE_LIMIT
    assert e.value.message.startswith("You already wait for 2 servers: 's0' (1st in the queue), 's1' (2nd in the queue)")
    assert [w.server for w in m.queue.order.ordered()] == ["s0", "s1"]
    # her own retries keep their places
    assert queued(m, "mallory", server="s1").details["position"] == 2
    # the next user waits 2nd, after mallory's first and before her second
    assert queued(m, "bob").details["position"] == 2
    assert queued(m, "mallory", server="s1").details["position"] == 3
    assert [(w["user"], w["server"], w["position"]) for w in m.queue.reports.report()["waiting"]] == [
        ("mallory", "s0", 1), ("bob", "", 2), ("mallory", "s1", 3)]
    # the admin pool map builds only the rows it shows: the report's first ones, and the count
    assert m.queue.reports.first_waiting(2) == (m.queue.reports.report()["waiting"][:2], 3)
    assert [w["position"] for w in m.queue.reports.waiting_of("mallory")] == [1, 3]
    # the freed GPU goes to mallory's first; the next one to bob, not to her second
    m.admission.release(held.id, "stopped")
    reserved, _ = m.queue.reports.first_waiting(1)  # mallory's first, her GPU reserved: still first
    assert reserved == m.queue.reports.report()["waiting"][:1] and reserved[0]["reserved_on"] == "node-a"
    first = admit(m, "mallory", server="s0")
    assert queued(m, "bob").details["position"] == 1
    assert queued(m, "mallory", server="s1").details["position"] == 2
    assert [(w["server"], w["position"]) for w in m.queue.reports.waiting_of("mallory")] == [("s1", 2)]
    m.admission.release(first.id, "stopped")
    assert admit(m, "bob").user == "bob"
    assert m.queue.reports.waiting_of("bob") == [] and m.views.me("bob")["waiting"] == []
    # with one place free again, she may queue another server
    queued(m, "mallory", server="s2")


def test_the_waiting_limit_is_configurable(tmp_path):
    m = manager(tmp_path, max_waiting_per_user=1)
    admit(m, "alice")
    queued(m, "bob", server="a")
    with pytest.raises(Refused) as e:
        admit(m, "bob", server="b")
    assert e.value.reason is RefusalReason.QUEUE_LIMIT
    assert e.value.message.startswith("You already wait for 1 server: 'a' (1st in the queue).")
    assert e.value.details == {"max_waiting_per_user": 1, "waiting": [{"server": "a", "position": 1}]}


A6000 = "NVIDIA RTX A6000"
MIXED = ONE + [{"name": "node-c", "cpu_milli": 32000, "memory_mib": 131072,
                "gpus": [{"index": 0, "uuid": "GPU-c0", "model": A6000}]}]


def test_a_spawn_for_another_model_replaces_the_queued_one_and_starts_at_once(tmp_path):
    """Issue 29.3: an A6000 spawn of a server queued for an RTX 3090 inherited the 3090's place
    (the queue compared requests without the model) and waited with the A6000 free."""
    m = make_manager(MIXED, {"RTX 3090": 1, "RTX A6000": 4}, f"sqlite:///{tmp_path}/ledger.sqlite",
                     clock=Clock(), queue_enabled=True)
    m.admission.admit("alice", [], "", Request(gpus=1), ["RTX 3090"])
    with pytest.raises(Refused) as e:
        m.admission.admit("bob", [], "", Request(gpus=1), ["RTX 3090"])
    assert e.value.reason is RefusalReason.QUEUED
    # the same request again keeps its place
    with pytest.raises(Refused) as e:
        m.admission.admit("bob", [], "", Request(gpus=1), ["RTX 3090"])
    assert e.value.details["position"] == 1 and len(m.queue.entries) == 1
    got = m.admission.admit("bob", [], "", Request(gpus=1), ["RTX A6000"])
    assert got.node == "node-c" and got.gpus[0]["model"] == A6000
    assert m.queue.entries == {} and m.ledger.queue.rows() == []


def test_a_spawn_that_claims_its_reserved_gpus_and_is_then_abandoned_holds_nothing(tmp_path):
    """The claim of a queued place may be in flight when the hub cancels the spawn: the
    spawner then releases by its attempt's key, which must find the claimed GPUs."""
    m = manager(tmp_path)
    held = admit(m, "alice")
    with pytest.raises(Refused):
        m.admission.admit("bob", [], "", Request(gpus=1), None, key="attempt-1")
    m.admission.release(held.id, "server stopped")  # bob's place now has the GPU reserved
    got = m.admission.admit("bob", [], "", Request(gpus=1), None, key="attempt-1")  # the claim
    assert got.user == "bob"
    # a retry of the same claim (its answer was lost) gets the same GPUs, not new ones
    assert m.admission.admit("bob", [], "", Request(gpus=1), None, key="attempt-1").id == got.id
    released = m.admission.release_key("attempt-1", "spawn abandoned: CancelledError")
    assert released is not None and released.id == got.id
    assert m.ledger.allocations.active() == []
    assert admit(m, "carol").gpus[0]["uuid"] == "GPU-0"  # the GPU is free for the next user


def test_demand_for_many_holders_at_once_answers_as_one_at_a_time(tmp_path):
    """The cull and idle jobs ask for every holder in one pass; each answer must be what
    ``demand_for`` says for that holder alone: others' waits count, one's own never."""
    clock = Clock()
    m = manager(tmp_path, nodes=TWO_NODES, clock=clock)
    for user in ("alice", "bob", "carol"):
        admit(m, user)
    for user, server in (("dave", "a"), ("alice", "w"), ("erin", "b")):
        clock.advance(1)
        queued(m, user, server=server)
    a6000 = "NVIDIA RTX A6000"
    asks = [(u, frozenset(models)) for u in ("alice", "bob", "dave", "erin", "zoe")
            for models in ({R3090}, {a6000}, set(), {R3090, a6000})]
    together = m.queue.demand(asks)

    def one_at_a_time(user, models):  # the rule, scanning every waiting entry for one holder
        keys = {normalize_model(x) for x in models}
        return max((e.last_seen for e in m.queue.entries.values()
                    if e.placement is None and not e.expired and e.waiter.user != user
                    and (e.waiter.request.models is None or keys & e.waiter.request.models)), default=None)

    assert together == {ask: one_at_a_time(*ask) for ask in asks}
    assert all(m.queue.demand_for(*ask) == together[ask] for ask in asks)
    # erin waited last: everyone else's pressure is her retry; hers is dave's or alice's newest
    assert together[("bob", frozenset({R3090}))] == m.queue.entries[("erin", "b")].last_seen
    assert together[("erin", frozenset({R3090}))] == m.queue.entries[("alice", "w")].last_seen
    assert together[("bob", frozenset({a6000}))] is None  # nobody waits for an A6000


def test_a_join_the_ledger_cannot_store_leaves_nobody_waiting_and_nothing_reserved(tmp_path):
    clock = Clock()
    m = manager(tmp_path, TWO_NODES, clock=clock, busy_timeout=0.2)
    admit(m, "alice")
    admit(m, "bob")
    queued(m, "carol", gpus=2)  # the head: node-b is held for her
    clock.advance(1)
    m.accounts.ensure("dave")
    assert m.accounts.ensure("dave") is False  # his account is open: joining is the only write left
    # another process holds the write lock while dave joins: his entry and the estimate he
    # is shown go in one transaction, which cannot commit
    locker = sqlite3.connect(tmp_path / "ledger.sqlite", isolation_level=None)
    locker.execute("BEGIN IMMEDIATE")
    try:
        with pytest.raises(LedgerBusy):
            admit(m, "dave")
    finally:
        locker.rollback()
        locker.close()
    assert ("dave", "") not in m.queue.entries and not m.queue.reports.waiting_of("dave")
    assert [r["user"] for r in m.ledger.queue.rows()] == ["carol"]
    # his next try joins as if the first never happened, behind carol, with one shown estimate
    r = queued(m, "dave")
    assert r.details["position"] == 2 and [e["user"] for e in m.ledger.queue.rows()] == ["carol", "dave"]
    with m.ledger.db.engine.connect() as conn:
        shown = conn.exec_driver_sql("SELECT user FROM gpupool_estimates ORDER BY shown_at, user").fetchall()
    assert sorted(u for (u,) in shown) == ["carol", "dave"]


def test_a_newcomer_that_starts_as_it_joins_leaves_no_queue_record(tmp_path):
    m = manager(tmp_path, TWO_NODES)
    a = admit(m, "alice")
    b = admit(m, "bob")
    queued(m, "carol", gpus=2)  # node-b held for her
    m.admission.release(a.id if a.node == "node-a" else b.id, "stopped")  # node-a free
    assert admit(m, "dave").node == "node-a"  # backfilled at once, off the held node
    assert [r["user"] for r in m.ledger.queue.rows()] == ["carol"]
    with m.ledger.db.engine.connect() as conn:
        users = [u for (u,) in conn.exec_driver_sql("SELECT user FROM gpupool_estimates")]
    assert users == ["carol"]  # no estimate was shown to dave: he never waited


EIGHT_NODES = ONE + [{"name": f"node-{n}", "cpu_milli": 32000, "memory_mib": 131072,
                      "gpus": [{"index": i, "uuid": f"GPU-{n}{i}", "model": R3090}
                               for i in range(2 if n in "bc" else 1)]}
                     for n in "bcdefgh"]


@pytest.mark.parametrize("waited", [60, 150])
def test_a_waiter_that_fits_few_nodes_keeps_them_from_newcomers(tmp_path, waited):
    """carol and erin each want 2 GPUs (only node-b and node-c have two: a quarter of the
    nodes); carol is the head and holds one of them. A GPU frees on the other: a 1-GPU
    newcomer, who fits elsewhere, does not start there, whether erin is young or has waited
    longer than RESERVE_AFTER (2 minutes): the nodes of a request that fits few are kept for
    it from the moment it waits (queue.dispatch.dispatch; before issue 41 a newcomer backfilled
    there while erin was young, and she then waited for that server to stop)."""
    clock = Clock()
    m = manager(tmp_path, EIGHT_NODES, clock=clock)
    held = [admit(m, f"user{i}") for i in range(10)]
    queued(m, "carol", gpus=2)
    queued(m, "erin", gpus=2)
    reserved = m.queue.order.reservation
    assert reserved is not None and reserved[1] in ("node-b", "node-c")
    other = "node-c" if reserved[1] == "node-b" else "node-b"
    for _ in range(waited // 30):  # their spawners retry meanwhile
        clock.advance(30)
        queued(m, "carol", gpus=2)
        queued(m, "erin", gpus=2)
    m.admission.release(next(a.id for a in held if a.node == other), "stopped")
    queued(m, "dave")
    assert m.queue.order.reservation == reserved  # carol keeps her node
    m.admission.release(next(a.id for a in held[::-1] if a.node == other), "stopped")
    assert admit(m, "carol", gpus=2).node == other  # it drained: the head's (first in order), not dave's


@pytest.mark.parametrize("seed", range(4))
def test_positions_are_the_fair_order_through_joins_retries_releases_and_time(tmp_path, seed):
    # The service keeps the fair order between changes (every waiting spawner asks for its
    # place every few seconds) and puts newcomers into it without sorting again. Whatever
    # happens (joins, retries, releases, cancels, expiry, waiters turning old), each waiter's
    # position must be the one a full sort gives at that moment.
    import random

    from gpupool_hub.queue.order import fair_order

    rng = random.Random(seed)
    clock = Clock()
    m = manager(tmp_path, nodes=TWO_NODES, clock=clock, queue_poll_timeout=3600)  # waiters stay and grow old
    q = m.queue
    held = []
    for step in range(120):
        op = rng.random()
        user, server = f"u{rng.randrange(5)}", rng.choice(("", "b"))
        try:
            if op < 0.45:
                held.append(admit(m, user, gpus=rng.choice((1, 1, 2)), server=server))
            elif op < 0.6 and held:
                m.admission.release(held.pop(rng.randrange(len(held))).id, "server stopped")
            elif op < 0.7 and q.entries:
                entry = rng.choice(list(q.entries.values()))
                q.leave(entry.waiter.user, entry.waiter.server)
            elif op < 0.8:
                q.housekeeping()
            else:
                clock.advance(rng.choice((0, 1, 5, 40, 130)))
        except Refused:
            pass
        entries = list(q.entries.values())
        full = fair_order((e.waiter for e in entries if e.placement is None), q.order.head(), q.order.running(entries),
                          now=clock())
        assert q.order.ordered() == full, step
        assert [q.order.position(e) for e in entries if e.placement is None] == [
            full.index(e.waiter) + 1 for e in entries if e.placement is None], step


def test_a_retry_sees_the_place_change_when_an_earlier_waiter_turns_old(tmp_path):
    # alice holds the GPU; dave waits first (the head); alice waits for a second server
    # (round 1). bob, who holds none, joins a minute later and goes ahead of her (round 0).
    # Once she has waited past RESERVE_AFTER she is old and goes before him, with nothing
    # else changed: the order the service keeps between retries must not outlive that moment.
    clock = Clock()
    m = manager(tmp_path, clock=clock, queue_poll_timeout=3600)
    admit(m, "alice")
    assert queued(m, "dave").details["position"] == 1
    assert queued(m, "alice", server="b").details["position"] == 2
    clock.advance(60)
    assert queued(m, "bob").details["position"] == 2
    assert queued(m, "alice", server="b").details["position"] == 3
    clock.advance(30)
    assert queued(m, "bob").details["position"] == 2  # both young still
    clock.advance(35)  # alice has waited 125 s, bob 65 s
    assert queued(m, "bob").details["position"] == 3
    assert queued(m, "alice", server="b").details["position"] == 2


FOUR_PAIRS = [{"name": f"node-{n}", "cpu_milli": 32000, "memory_mib": 131072,
               "gpus": [{"index": i, "uuid": f"GPU-{n}{i}", "model": R3090} for i in range(2)]}
              for n in "abcd"]


def test_an_old_waiter_of_several_gpus_gets_a_drained_node_that_no_newcomer_takes(tmp_path):
    """carol and erin each want 2 GPUs, which every node has: too many nodes for a waiter to
    close (at most a quarter of the pool, queue.dispatch.CLOSE_AT_MOST). carol is the head and
    holds a node; once erin has waited, another node is drained for her (queue.drains; the
    budget allows one here). A GPU frees there: frank and dave, 1-GPU waiters, would have
    backfilled onto it before issue 50 (and erin then waited for their servers to stop); they
    stay queued; when the node's second GPU frees, carol, the oldest of the two, starts on it and
    erin becomes the head on carol's node. The admin queue report names the drained node."""
    clock = Clock()
    m = manager(tmp_path, FOUR_PAIRS, clock=clock)
    held = [admit(m, f"user{i}") for i in range(8)]
    queued(m, "carol", gpus=2)
    clock.advance(10)
    queued(m, "erin", gpus=2)
    for _ in range(5):  # 150 s: both have waited past RESERVE_AFTER; their spawners retry meanwhile
        clock.advance(30)
        queued(m, "carol", gpus=2)
        queued(m, "erin", gpus=2)
    queued(m, "frank")  # a join: a dispatch pass, now that both are old
    reserved = m.queue.order.reservation
    assert reserved is not None
    (drained,) = m.queue.order.drained
    assert drained != reserved[1]
    assert m.queue.reports.report()["drained_nodes"] == [drained]
    on_drained = [a for a in held if a.node == drained]
    m.admission.release(on_drained[0].id, "stopped")
    queued(m, "dave")  # one GPU is free on the drained node, and it is neither his nor frank's
    queued(m, "frank")
    assert m.queue.order.drained == {drained}
    m.admission.release(on_drained[1].id, "stopped")
    # the drained node is for the waiters of several GPUs in order: carol, the oldest, starts there
    assert admit(m, "carol", gpus=2).node == drained
    head, node = m.queue.order.reservation  # erin is the head now, on the node held for carol
    assert m.queue.entries[("erin", "")].waiter.id == head and node == reserved[1]
    queued(m, "erin", gpus=2)


SIXTEEN_EIGHTS = [{"name": f"node-{n:02d}", "cpu_milli": 64000, "memory_mib": 524288,
                   "gpus": [{"index": i, "uuid": f"GPU-{n:02d}-{i}", "model": R3090} for i in range(8)]}
                  for n in range(16)]


def test_the_last_whole_nodes_are_kept_for_the_configured_eight_gpu_profile(tmp_path):
    """A configured 8-GPU profile on 16 nodes of 8 GPUs: once only four nodes are whole
    (placement.kept.KEEP_WHOLE, a quarter of the nodes it fits), a 1-GPU spawn queues although
    GPUs are free there, and the 8-GPU spawn that comes later starts at once instead of waiting
    for a node to drain (issue 50). A release elsewhere starts the 1-GPU waiter."""
    from gpupool_hub.profiles import parse_profiles

    m = manager(tmp_path, SIXTEEN_EIGHTS)
    m.inventory.expect_profiles(parse_profiles([{"slug": "one", "gpus": 1}, {"slug": "node", "gpus": 8}]))
    held = [admit(m, f"user{i % 40}", server=f"s{i}") for i in range(12 * 8)]
    whole = [ns.name for ns in m.pool.nodes if ns.n_full == 8]
    assert len(whole) == 4 and {a.node for a in held}.isdisjoint(whole)
    r = queued(m, "alice")  # 32 GPUs are free, all on the four kept nodes
    # not free for her: her estimate waits for a held server's end, not "within a minute"
    assert r.details["eta_source"] == "typical" and r.message.endswith(
        "about 4.0 hours (no session history yet: estimated from the typical session length of 4 h).")
    assert m.pool.allocated_gpu_milli == 96 * 1000
    assert m.queue.reports.report()["kept_nodes"] == sorted(whole)  # the admin sees why
    # and the spawn page: those 32 GPUs are not free for the 1-GPU profile, free for the 8-GPU one
    kept_whole = {p["slug"]: p["kept_whole"] for p in m.views.models()["profiles"]}
    model = m.pool.nodes[0].node.gpus[0].model
    assert kept_whole == {"one": {model: 32}, "node": {}}
    big = admit(m, "bob", gpus=8)
    assert big.node in whole  # no wait: the node was kept whole for it
    assert m.queue.reports.report()["kept_nodes"] == sorted(set(whole) - {big.node})
    m.admission.release(held[0].id, "stopped")
    assert admit(m, "alice").node == held[0].node  # the freed GPU, not a kept node


def test_a_four_gpu_card_reads_full_while_only_nodes_kept_for_eight_have_four_free(tmp_path):
    """Beside a configured 8-GPU profile, the four whole nodes kept for it are where the pool's
    largest free block is. A 4-GPU profile may not break them, so while no other node has four
    GPUs free its card says full, as its spawn queues; once a node open to it has four, the
    waiting spawn starts there (issue 50's kept nodes, as the spawn page shows them)."""
    from gpupool_hub.profiles import parse_profiles
    from gpupool_hub.spawner.form import form_context

    m = manager(tmp_path, SIXTEEN_EIGHTS)
    profiles = parse_profiles([{"slug": "one", "gpus": 1}, {"slug": "four", "gpus": 4},
                               {"slug": "node", "gpus": 8}])
    m.inventory.expect_profiles(profiles)
    held = [admit(m, f"user{i % 40}", server=f"s{i}") for i in range(12 * 8)]
    node, other = held[0].node, next(a.node for a in held if a.node != held[0].node)
    on_node = [a for a in held if a.node == node]
    for a in on_node[:3] + [a for a in held if a.node == other][:2]:  # 5 GPUs free, at most 3 on one node
        m.admission.release(a.id, "stopped")

    def card(slug):
        catalog = m.views.models()
        entry = next(p for p in catalog["profiles"] if p["slug"] == slug)
        shown = next(c for c in form_context(profiles, None, {"balance": "1000.000"}, catalog)["profiles"]
                     if c.slug == slug)
        return entry["kept_whole"], entry["open_block"], shown.full, shown.free

    assert card("four") == ({R3090: 32}, {R3090: 3}, True,
                            "full (5 free GPUs, at most 3 on one node; 32 more kept whole for servers of more GPUs)")
    queued(m, "carol", gpus=4)
    assert card("node") == ({}, {}, False, "37 of 128 GPUs free")
    m.admission.release(on_node[3].id, "stopped")  # four free on a node open to her: she starts there
    assert admit(m, "carol", gpus=4).node == node
    assert card("four")[1:] == ({R3090: 2}, True, "full (32 free GPUs kept whole for servers of more GPUs)")
