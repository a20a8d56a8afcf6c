"""MIG profiles as admins write them, and what an instance costs: validation, prices, debits.

The pure parts behind tests/spawner/test_mig_hub.py, table-tested without a hub.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from decimal import Decimal

import pytest
from traitlets import TraitError

from gpupool_hub.config import GPUPool
from gpupool_hub.money.pricing import PriceTable, PricingError
from gpupool_hub.profiles import choose_profile, parse_profiles
from gpupool_hub.usage.base import Usage

A100 = "NVIDIA A100-SXM4-80GB"


@pytest.mark.parametrize("entry,message", [
    ({"slug": "x", "mig": "1g"}, "not a MIG profile name"),
    ({"slug": "x", "mig": "one slice"}, "not a MIG profile name"),
    ({"slug": "x", "mig": 1}, "MIG profile is a name"),
    ({"slug": "x", "mig": "1g.10gb", "gpus": 1}, "remove ['gpus']"),
    ({"slug": "x", "mig": "1g.10gb", "gpu_fraction": 0.5}, "remove ['gpu_fraction']"),
    ({"slug": "x", "mig": "1g.10gb", "max_gpus": 2}, "remove ['max_gpus']"),
])
def test_bad_mig_profiles_name_the_entry_and_the_key(entry, message):
    with pytest.raises(TraitError) as e:
        parse_profiles([entry])
    assert "c.GPUPoolSpawner.profiles[0] ('x'): 'mig'" in str(e.value) or "'mig' asks for" in str(e.value)
    assert message in str(e.value)


def test_a_mig_profile_asks_for_one_instance():
    (p,) = parse_profiles([{"slug": "a100-1g", "display_name": "A100 1g", "mig": "1G.10GB", "models": ["A100"]}])
    assert p.mig == "1g.10gb" and p.needs_gpu
    assert p.request() == {"mig": "1g.10gb", "models": ["A100"]}
    assert p.describe() == "a 1g.10gb MIG instance (A100)"
    assert choose_profile([p], {"profile": "a100-1g"}) == (p, 0)


@pytest.mark.parametrize("model,profile,mig_prices,expected", [
    (A100, "1g.10gb", {}, Decimal("0.4")),           # 2.8 / 7
    (A100, "3g.40gb", {}, Decimal("1.2")),           # 3 slices of 7
    (A100, "7g.80gb", {}, Decimal("2.8")),           # the whole GPU
    (A100, "3g.40gb", {"3g.40gb": "1.5"}, Decimal("1.5")),  # mig_prices wins
    (A100, "1G.10GB", {"1g.10gb": 0.6}, Decimal("0.6")),    # names compared canonically
    ("NVIDIA A30", "1g.6gb", {}, Decimal("0.5")),      # an A30 has 4 slices: 2 / 4
])
def test_instance_price(model, profile, mig_prices, expected):
    table = PriceTable.from_config({"A100": "2.8", "A30": 2}, mig_prices=mig_prices)
    assert table.mig_price_per_hour(model, profile) == expected


@pytest.mark.parametrize("mig_prices,message", [
    ({"1g": 1}, "c.GPUPool.mig_prices: '1g' is not a MIG profile name"),
    ({"1g.10gb": "-1"}, "must not be negative"),
    ({"1g.10gb": "1e3"}, "plain decimal"),
    ({"1g.10gb": 1, "1G.10GB": 2}, "a second time"),
    ([("1g.10gb", 1)], "expected a dict|must be a dict"),
])
def test_bad_mig_prices_are_refused_at_load(mig_prices, message):
    with pytest.raises(TraitError, match=message):
        GPUPool(mig_prices=mig_prices)
    with pytest.raises(PricingError):
        PriceTable.from_config({}, mig_prices=mig_prices)


def test_config_price_table_uses_mig_prices():
    table = GPUPool(prices={"A100": 7}, mig_prices={"2g.20gb": "1.25"}).price_table()
    assert table.mig_price_per_hour(A100, "2g.20gb") == Decimal("1.25")
    assert table.mig_price_per_hour(A100, "1g.10gb") == Decimal(1)


def test_debits_charge_instances_exactly_with_carried_remainders(tmp_path):
    """2/7 tokens per hour never ends in decimal: 7 hours of debits add up to exactly 2 tokens."""
    from gpupool_hub.ledger import Ledger
    from gpupool_hub.service.core.debits import Debits

    ledger = Ledger(f"sqlite:///{tmp_path}/l.sqlite")
    table = PriceTable.from_config({"A100": 2})
    start = datetime(2026, 1, 1, tzinfo=timezone.utc)
    debits = Debits(ledger, table, None, interval=3600, delay_tolerance=0, clock=lambda: start)  # type: ignore[arg-type]
    total = Decimal(0)
    for hour in range(7):
        t = start + timedelta(hours=hour)
        postings, carry = debits.postings([Usage("ann", A100, Decimal(3600), "1g.10gb"),
                                           Usage("ann", A100, Decimal(1800))], t, t + timedelta(hours=1))
        ledger.post_many(postings, complete_interval=("debit", t, t + timedelta(hours=1)), carry=carry)
        mig = [p for p in postings if p.model == f"{A100} MIG 1g.10gb"]
        assert [p.amount for p in mig] in ([Decimal("-0.286")], [Decimal("-0.285")])
        total += sum(p.amount for p in mig)
        if hour < 6:  # only the MIG instance leaves a remainder: the whole-token debit carries none
            assert set(ledger.carries.remainders()) == {("ann", f"{A100} MIG 1g.10gb")}
    assert total == Decimal(-2)  # exactly 7 × 2/7
    # the remainder came back to (Decimal's 28 digits of) zero
    assert all(abs(v) < Decimal("1e-20") for v in ledger.carries.remainders().values())
    entries = [e for e in ledger.history("ann") if e.kind == "debit"]
    assert {e.model for e in entries} == {A100, f"{A100} MIG 1g.10gb"}
    assert sum(e.amount for e in entries if e.model == A100) == Decimal(-7)  # plain GPU time: half a GPU-hour × 2/h
    ledger.close()
