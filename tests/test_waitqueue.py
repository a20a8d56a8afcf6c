"""The wait queue's pure rules: fair order, dispatch with a reservation for the
head (no starvation), and start estimates."""

from __future__ import annotations

import random

import pytest
from datetime import datetime, timedelta, timezone

from gpupool_hub.placement import Pool, Request
from gpupool_hub.queue.order import BORROWER, UNDER_QUOTA, FairOrder, Waiter, fair_order
from gpupool_hub.queue.dispatch import RESERVE_AFTER, dispatch, join_behind
from gpupool_hub.queue.starts import ExpectedRelease, estimate_starts, wait_text

T0 = datetime(2026, 11, 22, 9, tzinfo=timezone.utc)
MODEL = "NVIDIA GeForce RTX 3090"


def nodes(n: int, gpus: int) -> list[dict]:
    return [{"name": f"n{i}", "cpu_milli": 64000, "memory_mib": 262144, "gpus": {"count": gpus, "model": MODEL}}
            for i in range(n)]


def waiter(i: int, gpus: int = 1, priority: int = BORROWER, minute: int | None = None) -> Waiter:
    return Waiter(f"w{i}", f"user{i}", "", Request(gpus=gpus), T0 + timedelta(minutes=i if minute is None else minute),
                  priority)


def fill(pool: Pool, n: int, prefix: str = "held") -> list[str]:
    ids = []
    for i in range(n):
        pool.allocate(f"{prefix}{i}", Request(gpus=1))
        ids.append(f"{prefix}{i}")
    return ids


def test_teams_under_quota_first_then_first_come_first_served():
    w = [waiter(0), waiter(1, priority=UNDER_QUOTA), waiter(2), waiter(3, priority=UNDER_QUOTA)]
    assert [x.id for x in fair_order(w)] == ["w1", "w3", "w0", "w2"]


def arrivals(*specs: str) -> list[Waiter]:
    """Waiters from "a1", "b2~" ... in arrival order: the letter is the user, "~" marks a
    team within its quota (UNDER_QUOTA)."""
    return [Waiter(spec.rstrip("~"), f"user-{spec[0]}", spec.rstrip("~"), Request(gpus=1),
                   T0 + timedelta(minutes=i), UNDER_QUOTA if spec.endswith("~") else BORROWER)
            for i, spec in enumerate(specs)]


@pytest.mark.parametrize("specs, head, running, expected", [
    # one waiter per user: first come, first served as before
    (["a1", "b1", "c1"], None, None, ["a1", "b1", "c1"]),
    # one user's flood: the next user waits 2nd, not behind all of it
    (["a1", "a2", "a3", "a4", "b1"], None, None, ["a1", "b1", "a2", "a3", "a4"]),
    # round by round: every user's first, then every user's second, ...
    (["a1", "a2", "b1", "b2", "a3", "c1"], None, None, ["a1", "b1", "c1", "a2", "b2", "a3"]),
    # a newcomer's first waiter goes ahead of earlier users' seconds
    (["a1", "b1", "a2", "b2", "c1"], None, None, ["a1", "b1", "c1", "a2", "b2"]),
    # teams within their quota still come first; rounds are counted per class
    (["a1", "a2~", "b1", "b2~", "a3~"], None, None, ["a2", "b2", "a3", "a1", "b1"]),
    # the head holding a reserved node keeps its place at the front of its class
    (["a1", "a2", "b1"], "a2", None, ["a2", "a1", "b1"]),
    (["a1~", "b1", "b2"], "b2", None, ["a1", "b2", "b1"]),
    # a user whose first server already runs: the waiter is that user's second
    (["a1", "b1", "c1"], None, {"user-a": 1}, ["b1", "c1", "a1"]),
    (["a1", "a2", "b1"], None, {"user-b": 2}, ["a1", "a2", "b1"]),
    (["a1~", "b1"], None, {"user-a": 3}, ["a1", "b1"]),  # the class still comes first
])
def test_round_robin_across_users_within_a_priority_class(specs, head, running, expected):
    waiters = arrivals(*specs)
    assert [w.id for w in fair_order(waiters, head, running)] == expected
    assert [w.id for w in fair_order(reversed(waiters), head, running)] == expected  # arrival decides, not input order


