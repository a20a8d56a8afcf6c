"""The spawn options form: each profile with its price, the balance and what it buys.

Three steps, each replaceable on its own: reading the submitted form
(:func:`gpupool_options_from_form`, fields → ``user_options``); building what
the form shows (:func:`form_context`: profiles plus the service's answers →
plain values, no HTML); drawing it (a packaged Jinja2 template, ``form.html``,
that admins override from ``c.GPUPoolSpawner.form_template_paths``).

Prices and free GPUs come from the service (``GET /models``), which knows the
pool; the hub's configuration need not. When the service does not answer the
form still renders, with prices and balance unknown; the start then decides.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any
from urllib.parse import quote

from jinja2 import ChoiceLoader, Environment, FileSystemLoader, PackageLoader, PrefixLoader

from ..pricing import model_matches
from ..profiles import Profile
from ..profiles import format_decimal as _fmt
from .wait_rules import full_text

__all__ = [
    "TEMPLATE", "ProfileChoice", "form_context", "gpupool_options_from_form", "profile_prices", "render_form",
    "template_environment",
]

TEMPLATE = "form.html"
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


def _model_ok(name: str, model: str) -> bool:
    return model_matches(name, model) or name.strip().lower() == model.strip().lower()


def _catalog_models(profile: Profile, catalog: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The catalog's entries for the pool models this profile may run on."""
    out = []
    for entry in catalog.get("models") or []:
        model = entry.get("model") if isinstance(entry, Mapping) else None
        if not isinstance(model, str):
            continue
        if profile.models and not any(_model_ok(name, model) for name in profile.models):
            continue
        out.append(entry)
    return out


def profile_prices(profile: Profile, catalog: Mapping[str, Any]) -> list[tuple[str, Decimal]] | None:
    """``[(pool model, tokens per hour)]`` for the profile's base request, cheapest first.

    None for a CPU-only profile; [] when no priced pool model fits.
    """
    if not profile.needs_gpu:
        return None
    if profile.mig:
        return _mig_prices(profile, catalog)
    out = []
    factor = _share_factor(profile, catalog)
    for entry in _catalog_models(profile, catalog):
        try:
            price = Decimal(str(entry["price_per_gpu_hour"]))
        except (KeyError, InvalidOperation):  # None: a model without a price cannot be allocated
            continue
        if price.is_finite():
            out.append((entry["model"], price * profile.gpu_amount * factor))
    return sorted(out, key=lambda mp: (mp[1], mp[0]))


def _share_factor(profile: Profile, catalog: Mapping[str, Any]) -> Decimal:
    """The admin's price factor for the profile's class of fraction (``c.GPUPool.share_price_factors``,
    which ``GET models`` states), so the form shows what the debits will charge; 1 for whole GPUs."""
    factors = catalog.get("share_price_factors")
    if not profile.gpu_milli or not isinstance(factors, Mapping):
        return Decimal(1)
    try:
        factor = Decimal(str(factors.get(profile.share_class, "1")))
    except InvalidOperation:
        return Decimal(1)
    return factor if factor.is_finite() and factor >= 0 else Decimal(1)


