"""The pure parts of the pages: chart geometry, the daily series from ledger entries,
the forecast sentence, holder colours, and the grant form's rules."""

from __future__ import annotations

import re
from datetime import date, datetime, time, timedelta, timezone
from decimal import Decimal

import pytest

from gpupool_hub.ledger import Posting
from gpupool_hub.service.pages.admin import GrantError, parse_grant
from gpupool_hub.service.pages.charts import (
    DayPoint,
    balance_chart,
    gpu_cell,
    holder_colours,
    nice_ticks,
    stacked_bars,
)
from gpupool_hub.service.pages.usage import daily_series, forecast_text, local_days
from tests.fixtures.manager import Clock, make_manager

A6000 = "NVIDIA RTX A6000"
RTX3090 = "NVIDIA GeForce RTX 3090"
NODES = [{"name": "n1", "cpu_milli": 8000, "memory_mib": 32768, "gpus": {"count": 2, "model": A6000}}]
D = Decimal


@pytest.mark.parametrize("low, high, expected", [
    (D(0), D(100), [D(0), D(20), D(40), D(60), D(80), D(100)]),
    (D(-10), D(100), [D(-25), D(0), D(25), D(50), D(75), D(100)]),
    (D(0), D(0), [D(0), D("0.2"), D("0.4"), D("0.6"), D("0.8"), D(1)]),
    (D("-3.5"), D("1.2"), [D(-4), D(-3), D(-2), D(-1), D(0), D(1), D(2)]),
])
def test_nice_ticks_cover_the_range_with_round_steps(low, high, expected):
    assert nice_ticks(low, high) == expected


def test_balance_chart_places_points_by_value_and_marks_credits_and_debits():
    days = [date(2025, 3, 1) + timedelta(days=i) for i in range(3)]
    chart = balance_chart([DayPoint(days[0], D(0)), DayPoint(days[1], D(100), credits=D(100)),
                           DayPoint(days[2], D("97.5"), debits=D("-2.5"))], floor=D(-10))
    assert [p.value for p in chart.points] == ["0.000", "100.000", "97.500"]
    assert [(p.credits, p.debits) for p in chart.points] == [(None, None), ("100.000", None), (None, "-2.500")]
    # higher balances are higher up (smaller y); the floor lies below zero
    assert chart.points[1].y < chart.points[2].y < chart.points[0].y < chart.floor_y  # type: ignore[operator]
    assert chart.points[0].y == chart.zero_y
    assert chart.points[0].x == chart.left and chart.points[-1].x == chart.right
    assert chart.path.startswith(f"M{chart.points[0].x},{chart.points[0].y} L")
    assert chart.x_ticks[-1].label == "Mar 3"


def test_stacked_bars_stack_models_per_day_and_total_them():
    days = [date(2025, 3, 1), date(2025, 3, 2)]
    chart = stacked_bars(days, {days[1]: {A6000: D(8), RTX3090: D(2)}})
    first, second = chart.bars
    assert first.segments == [] and first.total == "0.000"
    assert second.total == "10.000"
    assert [(s.model, s.value) for s in second.segments] == [(RTX3090, "2.000"), (A6000, "8.000")]
    low, high = second.segments
    assert high.y + high.height == pytest.approx(low.y)  # stacked: A6000 sits on top of the 3090 part
    assert high.height == pytest.approx(4 * low.height)
    assert chart.legend == [(RTX3090, 0), (A6000, 1)] and not chart.empty
    assert stacked_bars(days, {}).empty


