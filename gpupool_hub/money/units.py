"""Exact token amounts.

The ledger stores integer milli-tokens so that sums are exact in every
database; the rest of the code speaks ``Decimal``. Rounding happens in one
place (``round_milli``), once per ledger entry, so a statement always adds up.
"""

from __future__ import annotations

import re
from decimal import ROUND_HALF_UP, Decimal

MILLI = Decimal("0.001")

#: Largest absolute amount accepted anywhere (a billion tokens). Anything
#: larger is a typo or an attack, and would overflow nothing but trust.
MAX_ABS_TOKENS = Decimal(1_000_000_000)


class AmountError(ValueError):
    """An amount that cannot be a token amount (not a number, NaN, too precise, absurd)."""


#: the only way an amount may be written as text: plain ASCII digits, an optional
#: sign and an optional decimal part ("12", "-2.5"; not "1e3", "5_000", "１２", " 7")
AMOUNT_TEXT = re.compile(r"[+-]?[0-9]+(\.[0-9]+)?", re.ASCII)
MAX_AMOUNT_TEXT = 40


def parse_amount(value: object, *, what: str = "amount", allow_negative: bool = True,
                 places: int | None = None) -> Decimal:
    """Turn user or config input into an exact Decimal, refusing floats' surprises.

    Text must be a plain decimal (``AMOUNT_TEXT``): no exponents, underscores,
    non-ASCII digits or spaces, so what a person typed is what is recorded.
    Floats are accepted (configs say ``0.5``) but converted through ``repr`` so
    that ``0.1`` means one tenth, not 0.1000000000000000055. ``places`` refuses
    amounts with more decimal places than that.
    """
    if isinstance(value, bool):
        raise AmountError(f"{what} must be a number, not a boolean ({value!r})")
    if isinstance(value, float):
        amount = Decimal(repr(value))
    elif isinstance(value, int):
        if abs(value) > MAX_ABS_TOKENS:
            raise AmountError(f"{what} is beyond the accepted range (±{MAX_ABS_TOKENS:,})")
        amount = Decimal(value)
    elif isinstance(value, Decimal):
        amount = value
    elif isinstance(value, str):
        if len(value) > MAX_AMOUNT_TEXT or not AMOUNT_TEXT.fullmatch(value):
            raise AmountError(f"{what} must be a plain decimal number such as \"12\" or \"-2.5\", "
                              f"got {value[:MAX_AMOUNT_TEXT]!r}")
        amount = Decimal(value)
    else:
        raise AmountError(f"{what} must be a number, got {type(value).__name__} {value!r}")
    if not amount.is_finite():
        raise AmountError(f"{what} must be a finite number, got {value!r}")
    if not allow_negative and amount < 0:
        raise AmountError(f"{what} must not be negative, got {value!r}")
    if abs(amount) > MAX_ABS_TOKENS:
        raise AmountError(f"{what} {value!r} is beyond the accepted range (±{MAX_ABS_TOKENS:,})")
    if places is not None and amount != amount.quantize(Decimal(1).scaleb(-places)):
        raise AmountError(f"{what} {value!r} has more than {places} decimal places")
    return amount


def round_milli(amount: Decimal) -> Decimal:
    """Round to the milli-token, half away from zero: the one rounding rule of the ledger."""
    return amount.quantize(MILLI, rounding=ROUND_HALF_UP)


def to_milli(amount: Decimal) -> int:
    """Exact conversion to integer milli-tokens; refuses amounts finer than a milli-token.

    Callers that compute costs round first (``round_milli``); callers that take
    amounts from people must not have them silently rounded.
    """
    scaled = amount * 1000
    if scaled != scaled.to_integral_value():
        raise AmountError(f"{amount} has more than three decimal places")
    return int(scaled)


def from_milli(milli: int) -> Decimal:
    return (Decimal(milli) / 1000).quantize(MILLI)


def format_tokens(amount: Decimal) -> str:
    """Three decimals, as the API and the CLI show amounts."""
    return str(amount.quantize(MILLI))


# ------------------------------------------------------------ for people
# How amounts, hours and counts read on every page (the spawn form, the service's pages, messages):
# one rule each, so that "220 h", "55.0 h" and "0.0 h" never stand side by side.

#: a real minus sign, as the lab widget writes it
MINUS = "\u2212"


def amount_text(value: object, signed: bool = False) -> str:
    """An amount as people read it: thousands separators, up to three decimals, a real minus."""
    amount = Decimal(str(value))
    text = f"{amount:,.3f}".rstrip("0").rstrip(".") if amount % 1 else f"{amount:,.0f}"
    if signed and amount > 0:
        text = "+" + text
    return text.replace("-", MINUS)


def balance_text(value: object) -> str:
    """A balance as the lab widget shows it (``formatAmount`` in labextension/src/format.ts):
    one decimal, half away from zero, a real minus, never a negative zero ("−3.25" → "−3.3")."""
    amount = Decimal(str(value)).quantize(Decimal("0.1"), rounding=ROUND_HALF_UP)
    text = f"{abs(amount):.1f}"
    return MINUS + text if amount < 0 else text


def hours_text(hours: Decimal) -> str:
    """Hours as people read them: one decimal below 10 h, whole hours from there ("0.4 h", "9.9 h",
    "55 h", "1,220 h"), no trailing ".0" ("3 h"), and "0 h", never "0.0 h"."""
    if hours >= 10:
        return f"{hours.quantize(Decimal(1), rounding=ROUND_HALF_UP):,f} h"
    text = f"{hours.quantize(Decimal('0.1'), rounding=ROUND_HALF_UP):f}"
    return f"{text[:-2] if text.endswith('.0') else text} h"


def plural(count: int, word: str, words: str | None = None) -> str:
    """"1 GPU server", "2 GPU servers": the count and its noun, never "server(s)"."""
    return f"{count} {word if count == 1 else (words or word + 's')}"


def rate_text(amount: Decimal) -> str:
    """A price per hour: "1 token/h", "0.5 tokens/h", "1,200 tokens/h"."""
    return f"{amount_text(amount)} token{'' if amount == 1 else 's'}/h"
