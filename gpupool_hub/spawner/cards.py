"""The spawn form's cards: each profile with what it gives, what it costs and whether it fits now.

Built from the profiles and the service's answers (``GET /models`` for prices,
free GPUs and who waits; ``GET users/{name}`` for the balance, the floor and
what the user already runs) into plain text for the template: no HTML here,
no I/O. What a start needs is :func:`~gpupool_hub.money.credits.start_need`, the
rule the service's admission refuses by, so the card and the refusal agree.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

from ..money.credits import CreditRules, can_start, hours_bought, start_need
from ..money.pricing import model_matches
from ..profiles import Profile
from ..money.units import amount_text, hours_text, plural, rate_text
from .wait_rules import full_text

__all__ = ["CardAccount", "ProfileChoice", "card", "free_gpus", "free_mig", "kept_gpus", "profile_prices"]

#: how each guarantee class is named on a card, before what it promises
CLASS_LABELS = {"mig": "MIG", "mps": "MPS", "timeslice": "time-sliced"}
#: fractions people write as such ("½ of an RTX A6000"); others read "0.3 of …"
FRACTIONS = {250: "¼", 500: "½", 750: "¾"}


def decimal(value: Any) -> Decimal | None:
    """A finite Decimal from the service's JSON, else None."""
    try:
        out = Decimal(str(value))
    except InvalidOperation:
        return None
    return out if out.is_finite() else None


@dataclass(frozen=True)
class CardAccount:
    """What the cards need of the user's account: the balance, the floor and what runs already."""

    balance: Decimal
    floor: Decimal
    held_per_hour: Decimal = Decimal(0)  # the price of the GPU servers the user runs now

    @classmethod
    def from_view(cls, view: Mapping[str, Any] | None) -> CardAccount | None:
        """From the service's ``GET users/{name}``; None when it did not answer or is unreadable."""
        if not view:
            return None
        balance, floor = decimal(view.get("balance")), decimal(view.get("floor"))
        if balance is None or floor is None:
            return None
        return cls(balance, floor, decimal(view.get("burn_rate_per_hour")) or Decimal(0))


# ------------------------------------------------------------ the catalog


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
        price = decimal(entry.get("price_per_gpu_hour")) if entry.get("price_per_gpu_hour") is not None else None
        if price is not None:  # a model without a price cannot be allocated
            out.append((entry["model"], price * profile.gpu_amount * factor))
    return sorted(out, key=lambda mp: (mp[1], mp[0]))


def _share_factor(profile: Profile, catalog: Mapping[str, Any]) -> Decimal:
    """The admin's price factor for the profile's class of fraction (``c.GPUPool.share_price_factors``,
    which ``GET models`` states), so the form shows what the debits will charge; 1 for whole GPUs."""
    factors = catalog.get("share_price_factors")
    if not profile.gpu_milli or not isinstance(factors, Mapping):
        return Decimal(1)
    factor = decimal(factors.get(profile.share_class, "1"))
    return factor if factor is not None and factor >= 0 else Decimal(1)


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
        price = decimal(hit.get("price_per_hour")) if hit.get("price_per_hour") is not None else None
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
    """(whole GPUs free for it, GPUs in the pool) over the models a GPU profile may use.

    None for CPU-only and MIG profiles. For a fraction it counts whole GPUs too; a
    share also fits on a GPU already shared (``largest_share_milli``), which the
    card says instead when no GPU is wholly free. GPUs the service keeps whole for a
    profile of more GPUs (:func:`kept_gpus`) are not free for this one: its spawn would wait.
    """
    if not profile.needs_gpu or profile.mig:
        return None
    free = total = 0
    for entry in _priced(profile, catalog):
        free += int(entry.get("whole_free") or 0)
        total += int(entry.get("gpus") or 0)
    return max(0, free - kept_gpus(profile, catalog)), total


def kept_gpus(profile: Profile, catalog: Mapping[str, Any]) -> int:
    """Whole free GPUs of the profile's priced models that the service keeps from it for a
    profile of more GPUs (``GET models``' ``profiles[].kept_whole``); 0 when it says none."""
    kept = _profile_field(profile, catalog, "kept_whole")
    if kept is None:
        return 0
    priced = {e.get("model") for e in _priced(profile, catalog)}
    return sum(n for model, n in kept.items() if model in priced and isinstance(n, int) and n > 0)