def _mig_entries(profile: Profile, catalog: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    """(pool model, its catalog entry for the profile's MIG instances) where the pool has such instances."""
    out = []
    for entry in _catalog_models(profile, catalog):
        mig = entry.get("mig")
        hit = mig.get(profile.mig) if isinstance(mig, Mapping) else None
        if isinstance(hit, Mapping):
            out.append((entry["model"], hit))
    return out


def _mig_prices(profile: Profile, catalog: Mapping[str, Any]) -> list[tuple[str, Decimal]]:
    """A MIG profile's price per instance-hour on each pool model that has such instances."""
    out = []
    for model, hit in _mig_entries(profile, catalog):
        price = _decimal(hit.get("price_per_hour")) if hit.get("price_per_hour") is not None else None
        if price is not None:
            out.append((model, price))
    return sorted(out, key=lambda mp: (mp[1], mp[0]))


def free_mig(profile: Profile, catalog: Mapping[str, Any]) -> tuple[int, int] | None:
    """(free instances, instances in the pool) of a MIG profile; None for other profiles."""
    if not profile.mig:
        return None
    entries = [hit for _, hit in _mig_entries(profile, catalog)]
    return sum(int(h.get("free") or 0) for h in entries), sum(int(h.get("instances") or 0) for h in entries)


def free_gpus(profile: Profile, catalog: Mapping[str, Any]) -> tuple[int, int] | None:
    """(whole GPUs free, GPUs in the pool) over the models a whole-GPU profile may use.

    None for CPU-only and fraction profiles (a fraction may fit on a GPU that is
    not wholly free, so the count would mislead).
    """
    if not profile.needs_gpu or profile.gpu_milli or profile.mig:
        return None
    free = total = 0
    for entry in _catalog_models(profile, catalog):
        if entry.get("price_per_gpu_hour") is None:
            continue
        free += int(entry.get("whole_free") or 0)
        total += int(entry.get("gpus") or 0)
    return free, total


def _hours(balance: Decimal, floor: Decimal, price: Decimal) -> str:
    if price <= 0:
        return "unlimited"
    hours = max(Decimal(0), balance - floor) / price
    if hours >= 100:
        return f"{hours:.0f} h"
    return f"{hours:.1f} h"


def _decimal(value: Any) -> Decimal | None:
    try:
        out = Decimal(str(value))
    except InvalidOperation:
        return None
    return out if out.is_finite() else None


@dataclass(frozen=True)
class ProfileChoice:
    """One profile as the form shows it; every field is plain text for the template."""

    slug: str
    display_name: str
    what: str  # "2 GPUs (RTX 3090)"
    description: str
    price: str  # "2 tokens/h (NVIDIA GeForce RTX 3090)"; "; your balance buys ≈ 3.0 h" when known
    affordable: bool
    checked: bool
    needs: str | None  # tokens above the floor a start needs, when the balance does not have them
    gpu_counts: tuple[int, ...]  # choices of an adjustable profile
    free: str  # "3 of 4 GPUs free", or "" when not known or not meaningful
    gpus_selected: int = 0  # the GPU count chosen in advance (a link's), 0: the first
    share_class: str = ""  # a share's guarantee class: "mig", "mps", "timeslice"; "" for whole GPUs
    guarantee: str = ""  # what that class promises, in words: "isolated", "memory capped", "shared, best effort"


def _choice(p: Profile, chosen: Profile | None, catalog: Mapping[str, Any] | None,
            balance: Decimal | None, floor: Decimal | None, min_hours: Decimal,
            chosen_gpus: int | None = None) -> ProfileChoice:
    prices = profile_prices(p, catalog) if catalog is not None else None
    affordable, needs, hours_text, free_text = True, None, "", ""
    if not p.needs_gpu:
        price_text = "free (no GPU)"
    elif catalog is None:
        price_text = "price unavailable right now"
    elif not prices:
        price_text = f"no {p.mig} MIG instance in this pool" if p.mig else "no such GPU in this pool"
        affordable = False
    else:
        lo, hi = prices[0][1], prices[-1][1]
        unit = " per GPU" if p.adjustable else ""
        lo_one = lo / p.gpus if unit else lo
        hi_one = hi / p.gpus if unit else hi
        rng = _fmt(lo_one) if lo_one == hi_one else f"{_fmt(lo_one)}–{_fmt(hi_one)}"
        models = ", ".join(f"{m}: {_fmt(pr)}" for m, pr in prices) if len(prices) > 1 else prices[0][0]
        price_text = f"{rng} tokens/h{unit} ({models})"
        if balance is not None and floor is not None:
            affordable = balance - lo * min_hours >= floor
            hours_text = f"your balance buys ≈ {_hours(balance, floor, lo)}"
            if not affordable:
                needs = _fmt(lo * min_hours)
        counts = free_gpus(p, catalog)
        instances = free_mig(p, catalog)
        if instances is not None and instances[1]:
            free_text = f"{instances[0]} of {instances[1]} {p.mig} instances free"
        if counts is not None and counts[1]:
            free_text = f"{counts[0]} of {counts[1]} GPUs free"
            if counts[0] < p.gpus:  # no room for this profile: how many wait, and for how long
                free_text = full_text(e for e in _catalog_models(p, catalog) if e.get("price_per_gpu_hour") is not None)
    checked = chosen is not None and p.slug == chosen.slug
    counts = tuple(range(p.gpus, p.max_gpus + 1)) if p.adjustable else ()
    return ProfileChoice(
        slug=p.slug, display_name=p.display_name, what=p.describe(), description=p.description,
        price="; ".join(t for t in (price_text, hours_text) if t), affordable=affordable,
        checked=checked, needs=needs, gpu_counts=counts, free=free_text,
        gpus_selected=chosen_gpus if checked and chosen_gpus in counts else 0,
        share_class=p.share_class, guarantee=p.class_words,
    )


def form_context(profiles: Sequence[Profile], chosen: Profile | None, account: Mapping[str, Any] | None,
                 catalog: Mapping[str, Any] | None, chosen_gpus: int | None = None) -> dict[str, Any]:
    """What the template shows, from the profiles and the service's answers (None: no answer).

    ``account`` is the user's ``GET /users/{name}`` view (balance, floor,
    credits); ``catalog`` is ``GET /models`` (prices, free GPUs,
    ``min_start_hours``). ``chosen_gpus``: the GPU count preselected for an
    adjustable ``chosen`` profile. A profile is affordable when its cheapest price for
    ``min_start_hours`` keeps the balance at or above the floor.
    """
    balance = floor = None
    if account:
        balance, floor = _decimal(account.get("balance")), _decimal(account.get("floor"))
        if balance is None or floor is None:
            balance = floor = None
    daily = None
    if balance is not None and account:
        credits = account.get("credits") or {}
        amount = _decimal(credits.get("daily")) if isinstance(credits, Mapping) and credits.get("daily") else None
        daily = _fmt(amount) if amount is not None and amount > 0 else None
    min_hours = DEFAULT_MIN_START_HOURS
    if catalog is not None:
        min_hours = _decimal(catalog.get("min_start_hours")) or DEFAULT_MIN_START_HOURS
    notices = account.get("notices") if account else None
    return {
        "notices": [n for n in notices if isinstance(n, Mapping)] if isinstance(notices, list) else [],
        "balance": None if balance is None else {
            "value": str(balance), "text": _fmt(balance), "floor": _fmt(floor), "daily": daily,  # type: ignore[arg-type]
        },
        "prices_known": catalog is not None,
        "min_start_hours": _fmt(min_hours),
        "profiles": [_choice(p, chosen, catalog, balance, floor, min_hours, chosen_gpus) for p in profiles],
    }


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
    (``options_from_query``); they are preselected, else the last start's profile."""
    profiles = spawner.gpupool_profiles
    chosen = spawner.default_profile()
    wanted = linked or (spawner.user_options if isinstance(spawner.user_options, dict) else {})
    previous = wanted.get("profile")
    if isinstance(previous, str) and any(p.slug == previous for p in profiles):
        chosen = next(p for p in profiles if p.slug == previous)
    gpus = wanted.get("gpus") if linked and isinstance(wanted.get("gpus"), int) else None
    confirm = None
    if linked and chosen is not None and chosen.needs_gpu:
        confirm = (f"{chosen.display_name} costs tokens, so a link does not start it. "
                   "Check the choice below and press Start to start it.")
    env = template_environment(tuple(spawner.form_template_paths))
    return env.get_template(TEMPLATE).render(form_context(profiles, chosen, account, catalog, gpus),
                                             pages_url=pages_url(spawner), confirm=confirm)


def pages_url(spawner: Any) -> str | None:
    """Where the service's "My GPU usage" page is: ``{hub prefix}services/{name}/``.

    JupyterHub puts its own pages at ``{prefix}hub/``, so the prefix is that minus ``hub/``."""
    hub_base = getattr(getattr(spawner, "hub", None), "base_url", None)
    if not isinstance(hub_base, str) or not hub_base.endswith("hub/"):
        return None
    return f"{hub_base[:-len('hub/')]}services/{quote(spawner.gpupool_service_name, safe='')}/"
