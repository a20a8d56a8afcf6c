"""The spawn options form: profiles with prices, the balance and what it buys."""

from __future__ import annotations

import html
import json
import re
from collections.abc import Mapping
from decimal import Decimal, InvalidOperation
from typing import Any

from ..profiles import Profile
from ..profiles import format_decimal as _fmt

__all__ = ["gpupool_options_from_form", "profile_prices", "render_form"]


def _model_ok(name: str, model: str) -> bool:
    from ..pricing import model_matches

    return model_matches(name, model) or name.strip().lower() == model.strip().lower()


_PRICE_CACHE: dict[str, Any] = {}


def _pool_prices(config: Any) -> tuple[Any, list[str]]:
    """Price table and pool GPU models from ``c.GPUPool`` (cached per configuration)."""
    from ..config import GPUPool

    pool = GPUPool(config=config)
    key = json.dumps([pool.prices, str(pool.default_price), pool.nodes], sort_keys=True, default=str)
    cached = _PRICE_CACHE.get("key")
    if cached and cached[0] == key:
        return cached[1], cached[2]
    from ..placement import load_nodes

    models = sorted({g.model for n in load_nodes(pool.nodes) for g in n.gpus})
    table = pool.price_table()
    _PRICE_CACHE["key"] = (key, table, models)
    return table, models


def profile_prices(profile: Profile, config: Any) -> list[tuple[str, Decimal]] | None:
    """``[(pool model, tokens per hour)]`` for the profile's base request; [] if no pool model fits."""
    if not profile.needs_gpu:
        return None
    table, models = _pool_prices(config)
    out = []
    for model in models:
        if profile.models and not any(_model_ok(name, model) for name in profile.models):
            continue
        try:
            out.append((model, table.price_per_hour(model, profile.gpu_amount)))
        except Exception:
            continue
    return sorted(out, key=lambda mp: (mp[1], mp[0]))


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


def _hours(balance: Decimal, floor: Decimal, price: Decimal) -> str:
    if price <= 0:
        return "unlimited"
    hours = max(Decimal(0), balance - floor) / price
    if hours >= 100:
        return f"{hours:.0f} h"
    return f"{hours:.1f} h"


def render_form(spawner: Any, account: Mapping[str, Any] | None) -> str:
    """The options form: each profile with its price per hour, the balance and what it buys."""
    e = html.escape
    parts = ['<div class="gpupool-form">']
    balance = floor = None
    min_hours = Decimal(1)
    try:
        from ..config import GPUPool

        min_hours = GPUPool(config=spawner.config).min_start_hours
    except Exception:
        pass
    if account:
        try:
            balance, floor = Decimal(str(account["balance"])), Decimal(str(account["floor"]))
        except (KeyError, InvalidOperation):
            balance = floor = None
    if balance is not None and floor is not None:
        credits = account.get("credits") or {} if account else {}
        extra = ""
        if credits.get("daily") and Decimal(str(credits["daily"])) > 0:
            extra = f" +{e(_fmt(Decimal(str(credits['daily']))))} tokens every day."
        parts.append(
            f'<p class="gpupool-balance" data-balance="{e(str(balance))}">Your balance: '
            f"<strong>{e(_fmt(balance))} tokens</strong> (servers stop at {e(_fmt(floor))}).{extra}</p>"
        )
    else:
        parts.append('<p class="gpupool-balance gpupool-unknown">Your balance is unavailable right now; '
                     "GPU profiles are checked when the server starts.</p>")
    chosen = spawner.default_profile()
    previous = (spawner.user_options or {}).get("profile") if isinstance(spawner.user_options, dict) else None
    if isinstance(previous, str) and any(p.slug == previous for p in spawner.gpupool_profiles):
        chosen = next(p for p in spawner.gpupool_profiles if p.slug == previous)
    for p in spawner.gpupool_profiles:
        prices = profile_prices(p, spawner.config)
        affordable = True
        price_text = "free (no GPU)"
        hours_text = ""
        if prices is not None:
            if not prices:
                price_text = "no such GPU in this pool"
                affordable = False
            else:
                lo, hi = prices[0][1], prices[-1][1]
                unit = " per GPU" if p.max_gpus > p.gpus else ""
                lo_one = lo / p.gpus if unit else lo
                hi_one = hi / p.gpus if unit else hi
                rng = _fmt(lo_one) if lo_one == hi_one else f"{_fmt(lo_one)}–{_fmt(hi_one)}"
                models = ", ".join(f"{m}: {_fmt(pr)}" for m, pr in prices) if len(prices) > 1 else prices[0][0]
                price_text = f"{rng} tokens/h{unit} ({models})"
                if balance is not None and floor is not None:
                    affordable = balance - lo * min_hours >= floor
                    hours_text = f"your balance buys ≈ {_hours(balance, floor, lo)}"
        cls = "gpupool-profile" + ("" if affordable else " gpupool-unaffordable")
        checked = " checked" if chosen is not None and p.slug == chosen.slug else ""
        parts.append(
            f'<div class="{cls}" data-profile="{e(p.slug)}" data-affordable="{str(affordable).lower()}">'
            f'<label><input type="radio" name="profile" value="{e(p.slug)}"{checked}> '
            f"<strong>{e(p.display_name)}</strong> — {e(p.describe())}</label>"
        )
        if p.description:
            parts.append(f'<div class="gpupool-description">{e(p.description)}</div>')
        details = [price_text] + ([hours_text] if hours_text else [])
        parts.append(f'<div class="gpupool-price">{e("; ".join(details))}</div>')
        if not affordable and prices:
            parts.append('<div class="gpupool-warning text-danger">Not enough tokens to start this profile '
                         f"(it needs {e(_fmt(prices[0][1] * min_hours))} tokens above your floor).</div>")
        if p.max_gpus > p.gpus:
            opts = "".join(f'<option value="{n}">{n}</option>' for n in range(p.gpus, p.max_gpus + 1))
            parts.append(f'<label>GPUs: <select name="gpus--{e(p.slug)}">{opts}</select></label>')
        parts.append("</div>")
    parts.append("</div>")
    return "\n".join(parts)

