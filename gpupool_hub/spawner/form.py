"""The spawn options form: a card per profile with its price, the balance and what it buys.

Three steps, each replaceable on its own: reading the submitted form
(:func:`gpupool_options_from_form`, fields → ``user_options``); building what
the form shows (:func:`form_context`: profiles plus the service's answers →
plain values, the cards of ``cards.py``; dates as ``timefmt.time_html``);
drawing it (a packaged Jinja2 template, ``form.html``, that admins override
from ``c.GPUPoolSpawner.form_template_paths``).

Prices and free GPUs come from the service (``GET /models``), which knows the
pool; the hub's configuration need not. When the service does not answer the
form still renders, with prices and balance unknown; the start then decides.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from datetime import datetime
from decimal import Decimal
from pathlib import Path
from typing import Any
from urllib.parse import quote

from jinja2 import ChoiceLoader, Environment, FileSystemLoader, PackageLoader, PrefixLoader
from markupsafe import Markup

from ..profiles import Profile, default_profile
from ..timefmt import time_html
from ..money.credits import SCHEDULED
from ..money.units import amount_text, balance_text
from .cards import CardAccount, ProfileChoice, card, decimal, free_gpus, free_mig, profile_prices

__all__ = [
    "TEMPLATE", "ProfileChoice", "floor_stop_after", "form_context", "free_gpus", "free_mig",
    "gpupool_options_from_form", "preselected", "profile_prices", "render_form", "template_environment",
]

TEMPLATE = "form.html"
#: the browser script that puts ``timefmt.time_html`` dates in the viewer's zone: one file, served by the
#: service's pages (their CSP allows no inline script) and inlined here (the hub's page allows it)
LOCALTIME_JS = Path(__file__).parents[1] / "service" / "pages" / "static" / "localtime.js"
DEFAULT_MIN_START_HOURS = Decimal(1)


# ------------------------------------------------------------- reading


def gpupool_options_from_form(form_data: Mapping[str, list[str]]) -> dict[str, Any]:
    """Form fields → user_options: ``profile`` and, for adjustable profiles, ``gpus--<slug>``."""
    options: dict[str, Any] = {}
    profile = (form_data.get("profile") or [""])[0]
    if profile:
        options["profile"] = profile
    raw = (form_data.get(f"gpus--{profile}") or [None])[0] if profile else None
    if raw not in (None, ""):
        options["gpus"] = int(raw) if re.fullmatch(r"\d{1,3}", raw.strip()) else raw
    return options


# ------------------------------------------------------------ building


def preselected(profiles: Sequence[Profile], previous: Any, floor_stopped: bool) -> Profile | None:
    """The profile the form opens with: the previous choice (the last start's, which after a
    refusal is the refused one), else the default; but after a floor stop that came after the
    last refusal a CPU-only profile, since no GPU profile can start until credits come."""
    chosen = default_profile(list(profiles))
    if isinstance(previous, str):
        chosen = next((p for p in profiles if p.slug == previous), chosen)
    if floor_stopped and chosen is not None and chosen.needs_gpu:
        chosen = next((p for p in profiles if not p.needs_gpu), chosen)
    return chosen


def floor_stop_after(notices: Any, server: str, refused_at: datetime | None) -> bool:
    """Whether a floor stop of ``server`` not dismissed yet is newer than the last refusal."""
    for n in notices if isinstance(notices, list) else []:
        if not isinstance(n, Mapping) or n.get("kind") != "floor_stop" or (n.get("server") or "") != server:
            continue
        try:
            at = datetime.fromisoformat(str(n.get("at")).replace("Z", "+00:00"))
        except ValueError:
            continue
        if refused_at is None or at > refused_at:
            return True
    return False


def _credit_lines(account: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The scheduled credits: "+1 token every day, next Sat 28 Nov, 00:00 UTC", daily and monthly."""
    credits = account.get("credits") if isinstance(account.get("credits"), Mapping) else {}
    out = []
    for kind, every, at_key in ((k.name, k.every, k.next_at) for k in SCHEDULED):
        amount = decimal(credits.get(kind))
        if amount is None or amount <= 0:
            continue
        at = credits.get(at_key)
        try:
            when = time_html(datetime.fromisoformat(str(at).replace("Z", "+00:00"))) if at else None
        except ValueError:
            when = None
        out.append({"kind": kind, "text": f"+{amount_text(amount)} token{'' if amount == 1 else 's'} {every}",
                    "amount": amount_text(amount), "next": when})
    return out


