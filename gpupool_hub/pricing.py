"""Prices of GPU time, per GPU model and hour.

Admins write short names ("RTX 3090"); NVML and DCGM report long ones
("NVIDIA GeForce RTX 3090 Ti"). Matching is by whole words, case-insensitive,
and the most specific entry wins, so a "3090 Ti" entry beats "3090" without
the admin having to order anything.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from decimal import Decimal

from .units import AmountError, parse_amount

SECONDS_PER_HOUR = Decimal(3600)


class PricingError(ValueError):
    """A price table that cannot be used, or a GPU model it cannot price."""


def _words(text: str) -> tuple[str, ...]:
    return tuple(re.findall(r"[a-z0-9]+", text.lower()))


def _contains(haystack: tuple[str, ...], needle: tuple[str, ...]) -> bool:
    n = len(needle)
    return n > 0 and any(haystack[i : i + n] == needle for i in range(len(haystack) - n + 1))


def model_matches(name: str, model: str) -> bool:
    """Whether an admin's short name ("RTX 3090") names a reported model ("NVIDIA GeForce RTX 3090").

    The same whole-word rule as prices, so a profile and its price always agree
    on which GPUs they mean.
    """
    return _contains(_words(model), _words(name))


@dataclass(frozen=True)
class PriceTable:
    """Tokens per GPU-hour for each configured model name."""

    prices: Mapping[str, Decimal]
    default_price: Decimal | None = None

    @classmethod
    def from_config(
        cls, prices: Mapping[str, object], default_price: object = None, *, trait: str = "GPUPool.prices"
    ) -> PriceTable:
        """Validate admin input; every error names the offending key."""
        if not isinstance(prices, Mapping):
            raise PricingError(f"c.{trait} must be a dict of model name -> tokens per GPU-hour")
        parsed: dict[str, Decimal] = {}
        seen: dict[tuple[str, ...], str] = {}
        for name, value in prices.items():
            if not isinstance(name, str) or not _words(name):
                raise PricingError(f"c.{trait}: model name {name!r} must be a non-empty string")
            try:
                parsed[name] = parse_amount(value, what=f"price", allow_negative=False)
            except AmountError as e:
                raise PricingError(f"c.{trait}[{name!r}] = {value!r}: {e}") from None
            words = _words(name)
            if words in seen:
                raise PricingError(
                    f"c.{trait}: {seen[words]!r} and {name!r} name the same model; keep one"
                )
            seen[words] = name
        default = None
        if default_price is not None:
            try:
                default = parse_amount(default_price, what="default_price", allow_negative=False)
            except AmountError as e:
                raise PricingError(f"c.GPUPool.default_price = {default_price!r}: {e}") from None
        return cls(prices=parsed, default_price=default)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_matches", {})  # model -> entry; a pool has few models, debits many rows

    def match(self, model: str) -> str | None:
        """The configured name that prices ``model``: the entry with the most words found in it."""
        cache: dict[str, str | None] = self._matches  # type: ignore[attr-defined]
        if model not in cache:
            cache[model] = self._match(model)
        return cache[model]

    def _match(self, model: str) -> str | None:
        words = _words(model)
        best: tuple[int, int, str] | None = None
        for name in self.prices:
            entry = _words(name)
            if _contains(words, entry):
                rank = (len(entry), len("".join(entry)), name)
                if best is None or rank[:2] > best[:2]:
                    best = rank
        return best[2] if best else None

    def price_per_gpu_hour(self, model: str) -> Decimal:
        name = self.match(model)
        if name is not None:
            return self.prices[name]
        if self.default_price is not None:
            return self.default_price
        known = ", ".join(sorted(self.prices)) or "(none)"
        raise PricingError(
            f"no price for GPU model {model!r}; configured models: {known}. "
            "Add it to c.GPUPool.prices or set c.GPUPool.default_price."
        )

    def check_models(self, models: Iterable[str]) -> None:
        """Fail at start-up, not at the first debit, when the pool has an unpriced model."""
        missing = sorted({m for m in models if self.match(m) is None})
        if missing and self.default_price is None:
            known = ", ".join(sorted(self.prices)) or "(none)"
            raise PricingError(
                f"GPU model(s) {', '.join(map(repr, missing))} in the pool have no price; "
                f"configured models: {known}. Add them to c.GPUPool.prices or set c.GPUPool.default_price."
            )

    def price_per_hour(self, model: str, gpus: Decimal | int = 1) -> Decimal:
        """Hourly price of ``gpus`` GPUs of ``model``; fractions cost their share."""
        return self.price_per_gpu_hour(model) * Decimal(gpus)

    def cost(self, model: str, gpu_seconds: Decimal) -> Decimal:
        """Unrounded cost of GPU-seconds; the ledger rounds once per entry."""
        return self.price_per_gpu_hour(model) * gpu_seconds / SECONDS_PER_HOUR