def test_twenty_waiters_of_one_user_put_the_next_user_second():
    waiters = arrivals(*[f"a{i}" for i in range(20)], "b0")
    assert [w.id for w in fair_order(waiters)].index("b0") == 1


def test_freed_gpus_go_round_robin_and_estimates_follow_that_order():
    pool = Pool(nodes(1, 2))
    held = fill(pool, 2)
    queue = fair_order(arrivals("a1", "a2", "a3", "b1"))
    releases = [ExpectedRelease("n0", 1000, "nvidia geforce rtx 3090", T0 + timedelta(minutes=m)) for m in (10, 20)]
    est = estimate_starts(queue, {}, releases, T0)
    assert est == {"a1": T0 + timedelta(minutes=10), "b1": T0 + timedelta(minutes=20), "a2": None, "a3": None}
    pool.release(held[0])
    assert [w.id for w, _ in dispatch(pool, queue, lambda w: w.id).placed] == ["a1"]
    queue = fair_order((w for w in queue if w.id != "a1"), running={"user-a": 1})  # a1 runs now
    pool.release(held[1])
    assert [w.id for w, _ in dispatch(pool, queue, lambda w: w.id).placed] == ["b1"]


def test_three_users_for_one_gpu_get_it_in_order():
    pool = Pool(nodes(1, 2))
    held = fill(pool, 2)
    queue = fair_order([waiter(2), waiter(0), waiter(1)])
    assert dispatch(pool, queue, lambda w: w.id).placed == []
    pool.release(held[0])
    d = dispatch(pool, queue, lambda w: w.id)
    assert [w.id for w, _ in d.placed] == ["w0"]
    queue = [w for w in queue if w.id != "w0"]
    pool.release(held[1])
    assert [w.id for w, _ in dispatch(pool, queue, lambda w: w.id).placed] == ["w1"]


def test_a_smaller_request_goes_ahead_only_off_the_heads_node():
    pool = Pool(nodes(2, 4))
    held = fill(pool, 8)
    by_node = {pool.get(a).node: [] for a in held}
    for a in held:
        by_node[pool.get(a).node].append(a)
    big, small = waiter(0, gpus=4), waiter(1, gpus=1)
    d = dispatch(pool, [big, small], lambda w: w.id)
    assert d.placed == [] and d.reservation is not None and d.reservation[0] == "w0"
    reserved = d.reservation[1]
    other = next(n for n in by_node if n != reserved)
    pool.release(by_node[reserved][0])  # a GPU frees on the head's node: the small one may not take it
    d = dispatch(pool, [big, small], lambda w: w.id, d.reservation)
    assert d.placed == [] and d.reservation == ("w0", reserved)
    pool.release(by_node[other][0])  # one frees elsewhere: the small one backfills there
    d = dispatch(pool, [big, small], lambda w: w.id, d.reservation)
    assert [(w.id, p.node) for w, p in d.placed] == [("w1", other)]


def test_a_four_gpu_head_is_not_starved_by_a_stream_of_one_gpu_requests():
    """Scripted arrivals: every minute one running 1-GPU server stops and a new 1-GPU
    request arrives behind the 4-GPU one. The 4-GPU request starts in the very pass
    after the last server on its reserved node stops, and the small ones keep being
    served on the other node meanwhile."""
    rng = random.Random(7)
    pool = Pool(nodes(2, 4))
    held = fill(pool, 8)
    queue = [waiter(0, gpus=4)]
    reservation = None
    started_small = 0
    for minute in range(1, 60):
        held.remove(stop := held[rng.randrange(len(held))])
        pool.release(stop)
        queue.append(waiter(minute, gpus=1))
        d = dispatch(pool, fair_order(queue), lambda w: w.id, reservation)
        if reservation is not None and "w0" not in [w.id for w, _ in d.placed]:
            assert d.reservation == reservation  # the head keeps its node
        reservation = d.reservation
        for w, p in d.placed:
            queue.remove(w)
            if w.id == "w0":
                assert not [a for a in held if pool.get(a).node == p.node]
                assert started_small > 0
                return
            held.append(w.id)
            started_small += 1
        if reservation is not None:
            left = [a for a in held if pool.get(a).node == reservation[1]]
            assert left, "the reserved node drained but the head did not start"
    raise AssertionError(f"the 4-GPU request never started ({started_small} small ones did)")