def test_gpu_cells_draw_shares_as_parts_and_reserved_gpus_apart():
    who = {"a1": ("carol", "x", False), "a2": ("dave", "", True)}
    colours = holder_colours(["carol", "dave", "(reserved)"])
    shared = gpu_cell({"index": 2, "uuid": "GPU-2", "model": A6000, "holders": {"a1": 500, "a2": 250}}, who, colours)
    assert shared.state == "shared" and shared.free_fraction == "0.250"
    assert [(p.user, p.fraction, p.x, p.width, p.borrowed) for p in shared.parts] == [
        ("carol", "0.500", 0, 50, False), ("dave", "0.250", 50, 25, True)]
    held = gpu_cell({"index": 0, "uuid": "GPU-0", "model": A6000, "holders": {"rc": 1000}}, who, colours)
    assert held.state == "held" and held.parts[0].reserved and held.parts[0].user == "(reserved)"
    free = gpu_cell({"index": 1, "uuid": "GPU-1", "model": A6000, "holders": {}}, who, colours)
    assert free.state == "free" and free.parts == [] and free.free_fraction == "1.000"


def test_holder_colours_are_stable_per_user_and_distinct_on_a_page():
    names = [f"user{i}" for i in range(12)]
    colours = holder_colours(names)
    assert len(set(colours.values())) == 12
    # the alphabetically first holder always keeps its own colour, whoever else is on the page
    assert holder_colours(["user0"])["user0"] == colours["user0"]
    assert holder_colours(["alice", "bob"]) == holder_colours(["bob", "alice"])


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.integration)])
def db_url(request):
    """The daily sums are computed in SQL: check them in both databases."""
    return "sqlite://" if request.param == "sqlite" else request.getfixturevalue("postgres_url")


def series(m, user, days, now):
    """What the usage page computes: the local days, their totals read from the ledger, the series."""
    day_list = local_days(now, m.settings.tz, days)
    starts = [datetime.combine(d, time.min, m.settings.tz) for d in day_list]
    return (*daily_series(m.ledger.reports.daily_totals(user, starts), day_list), day_list)


def test_daily_series_adds_up_to_the_real_balance_and_buckets_spend_by_usage_day(db_url):
    clock = Clock(datetime(2025, 3, 10, 12, 0, tzinfo=timezone.utc))
    m = make_manager(NODES, {"RTX A6000": 4, "RTX 3090": 1}, db_url, clock=clock, initial_grant=100,
                     daily_credit=0, monthly_credit=0)
    m.accounts.ensure("alice")  # +100 on Mar 10
    ledger = m.ledger
    day8 = datetime(2025, 3, 8, 9, 0, tzinfo=timezone.utc)
    for key, kind, amount, model, at in [
        ("g1", "grant", D(20), None, day8),
        ("d1", "debit", D(-4), A6000, day8 + timedelta(hours=2)),
        ("d2", "debit", D("-0.5"), RTX3090, day8 + timedelta(hours=3)),
        ("d3", "debit", D(-4), A6000, datetime(2025, 3, 10, 1, 0, tzinfo=timezone.utc)),
    ]:
        ledger.post(Posting("alice", kind, amount, key, model=model,
                            interval_start=at - timedelta(hours=1) if kind == "debit" else None,
                            interval_end=at if kind == "debit" else None), now=at)
    points, spend, days = series(m, "alice", 30, clock())
    assert len(points) == 30 and days[-1] == date(2025, 3, 10) and days[0] == date(2025, 2, 9)
    by_day = {p.day: p for p in points}
    assert by_day[date(2025, 3, 7)].balance == 0
    assert by_day[date(2025, 3, 8)] == DayPoint(date(2025, 3, 8), D("15.5"), D(20), D("-4.5"))
    assert by_day[date(2025, 3, 9)].balance == D("15.5")
    assert by_day[date(2025, 3, 10)] == DayPoint(date(2025, 3, 10), D("111.5"), D(100), D(-4))
    assert by_day[date(2025, 3, 10)].balance == ledger.balance("alice")
    # d3 charged the hour 00:00-01:00 of Mar 10: spend on Mar 10
    assert spend == {date(2025, 3, 8): {A6000: D(4), RTX3090: D("0.5")}, date(2025, 3, 10): {A6000: D(4)}}


