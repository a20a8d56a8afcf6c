"""The not-enough-tokens refusal in words, from its details alone.

The service refuses a start its balance cannot pay (``credits.start_need``) and
sends the figures as the refusal's ``details``; the service words them for the
API (the pool's time zone) and the spawner words them again for the spawn page
(the viewer's zone, and a ``<time>`` element where HTML is shown). One function
writes the sentence for both, so the banner and the API never disagree. Pure:
no I/O, no clock.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from .credits import SCHEDULED
from .units import amount_text, plural, rate_text

__all__ = ["CREDIT_WORDS", "shortfall_message"]

#: the credit that makes a start affordable, as the refusal names it
CREDIT_WORDS = {k.name: k.words for k in SCHEDULED}


def _dec(details: Mapping[str, Any], key: str, default: str = "0") -> Decimal:
    try:
        return Decimal(str(details.get(key) if details.get(key) is not None else default))
    except InvalidOperation:
        return Decimal(default)


def shortfall_message(details: Mapping[str, Any], retry_at: datetime | None,
                      when: Callable[[datetime], str]) -> str:
    """"Not enough tokens: your balance is −3.5 and this server costs 4 tokens/h; starting needs
    4 tokens above the floor of −10 for its first 1 h. With the monthly credit you can start it from
    Tue 1 Dec 2026, 00:00 CET." ``when`` words the date (``timefmt.when_text`` in some zone, or a
    placeholder the caller replaces by a ``<time>`` element)."""
    balance, price = _dec(details, "balance"), _dec(details, "price_per_hour")
    floor, needs = _dec(details, "floor"), _dec(details, "needs")
    hours = _dec(details, "min_start_hours", "1")
    held = [h for h in details.get("held") or [] if isinstance(h, Mapping)]
    held_price = _dec(details, "held_price_per_hour")
    msg = f"Not enough tokens: your balance is {amount_text(balance)} and this server costs {rate_text(price)}"
    if held:
        servers = ", ".join(f"{h.get('server') or 'default'} ({amount_text(_dec(h, 'price_per_hour'))}/h)"
                            for h in held)
        msg += (f"; you already run {plural(len(held), 'GPU server')} costing {rate_text(held_price)} "
                f"({servers}), so starting this one needs {amount_text(needs)} tokens "
                f"above the floor of {amount_text(floor)} for the first {amount_text(hours)} h of all of them.")
    else:
        msg += (f"; starting needs {amount_text(needs)} tokens above the floor of {amount_text(floor)} "
                f"for its first {amount_text(hours)} h.")
    alone = balance - price * hours >= floor
    if held and alone:
        msg += " Stop one of your running GPU servers to start this one."
    credit = CREDIT_WORDS.get(str(details.get("credit") or ""))
    if retry_at is not None and credit:
        msg += f" With {credit} you can start it from {when(retry_at)}."
    elif not held or not alone:
        msg += " No scheduled credit makes it affordable; ask an admin for a grant."
    return msg

