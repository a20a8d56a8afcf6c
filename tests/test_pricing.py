from decimal import Decimal

import pytest

from gpupool_hub.money.pricing import PriceTable, PricingError

EXAMPLE = {"RTX 2080": 0.5, "RTX 3090": 1, "RTX A6000": 4}


@pytest.mark.parametrize(
    "reported, price",
    [
        ("NVIDIA GeForce RTX 2080", "0.5"),
        ("NVIDIA GeForce RTX 3090", "1"),
        ("NVIDIA RTX A6000", "4"),
        ("nvidia geforce rtx 3090", "1"),  # case-insensitive
        ("NVIDIA GeForce RTX 3090 Ti", "1"),  # no Ti entry: the 3090 entry prices it
    ],
)
def test_nvml_model_strings_match_short_names(reported, price):
    assert PriceTable.from_config(EXAMPLE).price_per_gpu_hour(reported) == Decimal(price)


def test_most_specific_entry_wins_regardless_of_order():
    for prices in ({"RTX 3090": 1, "RTX 3090 Ti": 1.5}, {"RTX 3090 Ti": 1.5, "RTX 3090": 1}):
        table = PriceTable.from_config(prices)
        assert table.price_per_gpu_hour("NVIDIA GeForce RTX 3090 Ti") == Decimal("1.5")
        assert table.price_per_gpu_hour("NVIDIA GeForce RTX 3090") == Decimal(1)


def test_whole_words_only():
    # "A100" must not price an "A1000", nor "RTX 2080" an "RTX 20800".
    table = PriceTable.from_config({"A100": 3})
    with pytest.raises(PricingError):
        table.price_per_gpu_hour("NVIDIA RTX A1000")


def test_unknown_model_lists_configured_models():
    table = PriceTable.from_config(EXAMPLE)
    with pytest.raises(PricingError) as e:
        table.price_per_gpu_hour("NVIDIA H100 80GB HBM3")
    assert "RTX 2080, RTX 3090, RTX A6000" in str(e.value)
    with pytest.raises(PricingError, match="H100"):
        table.check_models(["NVIDIA RTX A6000", "NVIDIA H100 80GB HBM3"])


def test_default_price_covers_unknown_models():
    table = PriceTable.from_config(EXAMPLE, default_price="2")
    assert table.price_per_gpu_hour("NVIDIA H100 80GB HBM3") == 2
    table.check_models(["NVIDIA H100 80GB HBM3"])  # no error


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), "cheap", None, True, [1]])
def test_bad_prices_name_the_key(bad):
    with pytest.raises(PricingError) as e:
        PriceTable.from_config({"RTX 3090": 1, "RTX A6000": bad})
    assert "RTX A6000" in str(e.value)


def test_fraction_costs_its_share():
    table = PriceTable.from_config(EXAMPLE)
    assert table.price_per_hour("NVIDIA RTX A6000", Decimal("0.25")) == Decimal(1)
    assert table.cost("NVIDIA RTX A6000", Decimal(900)) == Decimal(1)  # 0.25 GPU for an hour


def test_worked_example_costs_84():
    table = PriceTable.from_config(EXAMPLE)
    hours = Decimal(3600)
    total = (
        table.cost("NVIDIA GeForce RTX 2080", 8 * 5 * hours)
        + table.cost("NVIDIA GeForce RTX 3090", 4 * 10 * hours)
        + table.cost("NVIDIA RTX A6000", 2 * 3 * hours)
    )
    assert total == Decimal(84)