def test_without_a_reservation_the_big_request_would_starve():
    """The control for the test above: plain first-fit-in-order hands every freed GPU
    to the newest 1-GPU request, so the 4-GPU one never starts."""
    rng = random.Random(7)
    pool = Pool(nodes(2, 4))
    held = fill(pool, 8)
    for minute in range(1, 40):
        pool.release(held.pop(rng.randrange(len(held))))
        pool.allocate(f"s{minute}", Request(gpus=1))  # greedy: whoever fits now starts
        held.append(f"s{minute}")
    assert not pool.candidates(Request(gpus=4))


def test_estimates_follow_the_queue_and_known_releases():
    queue = [waiter(0, 2), waiter(1, 1), waiter(2, 4)]
    free = {"nvidia geforce rtx 3090": 1000}
    releases = [ExpectedRelease("n0", 1000, "nvidia geforce rtx 3090", T0 + timedelta(minutes=m)) for m in (10, 20, 30)]
    est = estimate_starts(queue, free, releases, T0)
    assert est == {"w0": T0 + timedelta(minutes=10), "w1": T0 + timedelta(minutes=20), "w2": None}
    assert "2nd" in wait_text(2, est["w1"], T0) and "20 minutes" in wait_text(2, est["w1"], T0)
    assert "no estimate" in wait_text(3, None, T0)


# ---------------------------------------------------------------- old waiters (RESERVE_AFTER)

def big_and_small_pool() -> Pool:
    """Two 8-GPU nodes that can take a 120-CPU request ("big0", "big1": a quarter of the
    nodes, what old waiters may close by default) and six 1-GPU nodes that cannot."""
    return Pool([{"name": f"big{i}", "cpu_milli": 128000, "memory_mib": 786432, "gpus": {"count": 8, "model": MODEL}}
                 for i in range(2)] + [{"name": f"small{i}", "cpu_milli": 16000, "memory_mib": 65536,
                                        "gpus": {"count": 1, "model": MODEL}} for i in range(6)])


SMALL = dict(cpu_milli=4000, memory_mib=16384)


def big_waiter(i: int, minute: int) -> Waiter:
    return Waiter(f"big-{i}", f"biguser{i}", "", Request(gpus=8, cpu_milli=120000, memory_mib=737280),
                  T0 + timedelta(minutes=minute))


def small_waiter(i: int, minute: float) -> Waiter:
    return Waiter(f"s{i}", f"user{i % 7}", "", Request(gpus=1, **SMALL), T0 + timedelta(minutes=minute))


@pytest.mark.parametrize("aging, big0_starts", [
    # one reserved node: the head holds big0, where one server runs for 5 hours, while every
    # GPU freed on big1 goes to a 1-GPU newcomer: the head starts only when big0 drains
    (False, (300, "big0")),
    # both big requests are old after 2 minutes and close both big nodes: big1, which nothing
    # refills any more, drains by minute 25 and the head starts there
    (True, (25, "big1")),
])
def test_an_old_big_waiter_behind_a_stream_of_small_ones_gets_its_node(aging, big0_starts):
    """Both big nodes are full of 1-GPU servers (running 10 to 25 minutes, one on big0 for
    5 hours), the six small nodes too; two 8-GPU, 120-CPU requests wait (they fit only the
    big nodes), and two 1-GPU requests arrive every minute, more than the pool serves."""
    rng = random.Random(3)
    pool = big_and_small_pool()
    ends: dict[str, int] = {}  # running 1-GPU server -> the minute it stops
    for n, g in [(n, g) for n in ("big0", "big1") for g in range(8)] + [(f"small{i}", 0) for i in range(6)]:
        aid = f"held-{n}-{g}"
        pool.allocate(aid, Request(gpus=1, required=frozenset({f"{n}/gpu{g}"}), **SMALL))
        ends[aid] = 300 if aid == "held-big0-0" else rng.randint(10, 25)
    queue: list[Waiter] = [big_waiter(0, 0), big_waiter(1, 0)]
    reservation = None
    started: dict[str, tuple[int, str]] = {}
    for minute in range(1, 400):
        now = T0 + timedelta(minutes=minute)
        for aid in [a for a, end in ends.items() if end == minute]:
            pool.release(aid)
            del ends[aid]
        if minute < 360:
            queue += [small_waiter(2 * minute, minute - 0.5), small_waiter(2 * minute + 1, minute - 0.4)]
        kw = {"now": now} if aging else {}
        d = dispatch(pool, fair_order(queue, reservation[0] if reservation else None, **kw), lambda w: w.id,
                     reservation, **kw)
        if minute == 1:
            assert d.reservation == ("big-0", "big0")  # the most free GPUs (none), then the name
        reservation = d.reservation
        for w, p in d.placed:
            queue.remove(w)
            started[w.id] = (minute, p.node)
            ends[w.id] = minute + (600 if w.id.startswith("big") else rng.randint(10, 25))
    assert started["big-0"][1] == big0_starts[1] and started["big-0"][0] <= big0_starts[0]
    assert started["big-0"][0] >= (300 if not aging else 10)
    assert ("big-1" in started) == aging  # with aging it gets big0 once the 5-hour server ends
    small_started = [m for w, (m, _) in started.items() if w.startswith("s")]
    assert len([m for m in small_started if m < started["big-0"][0]]) >= 5  # backfill went on meanwhile


