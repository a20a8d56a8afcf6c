"""Prices of GPU time, per GPU model and hour.

Admins write short names ("RTX 3090"); NVML and DCGM report long ones
("NVIDIA GeForce RTX 3090 Ti"). Matching is by whole words, case-insensitive,
and the most specific entry wins, so a "3090 Ti" entry beats "3090" without
the admin having to order anything.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal

from ..mig import MigProfileError, compute_share, parse_mig_profile
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


#: the classes of GPU fractions an admin may price differently (a MIG instance has its own
#: price table, ``mig_prices``; a whole GPU shares nothing)
SHARE_PRICE_CLASSES = ("mps", "timeslice")


def parse_share_factors(value: object, trait: str = "GPUPool.share_price_factors") -> dict[str, Decimal]:
    """``{"mps": "1.25"}`` → class → Decimal factor on a fraction's share of the GPU price."""
    if not isinstance(value, Mapping):
        raise PricingError(f"c.{trait} must be a dict of share class -> price factor, got {value!r}")
    out: dict[str, Decimal] = {}
    for name, factor in value.items():
        if name not in SHARE_PRICE_CLASSES:
            raise PricingError(f"c.{trait}: {name!r} is no class of GPU fractions; use 'mps' or 'timeslice' "
                               "(MIG instances are priced by c.GPUPool.mig_prices)")
        try:
            out[name] = parse_amount(factor, what="price factor", allow_negative=False)
        except AmountError as e:
            raise PricingError(f"c.{trait}[{name!r}] = {factor!r}: {e}") from None
    return out


def parse_mig_prices(value: object, trait: str = "GPUPool.mig_prices") -> dict[str, Decimal]:
    """``{"1g.10gb": "0.6"}`` → canonical profile → Decimal tokens per instance-hour; errors name the key."""
    if not isinstance(value, Mapping):
        raise PricingError(f"c.{trait} must be a dict of MIG profile -> tokens per instance-hour, got {value!r}")
    out: dict[str, Decimal] = {}
    for name, price in value.items():
        try:
            profile = parse_mig_profile(name)
        except MigProfileError as e:
            raise PricingError(f"c.{trait}: {e}") from None
        if profile in out:
            raise PricingError(f"c.{trait}: {name!r} names profile {profile!r} a second time; keep one")
        try:
            out[profile] = parse_amount(price, what="price", allow_negative=False)
        except AmountError as e:
            raise PricingError(f"c.{trait}[{name!r}] = {price!r}: {e}") from None
    return out


@dataclass(frozen=True)
class PriceTable:
    """Tokens per GPU-hour for each configured model name, and per MIG instance-hour for profiles."""

    prices: Mapping[str, Decimal]
    default_price: Decimal | None = None
    mig_prices: Mapping[str, Decimal] = field(default_factory=dict)  # canonical profile -> per instance-hour
    share_factors: Mapping[str, Decimal] = field(default_factory=dict)  # "mps"/"timeslice" -> factor (default 1)

    @classmethod
    def from_config(
        cls, prices: Mapping[str, object], default_price: object = None, *, trait: str = "GPUPool.prices",
        mig_prices: Mapping[str, object] | None = None, share_factors: Mapping[str, object] | None = None,
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
                parsed[name] = parse_amount(value, what="price", allow_negative=False)
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
        return cls(prices=parsed, default_price=default, mig_prices=parse_mig_prices(mig_prices or {}),
                   share_factors=parse_share_factors(share_factors or {}))

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

    def share_factor(self, share_class: str) -> Decimal:
        """What a fraction of ``share_class`` pays per GPU-hour of its share, as a factor on the
        model's price: an admin may charge more for an MPS share's memory cap than for a
        best-effort time-sliced one. 1 for whole GPUs ("") and unlisted classes."""
        return self.share_factors.get(share_class, Decimal(1))

    def price_per_hour(self, model: str, gpus: Decimal | int = 1, share_class: str = "") -> Decimal:
        """Hourly price of ``gpus`` GPUs of ``model``; fractions cost their share (times their class's factor)."""
        return self.price_per_gpu_hour(model) * Decimal(gpus) * self.share_factor(share_class)

    def cost(self, model: str, gpu_seconds: Decimal, mig_profile: str | None = None, share_class: str = "") -> Decimal:
        """Unrounded cost of GPU-seconds (of instance-seconds with ``mig_profile``); the ledger rounds once per entry."""
        if mig_profile is not None:
            return self.mig_price_per_hour(model, mig_profile) * gpu_seconds / SECONDS_PER_HOUR
        price = self.price_per_gpu_hour(model)
        if share_class:  # whole GPUs (most usage) skip the factor of 1
            price *= self.share_factor(share_class)
        return price * gpu_seconds / SECONDS_PER_HOUR

    def mig_price_per_hour(self, model: str, profile: str) -> Decimal:
        """Tokens per hour of one MIG instance: ``mig_prices[profile]`` if set, else its
        share of the GPU's compute slices times the GPU's price (1g of an A100 = 1/7).

        Unrounded (1/7 does not end): the ledger rounds each debit to the
        milli-token and carries the remainder, so hours of use add up exactly.
        """
        profile = parse_mig_profile(profile)
        if profile in self.mig_prices:
            return self.mig_prices[profile]
        share = compute_share(profile, model)
        return self.price_per_gpu_hour(model) * share.numerator / share.denominator
