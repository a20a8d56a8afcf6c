"""Wait estimates learned from the pool's history, in the service core (in-process ledger,
manual clock): the range a waiter is shown, its record against the real start, and the
accuracy the admin view publishes."""

from __future__ import annotations

from datetime import timedelta

import sqlalchemy as sa

from gpupool_hub.ledger.schema import estimates
from tests.service.test_queue import admit, manager, queued
from tests.fixtures.manager import Clock
from tests.service.openapi import check
from gpupool_hub.queue.calibration import MIN_CALIBRATION
from gpupool_hub.queue.shown import DEADLINE_NOTE, FALLBACK_NOTE


def past_sessions(m, clock, minutes=range(1, 21)):
    """ann's past sessions on the one GPU: 1, 2, ..., 20 minutes."""
    for k in minutes:
        held = admit(m, "ann")
        clock.advance(60 * k)
        m.admission.release(held.id, "server stopped")
        clock.advance(5)


def keep_waiting(m, clock, seconds, user="bob"):
    """The spawner's retries while ``seconds`` pass (an entry nobody asks for is dropped)."""
    for _ in range(int(seconds // 20)):
        clock.advance(20)
        queued(m, user)
    clock.advance(seconds % 20)


def test_without_history_the_wait_is_todays_rule_and_says_so(tmp_path):
    clock = Clock()
    m = manager(tmp_path, clock=clock)
    admit(m, "alice")
    r = queued(m, "bob")
    assert r.details["eta_basis"] == "fallback"
    assert r.details["eta_low"] == r.details["eta_high"] == r.details["eta"] == "2025-03-03T13:00:00Z"
    assert r.details["eta_source"] == "typical"
    assert r.message == ("You are 1st in the queue, about 4.0 hours "
                         f"({FALLBACK_NOTE} of 4 h).")


def test_a_figure_from_a_holders_floor_deadline_says_so_and_holds_steady(tmp_path):
    # issue 39.3: alice's tokens reach the floor in about 9 minutes, which stops her server;
    # bob, waiting for her GPU, reads that figure with that source (not "the typical session"),
    # and as her balance is debited the figure counts down instead of bouncing 9, 8, 9
    from decimal import Decimal

    clock = Clock()
    m = manager(tmp_path, clock=clock)
    admit(m, "alice")  # opens her account with its first credit
    floor = m.settings.base_rules().floor
    m.accounts.grant("alice", floor + Decimal("0.15") - m.ledger.balances(["alice"])["alice"],
                     "test: 9 minutes above the floor at 1 token an hour", "test", None)
    r = queued(m, "bob")
    assert r.details["eta_source"] == "deadline"
    assert r.message == f"You are 1st in the queue, about 9 minutes ({DEADLINE_NOTE})."
    minutes = []
    for _ in range(6):
        keep_waiting(m, clock, 20)
        r = queued(m, "bob")
        assert r.details["eta_source"] == "deadline"
        minutes.append(int(r.message.split("about ")[1].split(" ")[0]))
    assert minutes == sorted(minutes, reverse=True) and minutes[-1] in (7, 8)
    # the widget (GET me) reads the same steady figure and source as the progress page
    (mine,) = m.queue.reports.waiting_of("bob")
    assert (mine["eta_low"], mine["eta_source"]) == (r.details["eta_low"], "deadline")


def test_history_gives_a_range_that_is_recorded_and_scored_against_the_real_start(tmp_path):
    clock = Clock()
    m = manager(tmp_path, clock=clock)
    past_sessions(m, clock)
    held = admit(m, "alice")
    r = queued(m, "bob")
    # alice's server just started; past sessions lasted 1..20 min: the 20th-80th percentile
    assert r.details["eta_basis"] == "history"
    assert r.details["eta_text"] in ("about 4–16 min", "about 4–17 min", "about 3–16 min")
    assert r.message == f"You are 1st in the queue, {r.details['eta_text']}."
    # the admin view and the user's GET me show the same range
    report = m.queue.reports.report()
    check("Queue", report)
    check("Waiting", m.queue.reports.waiting_of("bob")[0])
    assert report["waiting"][0]["eta_text"] == r.details["eta_text"]
    assert m.queue.reports.waiting_of("bob")[0]["eta_text"] == r.details["eta_text"]
    assert report["accuracy"]["starts"] == 0 and "no waiting server has started" in report["accuracy"]["text"]

    keep_waiting(m, clock, 11 * 60)  # alice stops after 11 minutes: inside the range, 10 % off the median
    m.admission.release(held.id, "server stopped")
    queued_again = admit(m, "bob")  # his retry claims the reserved GPU
    assert queued_again.user == "bob"
    acc = m.queue.reports.report()["accuracy"]
    assert acc["starts"] == 1 and acc["in_range"] == 1.0 and acc["median_error"] < 0.15
    assert acc["text"].startswith("last 30 days: 100 % of starts inside the range")


def test_the_shown_estimate_is_recorded_once_per_entry(tmp_path):
    clock = Clock()
    m = manager(tmp_path, clock=clock)
    past_sessions(m, clock)
    held = admit(m, "alice")
    first = queued(m, "bob").details
    keep_waiting(m, clock, 120)  # a retry shows a newer estimate, but the one kept is the first
    m.queue._shown.clear()  # even after a restart of the service
    queued(m, "bob")
    keep_waiting(m, clock, 60)
    m.admission.release(held.id, "server stopped")
    entry_id = admit(m, "bob").id
    rows = m.ledger.queue.started_estimates(clock.now.replace(year=2024))
    assert len(rows) == 1
    low, mid, high, real = rows[0]
    assert real == 180.0
    assert abs(low - (eta_seconds(first["eta_low"], first["since"]))) <= 1
    # a second start of the same entry (a replayed claim) keeps the first time
    clock.advance(30)
    m.ledger.queue.estimate_started(entry_id, clock.now)
    assert m.ledger.queue.started_estimates(clock.now.replace(year=2024)) == rows


def eta_seconds(at: str, since: str) -> float:
    from datetime import datetime

    def parse(s: str) -> datetime:
        return datetime.fromisoformat(s.replace("Z", "+00:00"))

    return (parse(at) - parse(since)).total_seconds()


def test_the_spawn_page_says_full_with_the_range():
    from datetime import datetime, timezone

    from gpupool_hub.spawner.wait_rules import full_text

    now = datetime(2025, 3, 3, 9, 0, tzinfo=timezone.utc)
    entries = [{"waiting": 2, "eta": "2025-03-03T09:20:00Z", "eta_low": "2025-03-03T09:20:00Z",
                "eta_high": "2025-03-03T09:45:00Z", "eta_text": "about 20–45 min", "eta_basis": "history"}]
    assert full_text(entries, now) == "full — 2 waiting, about 20–45 min"
    # today's rule keeps today's text
    assert full_text([{**entries[0], "eta_basis": "fallback"}], now) == "full — 2 waiting, about 20 min"


def test_a_full_model_shows_an_estimate_before_anyone_waits(tmp_path):
    # issue 39.3: alice holds the one GPU, nobody waits yet: the spawn page's profile for it
    # already says when a GPU is expected, with the range learned from past sessions
    from gpupool_hub.spawner.wait_rules import full_text

    clock = Clock()
    m = manager(tmp_path, clock=clock)
    past_sessions(m, clock)
    admit(m, "alice")
    (entry,) = m.queue.reports.summary().values()
    assert entry["waiting"] == 0 and entry["eta_basis"] == "history" and entry["eta_source"] == "history"
    assert full_text([entry], clock()) == f"full — none waiting, {entry['eta_text']}"
    assert entry["eta_text"].startswith("about ")


def test_the_range_is_calibrated_on_how_far_off_past_estimates_were(tmp_path):
    """Worked example: 51 past waiters whose real wait was 1.0, 1.04, ..., 3.0 times the model's
    estimate (plus the 15 s pad). The next range is the model's estimate scaled by their 5th
    and 95th percentiles (the middle 90 % of the misses, eta.COVERAGE), 1.1 and 2.9, and
    recorded with the model's own estimate."""
    clock = Clock()
    m = manager(tmp_path, clock=clock)
    past_sessions(m, clock)
    for i in range(51):
        ratio = 1 + 0.04 * i
        shown_at = clock.now - timedelta(hours=2, minutes=i)
        m.ledger.queue.estimate_shown(f"past{i}", "carol", shown_at, [0, 0, 0], "history", 285)
        m.ledger.queue.estimate_started(f"past{i}", shown_at + timedelta(seconds=300 * ratio - 15))
    admit(m, "alice")
    r = queued(m, "bob")
    entry = m.queue.reports.waiting_of("bob")[0]
    with m.ledger.db.engine.begin() as conn:
        model_s = conn.execute(sa.select(estimates.c.model_s).where(estimates.c.user == "bob")).scalar_one()
    assert model_s is not None and model_s > 0
    low, high = (eta_seconds(r.details[k], entry["since"]) for k in ("eta_low", "eta_high"))
    assert abs(low - ((model_s + 15) * 1.1 - 15)) <= 1.5  # model_s was stored rounded to the second
    assert abs(high - ((model_s + 15) * 2.9 - 15)) <= 1.5
    assert r.details["eta_basis"] == "history"


def test_too_few_past_starts_leave_the_models_own_range(tmp_path):
    clock = Clock()
    m = manager(tmp_path, clock=clock)
    past_sessions(m, clock)
    for i in range(MIN_CALIBRATION - 1):  # one short: the ratios of 3 are not used
        shown_at = clock.now - timedelta(hours=2, minutes=i)
        m.ledger.queue.estimate_shown(f"past{i}", "carol", shown_at, [0, 0, 0], "history", 285)
        m.ledger.queue.estimate_started(f"past{i}", shown_at + timedelta(seconds=900 - 15))
    admit(m, "alice")
    assert queued(m, "bob").details["eta_text"] in ("about 4–16 min", "about 4–17 min", "about 3–16 min")


def test_freed_gpus_are_weighed_against_what_went_to_waiters(tmp_path):
    # every GPU a holder frees goes to the next waiter on his retry: the estimates learn that all
    # of what frees serves the queue
    clock = Clock()
    m = manager(tmp_path, clock=clock)
    past_sessions(m, clock)
    held = admit(m, "alice")
    for i in range(10):
        user = f"user{i}"
        queued(m, user)
        keep_waiting(m, clock, 60, user=user)
        m.admission.release(held.id, "server stopped")
        held = admit(m, user)  # the retry claims the freed GPU
        assert held.user == user
    rates = m.queue.eta.served.rates(clock().timestamp())
    assert rates is not None and rates.used(None) == 1.0
    r = queued(m, "zoe")
    assert r.details["eta_basis"] == "history"


EIGHT_GPUS = [{"name": "node-a", "cpu_milli": 64000, "memory_mib": 262144,
               "gpus": [{"index": i, "uuid": f"GPU-{i}", "model": "NVIDIA GeForce RTX 3090"} for i in range(8)]}]


def test_a_burst_after_quiet_minutes_is_estimated_from_how_fast_gpus_free_now(tmp_path):
    # ten waiters were served in quiet minutes, then in the last minute six holders stopped and
    # newcomers took their GPUs at once (nobody waited). Three join the queue of the full pool:
    # each is told what six GPUs freed in two minutes say (20 s a GPU), not what the ten starts
    # since the quiet minutes averaged (39 s a GPU: 19–78 s for the first)
    clock = Clock()
    m = manager(tmp_path, nodes=EIGHT_GPUS, clock=clock)
    past_sessions(m, clock)
    held = [admit(m, f"holder{i}") for i in range(8)]
    for i in range(10):
        queued(m, f"quiet{i}")
        keep_waiting(m, clock, 20, user=f"quiet{i}")
        m.admission.release(held.pop(0).id, "server stopped")
        held.append(admit(m, f"quiet{i}"))
    clock.advance(150)
    for i in range(6):
        clock.advance(10)
        m.admission.release(held.pop(0).id, "server stopped")
        held.append(admit(m, f"new{i}"))  # starts at once: the queue is empty
    since = clock.now.isoformat()
    texts = []
    for user in ("xia", "yan", "zed"):
        r = queued(m, user)
        assert r.details["eta_basis"] == "history"
        # no record of misses yet: the point estimate halved to doubled
        point = r.details["position"] * 1000 / (6 * 1000 / 120)
        assert (eta_seconds(r.details["eta_low"], since), eta_seconds(r.details["eta_high"], since)) == \
            (point / 2, point * 2)
        texts.append(r.details["eta_text"])
    assert texts[0] == "under 2 min"