def small_stream(seed: int, aging: bool) -> tuple[list[tuple[int, str, str]], list[float]]:
    """Every 20 seconds some 1- and 2-GPU servers stop and often one arrives, each served
    within two minutes: (step, waiter, node) of each start and each start's wait, with and
    without ``now``."""
    rng = random.Random(seed)
    pool = Pool(nodes(3, 4))
    ends: dict[str, int] = {}
    for i in range(12):
        pool.allocate(f"held{i}", Request(gpus=1))
        ends[f"held{i}"] = rng.randint(1, 8)
    queue: list[Waiter] = []
    reservation = None
    out, waits = [], []
    for step in range(1, 240):
        for aid in [a for a, end in ends.items() if end == step]:
            pool.release(aid)
            del ends[aid]
        now = T0 + timedelta(seconds=20 * step)
        if rng.random() < 0.9:
            queue.append(Waiter(f"w{step}", f"user{rng.randrange(5)}", "", Request(gpus=rng.choice((1, 1, 2))), now))
        kw = {"now": now} if aging else {}
        d = dispatch(pool, fair_order(queue, reservation[0] if reservation else None, **kw), lambda w: w.id,
                     reservation, **kw)
        reservation = d.reservation
        for w, p in d.placed:
            queue.remove(w)
            ends[w.id] = step + rng.randint(3, 12)
            out.append((step, w.id, p.node))
            waits.append((now - w.since).total_seconds())
    return out, waits


@pytest.mark.parametrize("seed", [1, 3, 5])
def test_aging_changes_nothing_when_nobody_waits_long(seed):
    """Waits of up to 100 s, under ``RESERVE_AFTER``: the same starts, on the same nodes, as
    without aging."""
    starts, waits = small_stream(seed, aging=True)
    assert sum(1 for x in waits if x > 0) >= 20 and max(waits) < RESERVE_AFTER.total_seconds()
    assert small_stream(seed, aging=False) == (starts, waits)


def test_old_waiters_come_first_in_their_class_keeping_round_robin_among_them():
    # a1, a2 and b1 have waited longer than RESERVE_AFTER; c1 (a first server) and b2 have not
    ws = [Waiter(i, f"user-{i[0]}", "", Request(gpus=1), T0 + timedelta(minutes=m))
          for i, m in (("a1", 0), ("a2", 1), ("b1", 2), ("c1", 9), ("b2", 9))]
    now = T0 + timedelta(minutes=10)
    assert [w.id for w in fair_order(ws)] == ["a1", "b1", "c1", "a2", "b2"]
    assert [w.id for w in fair_order(ws, now=now)] == ["a1", "b1", "a2", "c1", "b2"]
    under = Waiter("u1", "user-u", "", Request(gpus=1), T0 + timedelta(minutes=9), UNDER_QUOTA)
    assert [w.id for w in fair_order(ws + [under], now=now)][0] == "u1"  # the class still comes first


