"""Exact amounts: what ``parse_amount`` accepts from people (plain decimals) and from configs (numbers)."""

from __future__ import annotations

from decimal import Decimal

import pytest

from gpupool_hub.money.units import AmountError, parse_amount


@pytest.mark.parametrize("value, expected", [
    ("12", Decimal(12)), ("-2.5", Decimal("-2.5")), ("+0.125", Decimal("0.125")), ("007", Decimal(7)),
    (12, Decimal(12)), (-3, Decimal(-3)), (Decimal("1.5"), Decimal("1.5")),
    (0.1, Decimal("0.1")), (1e-5, Decimal("0.00001")), (2.0, Decimal("2.0")),  # configs write floats
])
def test_plain_decimals_and_numbers_are_amounts(value, expected):
    assert parse_amount(value) == expected


@pytest.mark.parametrize("value, message", [
    ("1E+1000000", "plain decimal"), ("1e-999999999", "plain decimal"), ("1e3", "plain decimal"),
    ("5_000", "plain decimal"), ("\uff11\uff12", "plain decimal"), ("\u0663", "plain decimal"),
    (" 7", "plain decimal"), ("7.", "plain decimal"), (".5", "plain decimal"), ("", "plain decimal"),
    ("NaN", "plain decimal"), ("Infinity", "plain decimal"), ("1" * 41, "plain decimal"),
    (float("nan"), "finite"), (float("inf"), "finite"), (True, "boolean"), (None, "number"),
    ("1000000001", "range"), (10**400, "range"), (1e300, "range"),
])
def test_12_8_anything_else_is_refused(value, message):
    with pytest.raises(AmountError, match=message):
        parse_amount(value)


def test_places_refuses_finer_amounts():
    assert parse_amount("1.250", places=3) == Decimal("1.25")
    with pytest.raises(AmountError, match="more than 3 decimal places"):
        parse_amount("1.0001", places=3)
    with pytest.raises(AmountError, match="must not be negative"):
        parse_amount("-1", allow_negative=False)


def test_amounts_hours_and_counts_read_one_way_for_people():
    from gpupool_hub.money.units import amount_text, balance_text, hours_text, plural, rate_text

    # issue 39.4: "220 h", "55.0 h" and "0.0 h" stood side by side
    assert [hours_text(Decimal(h)) for h in ("220", "55", "27.5", "9.94", "3", "0.44", "0")] == [
        "220 h", "55 h", "28 h", "9.9 h", "3 h", "0.4 h", "0 h"]
    assert hours_text(Decimal("1220.4")) == "1,220 h"
    assert amount_text(Decimal("-7.500")) == "\u22127.5" and amount_text(Decimal("1234")) == "1,234"
    assert balance_text(Decimal("-3.25")) == "\u22123.3" and balance_text(Decimal("100")) == "100.0"
    # issue 39.5: "2 GPU server(s)"
    assert plural(1, "GPU server") == "1 GPU server" and plural(2, "GPU server") == "2 GPU servers"
    assert plural(0, "GPU") == "0 GPUs"
    assert rate_text(Decimal(1)) == "1 token/h" and rate_text(Decimal("0.5")) == "0.5 tokens/h"
