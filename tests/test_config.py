from decimal import Decimal

import pytest
from traitlets import TraitError
from traitlets.config import Config

from gpupool_hub.config import GPUPool


def pool(**values):
    c = Config()
    for k, v in values.items():
        setattr(c.GPUPool, k, v)
    return GPUPool(config=c)


def test_defaults_are_the_original_systems():
    p = pool()
    r = p.base_rules()
    assert (r.initial, r.monthly, r.daily, r.floor, r.max_balance) == (100, 30, 1, -10, None)


def test_amounts_are_exact_decimals():
    p = pool(daily_credit=0.1, prices={"RTX 2080": 0.5})
    assert p.daily_credit == Decimal("0.1")
    assert p.price_table().price_per_gpu_hour("NVIDIA GeForce RTX 2080") == Decimal("0.5")


@pytest.mark.parametrize(
    "key, value, needle",
    [
        ("prices", {"RTX 3090": -1}, "RTX 3090"),
        ("prices", {"RTX 3090": float("nan")}, "RTX 3090"),
        ("prices", {"RTX 3090": "one"}, "RTX 3090"),
        ("floor", 5, "c.GPUPool.floor"),
        ("daily_credit", float("inf"), "c.GPUPool.daily_credit"),
        ("initial_grant", -3, "c.GPUPool.initial_grant"),
        ("group_credits", {"faculty": {"monthly": "x"}}, "faculty"),
        ("group_credits", {"faculty": 7}, "faculty"),
        ("credit_timezone", "Mars/Olympus", "Mars/Olympus"),
        ("max_waiting_per_user", 0, "c.GPUPool.max_waiting_per_user"),
        ("max_waiting_per_user", "two", "max_waiting_per_user"),
    ],
)
def test_bad_config_fails_at_start_naming_key_and_value(key, value, needle):
    with pytest.raises(TraitError) as e:
        pool(**{key: value})
    assert needle in str(e.value)


def test_group_override_keeps_admins_base_values():
    p = pool(initial_grant=50, group_credits={"faculty": {"monthly": 100}})
    r = p.rules_for(["faculty"])
    assert (r.initial, r.monthly) == (50, 100)