def test_an_old_waiter_closes_the_nodes_it_could_use_and_a_newcomer_joining_behind_respects_them():
    pool = big_and_small_pool()
    on: dict[str, list[str]] = {}
    for i in range(22):
        pool.allocate(f"held{i}", Request(gpus=1, cpu_milli=4000, memory_mib=16384))
        on.setdefault(pool.get(f"held{i}").node, []).append(f"held{i}")
    old, young = big_waiter(0, 0), small_waiter(1, 9)
    now = T0 + timedelta(minutes=10)
    d = dispatch(pool, fair_order([old, young], now=now), lambda w: w.id, now=now)
    assert d.placed == [] and d.reservation is not None and d.reservation[0] == "big-0"
    assert d.closed_to(BORROWER) == {"big0", "big1"} and d.until == young.since + RESERVE_AFTER
    other = ({"big0", "big1"} - {d.reservation[1]}).pop()
    pool.release(on[other][0])  # a GPU frees on the big node that is not the head's
    pool.release(on["small0"][0])  # and one on a node the big request can never use
    newcomer = small_waiter(2, 10)
    placed = join_behind(pool, newcomer, d.closed_to(newcomer.priority))
    assert placed is not None and placed.node == "small0"
    assert join_behind(pool, small_waiter(3, 10), d.closed_to(BORROWER)) is None  # the big node's GPU stays free
    # a full pass gives the same answer: the young waiter may not take it either
    d2 = dispatch(pool, fair_order([old, young], "big-0", now=now), lambda w: w.id, d.reservation, now=now)
    assert d2.placed == [] and d2.reservation == d.reservation and d2.closed_to(BORROWER) == {"big0", "big1"}
    # without aging (or before the big request is old) it goes to the small waiter
    d3 = dispatch(pool, fair_order([old, young], "big-0"), lambda w: w.id, d.reservation)
    assert [(w.id, p.node) for w, p in d3.placed] == [("s1", other)]


@pytest.mark.parametrize("seed", range(6))
def test_a_newcomer_put_behind_a_sorted_queue_lands_where_a_full_sort_puts_it(seed):
    # Every spawn of a full pool joins the queue and asks its position: the service puts the
    # newcomer into the order it has (FairOrder.behind) instead of sorting thousands again.
    # Whatever the classes, rounds, head, held servers and ages, that must be the full sort's answer.
    rng = random.Random(seed)
    users = [f"u{i}" for i in range(6)]
    running = {u: rng.randrange(3) for u in users if rng.random() < 0.5}
    now = T0 + timedelta(minutes=30)
    waiters = [Waiter(f"w{i}", rng.choice(users), str(i), Request(gpus=1), T0 + timedelta(seconds=rng.randrange(1800)),
                      rng.choice((UNDER_QUOTA, BORROWER))) for i in range(40)]
    head = rng.choice(waiters).id
    order = FairOrder.of(waiters, head, running, now=now)
    assert order.waiters == fair_order(waiters, head, running, now=now)
    hits = 0
    for i in range(40, 120):
        now += timedelta(seconds=rng.choice((0, 0, 1, 5)))
        # random ids, like the service's: a newcomer from the same second may sort before others
        w = Waiter(f"{rng.randrange(16 ** 8):08x}", rng.choice(users), str(i), Request(gpus=1), now,
                   rng.choice((UNDER_QUOTA, BORROWER)))
        if order.until is not None and now >= order.until:  # someone turns old: the service sorts again
            order = FairOrder.of(waiters, head, running, now=now)
        else:  # nobody turned old: the order still stands
            assert FairOrder.of(waiters, head, running, now=now).waiters == order.waiters
        waiters.append(w)
        full = FairOrder.of(waiters, head, running, now=now)
        put = order.behind(w, running)
        if put is None:  # its user has a waiter of its class from the same second with a greater id
            assert any(x.priority == w.priority and x.user == w.user and x.since == w.since and x.id > w.id
                       for x in waiters[:-1])
            order = full
            continue
        assert put.waiters == full.waiters and put.keys == full.keys, i
        assert put.until == full.until  # when the order next changes by itself: the first young waiter turns old
        order = put
        hits += 1
    assert hits >= 60  # nearly every newcomer is put in place without a sort


