"""An admin prices the guarantee classes of GPU fractions differently (issue 23 item 4).

``c.GPUPool.share_price_factors`` multiplies a fraction's share of its model's
price by its class's factor. What is charged, the allocation's price, the
affordability check, ``GET models`` and the spawn page all use it, exactly.
"""

from __future__ import annotations

from decimal import Decimal

import pytest

from gpupool_hub.money.pricing import PriceTable, PricingError
from gpupool_hub.profiles import parse_profiles
from gpupool_hub.service.core.admission import parse_request
from gpupool_hub.service.core.catalog import catalog
from gpupool_hub.spawner.form import form_context
from tests.fixtures.manager import Clock, make_manager
from tests.service.openapi import check

A100 = "NVIDIA A100-SXM4-80GB"
NODES = [{"name": "n1", "cpu_milli": 64000, "memory_mib": 262144,
          "gpus": [{"index": i, "uuid": f"GPU-{i}", "model": A100, "memory_mib": 81920} for i in range(2)]}]
FACTORS = {"mps": "1.5", "timeslice": "0.8"}
PROFILES = [{"slug": "whole", "gpus": 1}, {"slug": "capped", "gpu_fraction": 0.75, "share": "mps"},
            {"slug": "quarter", "gpu_fraction": 0.25}]


@pytest.mark.parametrize("factors, message", [
    ({"mig": 2}, "'mig' is no class of GPU fractions; use 'mps' or 'timeslice' (MIG instances are priced by "
                 "c.GPUPool.mig_prices)"),
    ({"mps": "-1"}, "c.GPUPool.share_price_factors['mps'] = '-1'"),
    ({"mps": "lots"}, "c.GPUPool.share_price_factors['mps'] = 'lots'"),
    (["mps"], "must be a dict of share class -> price factor"),
])
def test_a_bad_factor_is_refused_with_its_key(factors, message):
    with pytest.raises(PricingError) as e:
        PriceTable.from_config({"A100": 2}, share_factors=factors)
    assert message in str(e.value)


def test_the_setting_is_checked_when_the_config_loads():
    from traitlets import TraitError

    from gpupool_hub.config import GPUPool

    with pytest.raises(TraitError, match=r"share_price_factors\['timeslice'\] = '-0.5': price factor must not be negative"):
        GPUPool(share_price_factors={"timeslice": "-0.5"})
    assert GPUPool(share_price_factors=FACTORS).price_table().share_factor("timeslice") == Decimal("0.8")


def test_each_class_is_charged_shown_and_offered_at_its_factor(tmp_path):
    clock = Clock()
    m = make_manager(NODES, {"A100": 2}, f"sqlite:///{tmp_path / 'ledger.sqlite'}", clock=clock, epoch=clock.now,
                     share_price_factors=FACTORS)
    try:
        # one user, an mps share and a timeslice share of the same model: one debit, each part at its price
        capped = m.admission.admit("alice", [], "capped", parse_request({"gpu_fraction": 0.75, "share": "mps"}))
        quarter = m.admission.admit("alice", [], "quarter", parse_request({"gpu_fraction": 0.25}))
        whole = m.admission.admit("bob", [], "", parse_request({"gpus": 1}))
        assert capped.price_per_hour == Decimal("2.250")  # 0.75 x 2 tokens/h x 1.5
        assert quarter.price_per_hour == Decimal("0.400")  # 0.25 x 2 x 0.8
        assert whole.price_per_hour == Decimal("2.000")  # a whole GPU shares nothing: no factor
        clock.advance(3600)
        assert m.debits.debit_due() == 1
        debits = {u: [e for e in m.ledger.history(u) if e.kind == "debit"] for u in ("alice", "bob")}
        [alice] = debits["alice"]
        assert (alice.amount, alice.model, alice.gpu_seconds) == (Decimal("-2.650"), A100, Decimal("3600.000"))
        [bob] = debits["bob"]
        assert bob.amount == Decimal("-2.000")

        # GET models and the spawn page say the same prices
        m.inventory.expect_profiles(parse_profiles(PROFILES))
        body = catalog(m.inventory, m.settings.min_start_hours)
        check("Models", body)
        assert body["share_price_factors"] == FACTORS
        assert {p["slug"]: p["prices"] for p in body["profiles"]} == {
            "whole": {A100: "2.000"}, "capped": {A100: "2.250"}, "quarter": {A100: "0.400"}}
        account = {"balance": "100.000", "floor": "-10.000", "credits": {}}
        ctx = form_context(parse_profiles(PROFILES), None, account, body)
        prices = {p.slug: (p.price, p.gpu) for p in ctx["profiles"]}
        assert prices["capped"] == ("2.25 tokens/h", "¾ of one NVIDIA A100-SXM4-80GB, 60 GiB of its memory"), prices
        assert prices["quarter"] == ("0.4 tokens/h", "¼ of one NVIDIA A100-SXM4-80GB, 20 GiB of its memory"), prices
        assert prices["whole"] == ("2 tokens/h", "1 × NVIDIA A100-SXM4-80GB"), prices
    finally:
        m.close()


def test_the_affordability_check_uses_the_factor(tmp_path):
    from gpupool_hub.service.core.errors import Refused

    clock = Clock()
    # 8 tokens above the floor; min_start_hours 4: a 0.75 mps share at 2.25/h needs 9, at factor 1 it would need 6
    m = make_manager(NODES, {"A100": 2}, f"sqlite:///{tmp_path / 'ledger.sqlite'}", clock=clock,
                     share_price_factors=FACTORS, initial_grant=0, floor=-8, min_start_hours=4)
    try:
        with pytest.raises(Refused) as e:
            m.admission.admit("carol", [], "", parse_request({"gpu_fraction": 0.75, "share": "mps"}))
        assert "costs 2.25 tokens/h; starting needs 9 tokens" in str(e.value), str(e.value)
        assert m.admission.admit("carol", [], "", parse_request({"gpu_fraction": 0.75})).price_per_hour == Decimal("1.200")
    finally:
        m.close()