def test_daily_series_uses_the_pool_time_zone(db_url):
    clock = Clock(datetime(2025, 3, 10, 12, 0, tzinfo=timezone.utc))
    m = make_manager(NODES, {"RTX A6000": 4}, db_url, clock=clock, credit_timezone="America/New_York",
                     daily_credit=0, monthly_credit=0)
    m.accounts.ensure("alice")
    # 02:00 UTC on Mar 10 is still Mar 9 in New York (EST, UTC-5); 04:59 UTC on Mar 9 is Mar 8 (the
    # day before DST starts on Mar 9, 2025), and 05:00 UTC on Mar 9 is its first minute
    for key, at in (("late", datetime(2025, 3, 10, 2, 0)), ("edge-before", datetime(2025, 3, 9, 4, 59)),
                    ("edge-after", datetime(2025, 3, 9, 5, 0)), ("first", datetime(2025, 2, 9, 5, 0)),
                    ("too-early", datetime(2025, 2, 9, 4, 59))):
        m.ledger.post(Posting("alice", "grant", D(5), key), now=at.replace(tzinfo=timezone.utc))
    points, _, days = series(m, "alice", 30, clock())
    assert days[0] == date(2025, 2, 9)
    credits = {p.day: p.credits for p in points if p.credits}
    assert credits == {date(2025, 2, 9): D(5), date(2025, 3, 8): D(5), date(2025, 3, 9): D(10),
                       date(2025, 3, 10): D(100)}
    assert points[0].balance == D(10)  # the grant before the first day counts in the starting balance
    assert points[-1].balance == m.ledger.balance("alice")


def test_forecast_names_the_rate_and_when_the_floor_is_reached():
    now = datetime(2025, 3, 4, 10, 30, tzinfo=timezone.utc)  # a Tuesday
    me = {"burn_rate_per_hour": "3.500", "floor": "-10.000", "time_to_floor_seconds": 12600}
    said = forecast_text(me, now, timezone.utc)
    assert re.sub("<[^>]+>", "", said) == \
        "At \u22123.5/h you reach the floor (\u221210) on Tue 14:00 UTC: your GPU servers stop then."
    assert '<time datetime="2025-03-04T14:00:00Z"' in said  # the viewer's browser says it in its own zone
    me_later = {**me, "time_to_floor_seconds": 9 * 86400}
    assert re.sub("<[^>]+>", "", forecast_text(me_later, now, timezone.utc)).endswith(
        "on Thu 13 Mar 10:30 UTC: your GPU servers stop then.")
    assert forecast_text({**me, "time_to_floor_seconds": 0}, now, timezone.utc).startswith(
        "At \u22123.5/h you are at the floor")
    idle = {"burn_rate_per_hour": "0.000", "floor": "-10.000", "time_to_floor_seconds": None}
    assert forecast_text(idle, now, timezone.utc).startswith("Nothing is charging now")


@pytest.mark.parametrize("form, message", [
    ({"user": "", "amount": "1", "reason": "r", "key": "k"}, "Name the user"),
    ({"user": "u", "amount": "x", "reason": "r", "key": "k"}, "must be a plain decimal number"),
    ({"user": "u", "amount": "0", "reason": "r", "key": "k"}, "non-zero"),
    ({"user": "u", "amount": "2000", "reason": "r", "key": "k"}, "at most 1000"),
    ({"user": "u", "amount": "1.0001", "reason": "r", "key": "k"}, "three decimal places"),
    ({"user": "u", "amount": "1", "reason": "  ", "key": "k"}, "needs a reason"),
    ({"user": "u", "amount": "1", "reason": "r", "key": ""}, "idempotency key"),
])
def test_grant_form_rules(form, message):
    with pytest.raises(GrantError, match=message):
        parse_grant(form, 1000)
    assert parse_grant({"user": " u ", "amount": "-2.5", "reason": " why ", "key": "k"}, 1000) == (
        "u", D("-2.5"), "why", "k")
