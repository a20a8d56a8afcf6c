"""The spawn form's catalog (``GET models``): per GPU model of the pool, its price,
how many GPUs there are and how many are free now, and per MIG profile its
instances; per configured spawn profile its guarantee class and its price. A read-only view of the inventory, kept out of ``PoolInventory``,
which owns the hardware facts rather than how they are shown."""

from __future__ import annotations

from decimal import Decimal
from typing import TYPE_CHECKING, Any

from ...placement.mig import instance_profile
from ...placement.state import Pool
from ...money.pricing import SHARE_PRICE_CLASSES, PriceTable, PricingError, model_matches
from ...profiles import Profile, format_decimal
from ...money.units import format_tokens

if TYPE_CHECKING:
    from .pool_inventory import PoolInventory

__all__ = ["catalog"]


def catalog(inventory: "PoolInventory", min_start_hours: Decimal) -> dict[str, Any]:
    """Per pool GPU model: price per GPU-hour, GPUs in the pool, whole GPUs free and (when stated) its memory."""
    pool, prices = inventory.pool, inventory.prices
    free = pool.free_summary().per_model
    counts: dict[str, int] = {}
    memory: dict[str, int] = {}  # the smallest stated memory of each model: what a share surely gets a part of
    for ns in pool.nodes:
        for g in ns.node.gpus:
            counts[g.model] = counts.get(g.model, 0) + 1
            if g.memory_mib > 0:
                memory[g.model] = min(memory.get(g.model, g.memory_mib), g.memory_mib)
    instances = _mig_instances(pool)
    models = []
    for model in sorted(counts):
        try:
            price: str | None = format_tokens(prices.price_per_gpu_hour(model))
        except PricingError:
            price = None
        e = free.get(model, {})
        entry: dict[str, Any] = {"model": model, "price_per_gpu_hour": price, "gpus": counts[model],
                                 "whole_free": e.get("whole_free", 0),
                                 "largest_whole_block": e.get("largest_whole_block", 0),
                                 "largest_share_milli": e.get("largest_share_milli", 0)}
        if model in memory:
            entry["memory_mib"] = memory[model]
        if model in instances:
            entry["mig"] = _mig_catalog(prices, model, instances[model])
        models.append(entry)
    profiles = []
    for p in inventory.expected_profiles[0]:
        req = inventory.profile_requests.get(p.slug)
        kept, blocks = (pool.withheld(req), pool.open_blocks(req)) if req is not None else ({}, {})
        profiles.append(_profile_entry(p, prices, sorted(counts), kept, blocks))
    factors = {c: format_decimal(prices.share_factor(c)) for c in SHARE_PRICE_CLASSES}
    return {"models": models, "min_start_hours": format_tokens(min_start_hours), "profiles": profiles,
            "share_price_factors": factors}


def _profile_entry(profile: Profile, prices: PriceTable, models: list[str],
                   kept: dict[str, int], blocks: dict[str, int]) -> dict[str, Any]:
    """A configured profile's class, in words, its price per hour on each pool model it may use,
    and per model the whole free GPUs kept from it for profiles of more GPUs (``kept``:
    :meth:`Pool.withheld`), which it would wait for rather than take, with the most whole
    free GPUs on one node left open to it (``blocks``: :meth:`Pool.open_blocks`)."""
    per_model: dict[str, str | None] = {}
    if profile.needs_gpu:
        for model in models:
            if profile.models and not any(model_matches(name, model) for name in profile.models):
                continue
            try:
                hourly = (prices.mig_price_per_hour(model, profile.mig) if profile.mig
                          else prices.price_per_hour(model, profile.gpu_amount, profile.share_class))
                per_model[model] = format_tokens(hourly)
            except (PricingError, ValueError):
                per_model[model] = None
    return {"slug": profile.slug, "display_name": profile.display_name, "class": profile.share_class,
            "class_words": profile.class_words, "prices": per_model, "kept_whole": kept,
            "open_block": blocks}


def _mig_instances(pool: Pool) -> dict[str, dict[str, list[int]]]:
    """model → MIG profile → [instances, free ones] over the pool."""
    out: dict[str, dict[str, list[int]]] = {}
    for ns in pool.nodes:
        for s, m in enumerate(ns.slot_mig):
            if m is None:
                continue
            model = ns.node.gpus[ns.slot_gpu[s]].model
            counts = out.setdefault(model, {}).setdefault(instance_profile(m), [0, 0])
            counts[0] += 1
            counts[1] += ns.free[s] == ns.cap[s]
    return out


def _mig_catalog(prices: PriceTable, model: str, profiles: dict[str, list[int]]) -> dict[str, Any]:
    """Per MIG profile of ``model``: the price of one instance-hour, instances, free ones."""
    out = {}
    for profile, (total, free) in sorted(profiles.items()):
        try:
            price: str | None = format_tokens(prices.mig_price_per_hour(model, profile))
        except (PricingError, ValueError):  # unpriced model, or a non-standard profile name
            price = None
        out[profile] = {"price_per_hour": price, "instances": total, "free": free}
    return out