def _profile_field(profile: Profile, catalog: Mapping[str, Any], key: str) -> Mapping[str, Any] | None:
    """``GET models``' ``profiles[].<key>`` (a model → number map) for this profile; None when absent."""
    entry = next((e for e in catalog.get("profiles") or []
                  if isinstance(e, Mapping) and e.get("slug") == profile.slug), None)
    value = entry.get(key) if entry is not None else None
    return value if isinstance(value, Mapping) else None


def _priced(profile: Profile, catalog: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    return [e for e in _catalog_models(profile, catalog) if e.get("price_per_gpu_hour") is not None]


# ------------------------------------------------------------ the card


@dataclass(frozen=True)
class ProfileChoice:
    """One profile as the form shows it (a card); every field is plain text for the template."""

    slug: str
    display_name: str
    what: str  # the request in words, as the progress page says it: "2 GPUs (RTX 3090)"
    description: str
    price: str  # "4 tokens/h", "1–4 tokens/h", "4 tokens/h per GPU", "free"; or why there is none
    affordable: bool
    checked: bool
    needs: str | None  # "needs 6.5 tokens above your floor (…)", when the balance does not have them
    gpu_counts: tuple[int, ...]  # choices of an adjustable profile
    free: str  # "1 of 2 GPUs free", "full — 2 waiting, about 20 min", or "" when not known
    gpus_selected: int = 0  # the GPU count chosen in advance (a link's), 0: the first
    share_class: str = ""  # a share's guarantee class: "mig", "mps", "timeslice"; "" for whole GPUs
    guarantee: str = ""  # what that class promises, in words: "isolated", "memory capped", "shared, best effort"
    gpu: str = ""  # "2 × NVIDIA GeForce RTX 3090", "½ of one NVIDIA RTX A6000, 24 GiB of its memory", "none"
    class_label: str = ""  # "MIG", "MPS", "time-sliced" for a share
    resources: str = ""  # "8 CPUs · 32 GiB memory" (what the profile sets), "" when it sets neither
    hours: str = ""  # "Your balance buys 12 h above the floor"
    full: bool = False  # no room now: the card highlights ``free``
    price_models: str = ""  # per model when they differ: "NVIDIA GeForce RTX 3090: 1, NVIDIA RTX A6000: 4"


def _gib(mib: float) -> str:
    gib = Decimal(str(mib)) / 1024
    return f"{amount_text(gib.quantize(Decimal('0.1')) if gib < 10 else gib.quantize(Decimal(1)))} GiB"


def resources_text(p: Profile) -> str:
    """"8 CPUs · 32 GiB memory": what the profile sets, in the units a researcher thinks in."""
    parts = []
    if p.cpu is not None:
        cores = Decimal(str(p.cpu)).normalize()
        parts.append(f"{amount_text(cores)} CPU{'' if cores == 1 else 's'}")
    if p.memory is not None:
        parts.append(f"{_gib(p.memory / 2**20)} memory")
    return " · ".join(parts)


def gpu_text(p: Profile, models: list[Mapping[str, Any]], gpus: int | None = None) -> str:
    """The GPU line of a card, naming the pool's own models where the catalog gave them."""
    names = [str(e["model"]) for e in models] or list(p.models)
    which = " or ".join(names) if names else "any GPU model"
    if not p.needs_gpu:
        return "none"
    if p.mig:
        return f"One {p.mig} MIG instance on {which}" if names else f"One {p.mig} MIG instance"
    if p.gpu_milli:
        share = FRACTIONS.get(p.gpu_milli, amount_text(Decimal(p.gpu_milli) / 1000))
        text = f"{share} of one {which}" if names else f"{share} of one GPU"
        memory = [int(e["memory_mib"]) for e in models if isinstance(e.get("memory_mib"), int) and e["memory_mib"] > 0]
        if memory:
            text += f", {_gib(min(memory) * p.gpu_milli / 1000)} of its memory"
        return text
    n = p.gpus if gpus is None else gpus
    return f"{n} × {which}" if names else plural(n, "GPU")


def _price_words(p: Profile, prices: list[tuple[str, Decimal]]) -> tuple[str, str]:
    lo, hi = prices[0][1], prices[-1][1]
    per = p.gpus if p.adjustable else 1
    rate = rate_text(lo / per) if lo == hi else f"{amount_text(lo / per)}–{amount_text(hi / per)} tokens/h"
    detail = ", ".join(f"{m}: {amount_text(pr / per)}" for m, pr in prices) if len(prices) > 1 else ""
    return f"{rate}{' per GPU' if p.adjustable else ''}", detail


def card(p: Profile, catalog: Mapping[str, Any] | None, account: CardAccount | None, min_hours: Decimal,
         checked: bool, chosen_gpus: int | None = None) -> ProfileChoice:
    """One profile's card. Affordable: its cheapest price passes the service's own check
    (``credits.can_start`` with what the user already runs) for ``min_hours``."""
    models = _priced(p, catalog) if catalog is not None and p.needs_gpu and not p.mig else []
    prices = profile_prices(p, catalog) if catalog is not None else None
    affordable, needs, hours, free, full, detail = True, None, "", "", False, ""
    if not p.needs_gpu:
        price = "free"
    elif catalog is None:
        price = "price unavailable right now"
    elif not prices:
        price = f"no {p.mig} MIG instance in this pool" if p.mig else "no such GPU in this pool"
        affordable = False
    else:
        price, detail = _price_words(p, prices)
        cheapest = prices[0][1]
        if account is not None:
            rules = CreditRules(initial=Decimal(0), monthly=Decimal(0), daily=Decimal(0), floor=account.floor)
            affordable = can_start(account.balance, cheapest, rules, min_hours, account.held_per_hour)
            bought = hours_bought(account.balance, account.floor, cheapest)
            if bought is not None and account.balance > account.floor:  # at the floor the balance line says so
                hours = f"Your balance buys {hours_text(bought)} above the floor"
            if not affordable:
                need = start_need(cheapest, account.held_per_hour, min_hours)
                running = " together with your running GPU servers" if account.held_per_hour else ""
                have = amount_text(max(Decimal(0), account.balance - account.floor))
                needs = (f"needs {amount_text(need)} tokens above your floor for its first {amount_text(min_hours)} h"
                         f"{running}; you have {have}")
        free, full = _free_words(p, catalog)
    counts = tuple(range(p.gpus, p.max_gpus + 1)) if p.adjustable else ()
    return ProfileChoice(
        slug=p.slug, display_name=p.display_name, what=p.describe(), description=p.description,
        price=price, affordable=affordable, checked=checked, needs=needs, gpu_counts=counts, free=free,
        gpus_selected=chosen_gpus if checked and chosen_gpus in counts else 0,
        share_class=p.share_class, guarantee=p.class_words, gpu=gpu_text(p, models),
        class_label=CLASS_LABELS.get(p.share_class, ""), resources=resources_text(p), hours=hours, full=full,
        price_models=detail,
    )


def _free_words(p: Profile, catalog: Mapping[str, Any]) -> tuple[str, bool]:
    """("1 of 2 GPUs free" or "full — n waiting, about …", whether it is full)."""
    instances = free_mig(p, catalog)
    if instances is not None and instances[1]:
        return f"{instances[0]} of {plural(instances[1], p.mig + ' instance')} free", False
    counts = free_gpus(p, catalog)
    if counts is None or not counts[1]:
        return "", False
    if p.gpu_milli and not counts[0]:  # a share also fits beside others, on a GPU already shared
        shared = max((int(e.get("largest_share_milli") or 0) for e in _priced(p, catalog)), default=0)
        if shared >= p.gpu_milli:
            return "room on a GPU already shared", False
    kept = kept_gpus(p, catalog)
    why = f" ({plural(kept, 'free GPU')} kept whole for servers of more GPUs)" if kept else ""
    if counts[0] < (1 if p.gpu_milli else p.gpus):  # no room: how many wait, and for how long
        return full_text(_priced(p, catalog)) + why, True
    block = _largest_block(p, catalog)
    if block is not None and block < p.gpus:  # free GPUs, but scattered: its spawn would wait
        also = f"; {kept} more kept whole for servers of more GPUs" if kept else ""
        return (full_text(_priced(p, catalog)) +
                f" ({plural(counts[0], 'free GPU')}, at most {block} on one node{also})"), True
    return f"{counts[0]} of {plural(counts[1], 'GPU')} free{why}", False


def _largest_block(p: Profile, catalog: Mapping[str, Any]) -> int | None:
    """The most whole free GPUs of one node among the profile's priced models, for a profile of
    several GPUs (they must all be on one node); None for others or when the catalog does not say.

    Why: a card for 8 GPUs read "40 of 128 GPUs free" while no node had 8 free at once, and
    the spawn queued. Where nodes are kept whole for a profile of more GPUs, the profile's own
    ``open_block`` replaces the model's block, which counts the kept nodes."""
    if p.gpus < 2:
        return None
    open_to_it = _profile_field(p, catalog, "open_block") or {}
    blocks = []
    for e in _priced(p, catalog):
        block = open_to_it.get(e.get("model"), e.get("largest_whole_block"))
        if isinstance(block, int):
            blocks.append(block)
    return max(blocks) if blocks else None
