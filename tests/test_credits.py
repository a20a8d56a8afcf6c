from datetime import date, datetime, timezone
from decimal import Decimal
from zoneinfo import ZoneInfo

import pytest

from gpupool_hub.money.credits import (CreditRules, CreditDay, affording_credit, balance_status, can_start,
    hours_bought, start_need, capped, due_credits, next_credit_times, rules_for_groups)

UTC = ZoneInfo("UTC")
RULES = CreditRules()


def at(y, m, d, h=12):
    return datetime(y, m, d, h, tzinfo=timezone.utc)


def test_new_account_gets_the_initial_grant_only():
    due = due_credits("alice", RULES, None, at(2026, 11, 21), UTC)
    assert [(c.kind, c.amount) for c in due] == [("grant", Decimal(100))]


def test_forty_days_of_downtime_yield_forty_dailies_and_the_monthly_between():
    due = due_credits("alice", RULES, date(2026, 10, 12), at(2026, 11, 21), UTC)
    daily = [c for c in due if c.kind == "daily"]
    monthly = [c for c in due if c.kind == "monthly"]
    assert len(daily) == 40
    assert [c.day for c in monthly] == [date(2026, 11, 1)]
    assert sum(c.amount for c in due) == Decimal(70)
    assert len({c.key for c in due}) == len(due)  # every credit has its own key


def test_catch_up_is_idempotent_by_key():
    once = due_credits("alice", RULES, date(2026, 10, 12), at(2026, 11, 21), UTC)
    split = due_credits("alice", RULES, date(2026, 10, 12), at(2026, 11, 1), UTC) + due_credits(
        "alice", RULES, date(2026, 11, 1), at(2026, 11, 21), UTC
    )
    assert [c.key for c in once] == [c.key for c in split]


def test_nothing_due_twice_on_the_same_day():
    assert due_credits("alice", RULES, date(2026, 11, 21), at(2026, 11, 21, 23), UTC) == []


def test_credit_day_follows_the_configured_time_zone():
    # 23:30 UTC on Nov 21 is already Nov 22 in Berlin.
    berlin = ZoneInfo("Europe/Berlin")
    due = due_credits("alice", RULES, date(2026, 11, 21), datetime(2026, 11, 21, 23, 30, tzinfo=timezone.utc), berlin)
    assert [c.day for c in due] == [date(2026, 11, 22)]


def test_keys_cannot_collide_for_odd_usernames():
    a = due_credits("a:b", RULES, date(2026, 11, 20), at(2026, 11, 21), UTC)
    b = due_credits("a", RULES, date(2026, 11, 20), at(2026, 11, 21), UTC)
    assert a[0].key != b[0].key


def test_cap_clips_credits_but_never_takes_tokens():
    assert capped(Decimal(30), Decimal(90), Decimal(100)) == 10
    assert capped(Decimal(30), Decimal(120), Decimal(100)) == 0
    assert capped(Decimal(30), Decimal(120), None) == 30


def test_group_overrides_take_the_most_generous_value():
    overrides = {
        "faculty": {"initial": Decimal(500), "floor": Decimal(-20)},
        "staff": {"initial": Decimal(200), "monthly": Decimal(50), "floor": Decimal(-50)},
    }
    r = rules_for_groups(RULES, overrides, ["staff", "faculty", "students"])
    assert (r.initial, r.monthly, r.daily, r.floor) == (500, 50, 1, -50)
    assert rules_for_groups(RULES, overrides, ["students"]) == RULES
    # order of groups never matters
    assert rules_for_groups(RULES, overrides, ["faculty", "staff"]) == rules_for_groups(
        RULES, overrides, ["staff", "faculty"]
    )


def test_floor_semantics():
    # Overdraft: starting may take the balance down to the floor, not below.
    assert can_start(Decimal(-6), Decimal(4), RULES)  # -6 - 4 = -10: at the floor, allowed
    assert not can_start(Decimal("-6.001"), Decimal(4), RULES)
    assert balance_status(Decimal(-10), RULES, Decimal(10)) == "floor"
    assert balance_status(Decimal("-0.001"), RULES, Decimal(10)) == "negative"
    assert balance_status(Decimal(5), RULES, Decimal(10)) == "low"
    assert balance_status(Decimal(50), RULES, Decimal(10)) == "fine"


def test_affording_credit_names_the_day_and_the_credit_that_makes_it_possible():
    # -9 with a 4 tokens/h profile needs -6: three daily credits away.
    found = affording_credit(Decimal(-9), Decimal(4), RULES, at(2026, 11, 21), UTC)
    assert found == CreditDay(datetime(2026, 11, 24, tzinfo=UTC), "daily")
    # The monthly credit on Dec 1 helps a user who is far behind: it, not the daily one, gets there.
    found = affording_credit(Decimal(-39), Decimal(4), RULES, at(2026, 11, 28), UTC)  # -37 on Nov 30, -6 on Dec 1
    assert found == CreditDay(datetime(2026, 12, 1, tzinfo=UTC), "monthly")
    # On the 1st a daily credit that alone suffices is the one named.
    assert affording_credit(Decimal("-6.5"), Decimal(4), RULES, at(2026, 11, 30), UTC).kind == "daily"
    # Servers already running count: 2.5 tokens/h held plus 4 needs 6.5 above the floor.
    assert affording_credit(Decimal(-5), Decimal(4), RULES, at(2026, 11, 21), UTC) is None
    held = affording_credit(Decimal(-5), Decimal(4), RULES, at(2026, 11, 21), UTC, held_per_hour=Decimal("2.5"))
    assert held == CreditDay(datetime(2026, 11, 23, tzinfo=UTC), "daily")  # -3.5 on Nov 23
    assert affording_credit(Decimal(-40), Decimal(4), CreditRules(daily=Decimal(0), monthly=Decimal(0)),
                            at(2026, 11, 28), UTC) is None


def test_start_need_and_hours_bought():
    assert start_need(Decimal(4), Decimal("2.5"), Decimal(1)) == Decimal("6.5")
    assert start_need(Decimal("0.5"), min_hours=Decimal(3)) == Decimal("1.5")
    assert can_start(Decimal("-3.5"), Decimal(4), RULES, held_per_hour=Decimal("2.5"))  # -3.5 - 6.5 = -10
    assert not can_start(Decimal("-3.501"), Decimal(4), RULES, held_per_hour=Decimal("2.5"))
    assert hours_bought(Decimal(100), Decimal(-10), Decimal(4)) == Decimal("27.5")
    assert hours_bought(Decimal("-10.2"), Decimal(-10), Decimal(4)) == 0  # below the floor: nothing, never 9.9 h
    assert hours_bought(Decimal(5), Decimal(-10), Decimal(0)) is None


def test_next_credit_times():
    daily, monthly = next_credit_times(at(2026, 12, 31, 10), UTC)
    assert daily == datetime(2027, 1, 1, tzinfo=UTC) == monthly


@pytest.mark.parametrize("bad", [{"daily": -1}, {"floor": 5}, {"initial": "lots"}, {"bonus": 3}])
def test_bad_rules_name_the_key(bad):
    with pytest.raises(ValueError) as e:
        CreditRules.from_config(bad, where="c.GPUPool.group_credits['x']")
    assert "c.GPUPool.group_credits['x']" in str(e.value)
