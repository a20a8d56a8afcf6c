"""Issue 39.6: GPU servers stop when the balance reaches the floor, not a debit later.

The debit job charges GPU time after its interval closes (an hour as shipped), so
the posted balance lags what a running server owes. The floor rule, the widget's
"floor in" and ``floor_at`` count the GPU time used since the last charged interval;
the stop comes at the moment the floor is reached (within a cull run), and the debit
that follows leaves the balance at the floor rather than an interval's price below it.
In process: the real core (ledger, admission, debits, notices) and the real cull job,
with a recording stand-in for the hub's stop call."""

from __future__ import annotations

import asyncio
from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest

from gpupool_hub.money.credits import floor_reached_at, uncharged_cost
from gpupool_hub.service.core.admission import parse_request
from tests.fixtures.cull import RecordingHub, cull_job
from tests.fixtures.manager import Clock, make_manager

A6000 = "NVIDIA RTX A6000"
NODES = [{"name": "node-a", "cpu_milli": 8000, "memory_mib": 32768, "gpus": {"count": 2, "model": A6000}}]
T0 = datetime(2025, 3, 3, 9, 0, tzinfo=timezone.utc)  # a debit interval starts here (hourly, as shipped)


@pytest.mark.parametrize("held, now, owed", [
    ([], T0 + timedelta(hours=1), Decimal(0)),
    ([(Decimal(4), T0)], T0 + timedelta(minutes=15), Decimal(1)),
    # started before the last charged interval ended: only the time since counts
    ([(Decimal(4), T0 - timedelta(hours=2))], T0 + timedelta(minutes=15), Decimal(1)),
    # started after: from its start; two servers add up
    ([(Decimal(4), T0 + timedelta(minutes=30)), (Decimal("0.5"), T0)], T0 + timedelta(minutes=45),
     Decimal(1) + Decimal("0.375")),
    ([(Decimal(3), T0)], T0 + timedelta(seconds=1), Decimal(3) / 3600),  # exact, not rounded
])
def test_uncharged_cost(held, now, owed):
    assert uncharged_cost(held, T0, now) == owed


def test_floor_reached_at_counts_uncharged_time():
    held = [(Decimal(4), T0)]
    # −9 posted at 9:00; at 4/h the floor (−10) is 15 minutes on, whenever asked
    for minutes in (0, 5, 14):
        now = T0 + timedelta(minutes=minutes)
        assert floor_reached_at(Decimal(-9), Decimal(-10), held, T0, now) == T0 + timedelta(minutes=15)
    assert floor_reached_at(Decimal(-9), Decimal(-10), held, T0, T0 + timedelta(minutes=20)) == \
        T0 + timedelta(minutes=20)  # past it: now
    assert floor_reached_at(Decimal(-9), Decimal(-10), [], T0, T0) is None  # nothing charging


def at_minus_nine(tmp_path):
    """alice holds one A6000 (4 tokens/h) from 9:00 with −9 tokens posted: the floor (−10)
    is 15 minutes away, and the next debit (of 9:00–10:00) only at 10:00."""
    m = make_manager(NODES, {"RTX A6000": 4}, f"sqlite:///{tmp_path / 'l.sqlite'}", clock=Clock(T0), epoch=T0)
    m.admission.admit("alice", [], "", parse_request({"gpus": 1}))
    m.accounts.grant("alice", Decimal(-109), "test: near the floor", "test", None)
    assert m.ledger.balance("alice") == Decimal(-9)
    return m


def test_the_widget_counts_down_to_the_floor_between_debits(tmp_path):
    m = at_minus_nine(tmp_path)
    m.clock.advance(10 * 60)
    me = m.views.me("alice")
    # the balance is still the posted −9 (nothing charged since 9:00) …
    assert me["balance"] == "-9.000"
    # … but 10 minutes of GPU time are owed: 5 minutes left, not the 15 the posted balance says
    assert me["time_to_floor_seconds"] == 300 and me["floor_at"] == "2025-03-03T09:15:00Z"
    m.clock.advance(2 * 60)
    again = m.views.me("alice")  # the cached view, two minutes on: the countdown moves, floor_at stays
    assert again["time_to_floor_seconds"] == 180 and again["floor_at"] == me["floor_at"]


def test_the_floor_stops_the_server_when_reached_not_a_debit_later(tmp_path):
    m = at_minus_nine(tmp_path)
    hub = RecordingHub()
    job = cull_job(m, hub)
    m.clock.advance(14 * 60)  # owes −9.933: above the floor
    asyncio.run(job())
    assert hub.stopped == []
    m.clock.advance(60)  # 9:15: −10.000 owed, while the posted balance still says −9
    asyncio.run(job())
    assert hub.stopped == [("alice", "")]
    assert m.ledger.allocations.active("alice") == []
    [notice] = m.views.me("alice")["notices"]
    assert notice["kind"] == "floor_stop"
    assert notice["title"] == "Your GPU server was stopped because your balance reached the floor (\u221210 tokens)"
    assert notice["what"] == "Your GPU server was stopped"
    # a researcher's words, not the audit's "balance -10.000 (…) is at or below the floor -10"
    assert "-10" not in notice["why"] and "at or below" not in notice["why"] and "start again" in notice["why"]
    # the debit of 9:00–10:00 charges the 15 minutes held: the balance ends at the floor, not at
    # −13 (an hour's price below −9), where the stop at the first debit past the floor left it
    m.clock.advance(45 * 60)
    assert m.debits.debit_due() == 1
    assert m.ledger.balance("alice") == Decimal("-10.000")
    audit = [e for e in m.ledger.audit.of_user("alice", ["stop_server"])]
    assert audit[0].detail["floor"] == "-10" and audit[0].detail["balance"] == "-10.000"
    assert "not charged yet" in audit[0].reason