@pytest.mark.parametrize("seed", range(6))
def test_an_order_rekeyed_after_starts_and_releases_is_the_full_sorts(seed):
    # A replay keeps the fair order through every start and release (FairOrder.rekeyed moves
    # only that user's waiters) instead of sorting thousands again: whatever the classes,
    # rounds, head, ages and same-second arrivals, the answer must be the full sort's.
    rng = random.Random(seed)
    users = [f"u{i}" for i in range(5)]
    running = {u: rng.randrange(3) for u in users}
    now = T0 + timedelta(minutes=30)
    waiters = [Waiter(f"w{i:03d}", rng.choice(users), "", Request(gpus=1),
                      T0 + timedelta(seconds=rng.randrange(0, 1800, 60)), rng.choice((UNDER_QUOTA, BORROWER)))
               for i in range(60)]
    head = rng.choice(waiters).id
    order = FairOrder.of(waiters, head, running, now=now)
    for _ in range(80):
        user, gone = rng.choice(users), None
        mine = [w for w in waiters if w.user == user and w.id != head]
        if mine and rng.random() < 0.5:  # one of its waiters starts: it leaves the queue, one more runs
            gone = rng.choice(mine).id
            waiters = [w for w in waiters if w.id != gone]
            running[user] += 1
        elif running[user] and rng.random() < 0.5:  # one of its servers ends
            running[user] -= 1
        else:  # one starts that never waited
            running[user] += 1
        order = order.rekeyed(user, running, head, gone)
        full = FairOrder.of(waiters, head, running, now=now)
        assert [w.id for w in order.waiters] == [w.id for w in full.waiters] and order.keys == full.keys
        assert order.next_round == full.next_round and order.latest == full.latest
        assert full.until is None or order.until <= full.until  # the caller sorts again no later than needed


def test_a_newcomer_behind_only_old_waiters_is_when_the_order_next_changes():
    # everyone has waited past RESERVE_AFTER: the order stands until the newcomer turns old
    now = T0 + timedelta(hours=1)
    old = [waiter(i) for i in range(3)]
    order = FairOrder.of(old, None, {}, now=now)
    assert order.until is None
    new = Waiter("new", "user9", "", Request(gpus=1), now)
    put = order.behind(new, {})
    assert put is not None and put.waiters == old + [new]
    assert put.until == now + RESERVE_AFTER == FairOrder.of(old + [new], None, {}, now=now).until


# ---------------------------------------------------------------- nodes kept for requests that fit few

@pytest.mark.parametrize("aging", [False, True])
def test_a_young_big_waiters_nodes_are_kept_from_small_waiters_ahead_of_it(aging):
    """The pool is full; a 1-GPU request waits ahead of an 8-GPU, 120-CPU one that fits only
    the two big nodes (a quarter of the nodes: within what may be closed). big0 drains. With
    ``now`` (the hub's rules) the big request starts there at once, young as it is, and the
    1-GPU request waits for a small node: it fits elsewhere, the big one nowhere else. Without
    ``now`` (one reserved node) the 1-GPU request, ahead in the order, takes big0."""
    pool = big_and_small_pool()
    for n, g in [(n, g) for n in ("big0", "big1") for g in range(8)] + [(f"small{i}", 0) for i in range(6)]:
        pool.allocate(f"held-{n}-{g}", Request(gpus=1, required=frozenset({f"{n}/gpu{g}"}), **SMALL))
    for g in range(8):
        pool.release(f"held-big0-{g}")
    queue = [small_waiter(0, 0), big_waiter(0, 0.5)]
    now = T0 + timedelta(minutes=1)  # nobody is old yet
    kw = {"now": now} if aging else {}
    d = dispatch(pool, fair_order(queue, **kw), lambda w: w.id, **kw)
    started = {w.id: p.node for w, p in d.placed}
    assert started == ({"big-0": "big0"} if aging else {"s0": "big0"})
    if aging:  # the big one started: nobody waits for the big nodes, so they are not kept from a
        # newcomer (a GPU left free for nobody while someone waits is what the queue must not do)
        pool.release("held-big1-0")
        newcomer = small_waiter(1, 1)
        assert not d.closed_to(newcomer.priority) & {"big0", "big1"}
        got = join_behind(pool, newcomer, d.closed_to(newcomer.priority))
        assert got is not None and got.node == "big1"