def form_context(profiles: Sequence[Profile], chosen: Profile | None, account: Mapping[str, Any] | None,
                 catalog: Mapping[str, Any] | None, chosen_gpus: int | None = None) -> dict[str, Any]:
    """What the template shows, from the profiles and the service's answers (None: no answer).

    ``account`` is the user's ``GET /users/{name}`` view (balance, floor,
    credits, what runs); ``catalog`` is ``GET /models`` (prices, free GPUs,
    ``min_start_hours``). ``chosen_gpus``: the GPU count preselected for an
    adjustable ``chosen`` profile.
    """
    acct = CardAccount.from_view(account)
    min_hours = DEFAULT_MIN_START_HOURS
    if catalog is not None:
        min_hours = decimal(catalog.get("min_start_hours")) or DEFAULT_MIN_START_HOURS
    notices = account.get("notices") if account else None
    balance = None
    if acct is not None and account:
        balance = {"value": str(acct.balance), "text": balance_text(acct.balance), "floor": amount_text(acct.floor),
                   "at_floor": acct.balance <= acct.floor, "credits": _credit_lines(account)}
        daily = next((c for c in balance["credits"] if c["kind"] == "daily"), None)
        balance["daily"] = daily["amount"] if daily else None  # the admins' templates of before read it
    return {
        "notices": [dict(n, at_html=_notice_time(n)) for n in notices if isinstance(n, Mapping)]
        if isinstance(notices, list) else [],
        "balance": balance,
        "prices_known": catalog is not None,
        "min_start_hours": amount_text(min_hours),
        "profiles": [card(p, catalog, acct, min_hours, chosen is not None and p.slug == chosen.slug, chosen_gpus)
                     for p in profiles],
        "localtime_script": localtime_script(),
    }


@functools.lru_cache(maxsize=1)
def localtime_script() -> Markup:
    """The package's own ``localtime.js`` (no user data in it), read once."""
    return Markup(LOCALTIME_JS.read_text(encoding="utf-8"))


def _notice_time(notice: Mapping[str, Any]) -> Any:
    try:
        return time_html(datetime.fromisoformat(str(notice.get("at")).replace("Z", "+00:00")))
    except ValueError:
        return notice.get("at")


# ------------------------------------------------------------- drawing


@functools.lru_cache(maxsize=16)
def template_environment(extra_paths: tuple[str, ...] = ()) -> Environment:
    """Templates from ``extra_paths`` first, then the packaged ones.

    The packaged templates are also reachable as ``gpupool/<name>``, so an
    admin's ``form.html`` can ``{% extends "gpupool/form.html" %}`` and replace
    only some blocks. Values are HTML-escaped (autoescape).
    """
    packaged = PackageLoader("gpupool_hub.spawner", "templates")
    loader = ChoiceLoader([FileSystemLoader(list(extra_paths)), packaged, PrefixLoader({"gpupool": packaged})])
    return Environment(loader=loader, autoescape=True, trim_blocks=True, lstrip_blocks=True)


def render_form(spawner: Any, account: Mapping[str, Any] | None, catalog: Mapping[str, Any] | None = None,
                linked: Mapping[str, Any] | None = None) -> str:
    """The options form of ``spawner`` (a GPUPoolSpawner) with the service's answers (None: unknown).

    ``linked``: the options of a link the form is shown for instead of starting
    (``options_from_query``); they are preselected, else the last start's profile
    (the refused one after a refusal), or CPU only after a floor stop (:func:`preselected`)."""
    profiles = spawner.gpupool_profiles
    wanted = linked or (spawner.user_options if isinstance(spawner.user_options, dict) else {})
    stopped = not linked and floor_stop_after((account or {}).get("notices"), getattr(spawner, "name", "") or "",
                                              getattr(spawner, "gpupool_refused_at", None))
    chosen = preselected(profiles, wanted.get("profile"), stopped)
    gpus = wanted.get("gpus") if linked and isinstance(wanted.get("gpus"), int) else None
    confirm = None
    if linked and chosen is not None and chosen.needs_gpu:
        confirm = (f"{chosen.display_name} costs tokens, so a link does not start it. "
                   "Check the choice below and press Start to start it.")
    env = template_environment(tuple(spawner.form_template_paths))
    cpu_after_stop = chosen.display_name if stopped and chosen is not None and not chosen.needs_gpu else None
    return env.get_template(TEMPLATE).render(form_context(profiles, chosen, account, catalog, gpus),
                                             pages_url=pages_url(spawner), confirm=confirm,
                                             floor_stopped=cpu_after_stop)


def pages_url(spawner: Any) -> str | None:
    """Where the service's "My GPU usage" page is: ``{hub prefix}services/{name}/``.

    JupyterHub puts its own pages at ``{prefix}hub/``, so the prefix is that minus ``hub/``."""
    hub_base = getattr(getattr(spawner, "hub", None), "base_url", None)
    if not isinstance(hub_base, str) or not hub_base.endswith("hub/"):
        return None
    return f"{hub_base[:-len('hub/')]}services/{quote(spawner.gpupool_service_name, safe='')}/"
