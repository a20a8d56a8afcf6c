"""How instants are written: for the API (:func:`iso`), for people (:func:`when_text`,
:func:`time_html`), and how debit intervals are aligned. In one place so that every answer,
audit entry and idempotency key agrees to the second, and every page and message words a
date the same way: the viewer's local time with its zone."""

from __future__ import annotations

from datetime import datetime, timezone, tzinfo
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from markupsafe import Markup


def iso(value: datetime | None) -> str | None:
    """UTC, whole seconds, ``Z``: the one timestamp format of the API."""
    if value is None:
        return None
    return value.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def align_down(t: datetime, seconds: int) -> datetime:
    """The start of the ``seconds``-long interval (aligned to the epoch) that holds ``t``."""
    epoch = int(t.timestamp())
    return datetime.fromtimestamp(epoch - epoch % seconds, timezone.utc)


#: how :func:`when_text` words an instant; the browser script (``static/localtime.js``) writes the same parts
WHEN_FORMAT = "%a %-d %b %Y, %H:%M"


def when_text(value: datetime, tz: tzinfo | None = None, fmt: str = WHEN_FORMAT) -> str:
    """An instant for people: "Tue 1 Dec 2026, 00:00 CET", in ``tz`` (UTC when None) with its zone.

    The one wording of a date for pages and messages; where HTML is allowed,
    :func:`time_html` wraps it so that the browser rewrites it in the viewer's own zone."""
    local = value.astimezone(tz or timezone.utc)
    return f"{local.strftime(fmt)} {zone_name(local)}"


def zone_name(local: datetime) -> str:
    """The zone's short name ("CET", "UTC"); "UTC+05:30" where the zone has only an offset name."""
    name = local.tzname() or ""
    if name and not name[0] in "+-":
        return name
    offset = local.strftime("%z")
    return f"UTC{offset[:3]}:{offset[3:]}" if offset else "UTC"


def time_html(value: datetime, tz: tzinfo | None = None, fmt: str = WHEN_FORMAT, text: str | None = None) -> Markup:
    """``<time datetime="…Z">`` holding :func:`when_text` (or ``text``): the server's wording for a
    reader without JavaScript; ``localtime.js`` rewrites it in the viewer's zone, with the zone."""
    words = text if text is not None else when_text(value, tz, fmt)
    parts = "date" if "%H" not in fmt else ("year" if "%Y" in fmt else "short")
    return Markup('<time datetime="{}" data-gpupool-time="{}">{}</time>').format(iso(value), parts, words)


def time_zone(name: str | None) -> tzinfo | None:
    """A browser's zone name ("Europe/Berlin", from ``localtime.js``'s cookie) → the zone; None when
    it names none (the caller falls back to the pool's zone). Only a name the zone database knows is taken."""
    if not name or len(name) > 64 or not all(c.isalnum() or c in "/_+-" for c in name):
        return None
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        return None


#: the cookie ``localtime.js`` sets to the browser's zone name, so that a message worded on the hub
#: (a refusal shown as text) is in the viewer's zone too
ZONE_COOKIE = "gpupool_tz"
