"""Server profiles: what ``c.GPUPoolSpawner.profiles`` may say, checked once, as values.

The hub's spawner and the gpupool service both read the profile list (the
service checks it at start-up so a bad list fails at once, not at the first
spawn), so the parsing lives here, free of JupyterHub and tornado: a
:class:`Profile` is plain data, and :func:`choose_profile` turns a user's
``user_options`` into a profile and a GPU count or says, in
:class:`InvalidOptions`, what is wrong and what is allowed.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from traitlets import TraitError

from .mig import MigProfileError, parse_mig_profile
from .identity.names import name_problem
from .money.pricing import model_matches

__all__ = [
    "MAX_GPUS", "PROFILE_KEYS", "SHARE_CLASSES", "InvalidOptions", "Profile", "choose_profile", "default_profile",
    "format_decimal", "parse_memory", "parse_profile", "parse_profiles",
]

MAX_GPUS = 16  # the placement engine's limit per server

_SLUG = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_BYTES = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]i?)?B?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "K": 2**10, "M": 2**20, "G": 2**30, "T": 2**40}

PROFILE_KEYS = {
    "slug": "short name used in user_options ({'profile': slug}); letters, digits, '.', '_', '-'",
    "display_name": "what the options form shows",
    "description": "optional longer text under the name",
    "gpus": "whole GPUs (0-16); 0 or absent with no gpu_fraction = a CPU-only profile",
    "gpu_fraction": "a share of one GPU (0 < f < 1, at most 3 decimals), instead of gpus",
    "mig": "one MIG instance of this profile, e.g. '1g.10gb' or '3g.40gb', instead of gpus/gpu_fraction",
    "share": "how a gpu_fraction is kept to its share: 'timeslice' (default) or 'mps' (see SHARE_CLASSES)",
    "max_gpus": "let users pick 1..max_gpus whole GPUs (user option 'gpus'); default: exactly gpus",
    "models": "allowed GPU models, e.g. ['RTX 3090'] (matched like c.GPUPool.prices); default any",
    "cpu": "CPU cores (number); sets cpu_limit and the placement request",
    "memory": "memory, e.g. '16G', '512M' or bytes; sets mem_limit and the placement request",
    "default": "true for the profile preselected in the form and used when user_options is empty",
    "spawner_override": "dict of spawner trait values applied when this profile is chosen",
}


#: A share's guarantee class -> the words people see on the spawn page and in ``GET models``.
#: ``mig``: the hardware isolates the instance (memory and compute). ``mps``: NVIDIA MPS caps
#: the memory a server may allocate and its compute (active thread percentage); the node agent
#: sets both through the GPU's MPS control daemon. ``timeslice``: the GPU is time-shared and
#: nothing isolates memory; the agent's guard warns, then stops what holds more than the share.
SHARE_CLASSES = {"mig": "isolated", "mps": "memory capped", "timeslice": "shared, best effort"}


def format_decimal(value: Decimal) -> str:
    """A decimal as people write it: ``2`` not ``2.000``, ``0.25`` not ``2.5E-1``."""
    return format(value.normalize(), "f")


@dataclass(frozen=True)
class Profile:
    """One validated entry of ``c.GPUPoolSpawner.profiles``."""

    slug: str
    display_name: str
    description: str = ""
    gpus: int = 0
    gpu_milli: int = 0
    mig: str = ""  # canonical MIG profile ("1g.10gb"): exactly one instance of it
    share: str = ""  # "mps" or "timeslice" for a gpu_fraction; see share_class
    max_gpus: int = 0
    models: tuple[str, ...] = ()
    cpu: float | None = None
    memory: int | None = None  # bytes
    default: bool = False
    spawner_override: Mapping[str, Any] = field(default_factory=dict)

    @property
    def needs_gpu(self) -> bool:
        return self.gpus > 0 or self.gpu_milli > 0 or self.max_gpus > 0 or bool(self.mig)

    @property
    def gpu_amount(self) -> Decimal:
        """GPUs in this profile's base request (a fraction for a shared GPU)."""
        return Decimal(self.gpu_milli) / 1000 if self.gpu_milli else Decimal(self.gpus)

    @property
    def share_class(self) -> str:
        """The guarantee a share gets: ``mig``, ``mps`` or ``timeslice``; ``""`` for whole GPUs and
        CPU-only profiles, which share nothing."""
        if self.mig:
            return "mig"
        if self.gpu_milli:
            return self.share or "timeslice"
        return ""

    @property
    def class_words(self) -> str:
        """What the class promises, in the words of the spawn page ("memory capped"); ``""`` without one."""
        return SHARE_CLASSES.get(self.share_class, "")

    @property
    def adjustable(self) -> bool:
        """Whether users pick the whole-GPU count (``gpus`` .. ``max_gpus``)."""
        return self.max_gpus > self.gpus

    def describe(self, gpus: int | None = None) -> str:
        """What the request is, in words, for the form and the progress page."""
        n = self.gpus if gpus is None else gpus
        if self.mig:
            what = f"a {self.mig} MIG instance"
        elif self.gpu_milli:
            what = f"{format_decimal(Decimal(self.gpu_milli) / 1000)} of a GPU"
        elif n:
            what = f"{n} GPU{'s' if n != 1 else ''}"
        else:
            what = "no GPU"
        if self.models and (self.mig or self.gpu_milli or n):
            what += f" ({' or '.join(self.models)})"
        return what

    def request(self, gpus: int | None = None) -> dict[str, Any]:
        """The body's ``request`` for ``POST /allocations``."""
        body: dict[str, Any] = {}
        if self.mig:
            body["mig"] = self.mig
        elif self.gpu_milli:
            body["gpu_fraction"] = format_decimal(Decimal(self.gpu_milli) / 1000)
            body["share"] = self.share_class
        else:
            body["gpus"] = self.gpus if gpus is None else gpus
        if self.models:
            body["models"] = list(self.models)
        if self.cpu is not None:
            body["cpu_milli"] = int(round(self.cpu * 1000))
        if self.memory is not None:
            body["memory_mib"] = self.memory // 2**20
        return body


# ------------------------------------------------------------------ parsing


def _int(value: Any, where: str, key: str, lo: int, hi: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        raise TraitError(f"{where}: {key!r} must be a whole number between {lo} and {hi}, got {value!r}")
    if not lo <= value <= hi:
        raise TraitError(f"{where}: {key!r} must be between {lo} and {hi}, got {value!r}")
    return value


def parse_memory(value: Any) -> int:
    """``'16G'``, ``'512Mi'``, ``'1.5G'`` or an int of bytes → bytes."""
    if isinstance(value, bool):
        raise ValueError(f"not a memory size: {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"memory must not be negative, got {value}")
        return value
    if isinstance(value, str):
        m = _BYTES.match(value)
        if m:
            unit = (m.group(2) or "").upper().rstrip("I")
            return int(Decimal(m.group(1)) * _UNITS[unit])
    raise ValueError(f"memory must be bytes or a size like '16G' or '512M', got {value!r}")


def _gpu_milli(raw: Mapping[str, Any], where: str, gpus: int) -> int:
    if "gpu_fraction" not in raw:
        return 0
    frac = raw["gpu_fraction"]
    try:
        if isinstance(frac, bool) or not isinstance(frac, (int, float, str, Decimal)):
            raise InvalidOperation
        value = Decimal(repr(frac) if isinstance(frac, float) else str(frac))
    except InvalidOperation:
        raise TraitError(f"{where}: 'gpu_fraction' must be a number between 0 and 1, got {frac!r}") from None
    if not value.is_finite() or not 0 < value < 1 or (value * 1000) % 1:
        raise TraitError(
            f"{where}: 'gpu_fraction' must be between 0 and 1 (exclusive) with at most 3 decimals, got {frac!r}"
        )
    if gpus:
        raise TraitError(f"{where}: give either 'gpus' or 'gpu_fraction', not both")
    return int(value * 1000)


def _mig(raw: Mapping[str, Any], where: str) -> str:
    if "mig" not in raw:
        return ""
    try:
        profile = parse_mig_profile(raw["mig"])
    except MigProfileError as e:
        raise TraitError(f"{where}: 'mig': {e}") from None
    clash = sorted(k for k in ("gpus", "gpu_fraction", "max_gpus") if k in raw)
    if clash:
        raise TraitError(f"{where}: 'mig' asks for exactly one MIG instance; remove {clash}")
    return profile


def _share(raw: Mapping[str, Any], where: str, gpu_milli: int, mig: str) -> str:
    if "share" not in raw:
        return ""
    share = raw["share"]
    if mig and share == "mig":
        return ""  # a MIG profile's class is mig whatever it says
    if share not in ("mps", "timeslice"):
        raise TraitError(f"{where}: 'share' must be 'timeslice' or 'mps' (a 'mig' profile is isolated by the "
                         f"hardware already), got {share!r}")
    if not gpu_milli:
        raise TraitError(f"{where}: 'share' says how a 'gpu_fraction' is kept to its share; this profile has none")
    return str(share)


def _models(raw: Mapping[str, Any], where: str, has_gpu: bool) -> tuple[str, ...]:
    models = raw.get("models", [])
    if isinstance(models, str):
        models = [models]
    if not isinstance(models, (list, tuple)) or not all(isinstance(m, str) and m.strip() for m in models):
        raise TraitError(f"{where}: 'models' must be a list of GPU model names such as ['RTX 3090'], got {models!r}")
    if models and not has_gpu:
        raise TraitError(
            f"{where}: 'models' needs 'gpus', 'gpu_fraction' or 'mig' (a CPU-only profile has no GPU model)")
    for m in models:  # the spawner sends them to the service, which takes only names
        if problem := name_problem(m):
            raise TraitError(f"{where}: GPU model name {m!r} {problem}")
    return tuple(m.strip() for m in models)


def _resources(raw: Mapping[str, Any], where: str) -> tuple[float | None, int | None]:
    cpu = raw.get("cpu")
    if cpu is not None:
        if isinstance(cpu, bool) or not isinstance(cpu, (int, float)) or not 0 < cpu <= 4096:
            raise TraitError(f"{where}: 'cpu' must be a number of cores (0 < cpu <= 4096), got {cpu!r}")
        cpu = float(cpu)
    memory = raw.get("memory")
    if memory is not None:
        try:
            memory = parse_memory(memory)
        except ValueError as e:
            raise TraitError(f"{where}: 'memory': {e}") from None
        if memory > 2**50:
            raise TraitError(f"{where}: 'memory' {raw['memory']!r} is implausibly large")
    return cpu, memory


def parse_profile(raw: Any, index: int, trait: str = "GPUPoolSpawner.profiles") -> Profile:
    """One entry of the list → :class:`Profile`; a ``TraitError`` names the entry and the bad key."""
    where = f"c.{trait}[{index}]"
    if not isinstance(raw, Mapping):
        raise TraitError(f"{where} must be a dict with keys {sorted(PROFILE_KEYS)}, got {raw!r}")
    slug = raw.get("slug")
    if not isinstance(slug, str) or not _SLUG.match(slug):
        raise TraitError(
            f"{where}: 'slug' must be a short name of letters, digits, '.', '_' or '-' (1-63), got {slug!r}"
        )
    where = f"c.{trait}[{index}] ({slug!r})"
    unknown = sorted(set(raw) - set(PROFILE_KEYS))
    if unknown:
        raise TraitError(f"{where}: unknown key(s) {unknown}; allowed keys: {sorted(PROFILE_KEYS)}")
    display_name = raw.get("display_name", slug)
    if not isinstance(display_name, str) or not display_name.strip():
        raise TraitError(f"{where}: 'display_name' must be a non-empty string, got {display_name!r}")
    if problem := name_problem(display_name):  # the spawn form shows it to every user
        raise TraitError(f"{where}: 'display_name' {display_name!r} {problem}")
    description = raw.get("description", "")
    if not isinstance(description, str):
        raise TraitError(f"{where}: 'description' must be a string, got {description!r}")
    gpus = _int(raw.get("gpus", 0), where, "gpus", 0, MAX_GPUS)
    gpu_milli = _gpu_milli(raw, where, gpus)
    max_gpus = 0
    if "max_gpus" in raw:
        max_gpus = _int(raw["max_gpus"], where, "max_gpus", 1, MAX_GPUS)
        if gpu_milli:
            raise TraitError(f"{where}: 'max_gpus' applies to whole GPUs, not to a 'gpu_fraction' profile")
        if gpus == 0:
            gpus = 1
        if max_gpus < gpus:
            raise TraitError(f"{where}: 'max_gpus' ({max_gpus}) must be at least 'gpus' ({gpus})")
    mig = _mig(raw, where)
    share = _share(raw, where, gpu_milli, mig)
    models = _models(raw, where, bool(gpus or gpu_milli or mig))
    cpu, memory = _resources(raw, where)
    is_default = raw.get("default", False)
    if not isinstance(is_default, bool):
        raise TraitError(f"{where}: 'default' must be true or false, got {is_default!r}")
    override = raw.get("spawner_override", {})
    if not isinstance(override, Mapping) or not all(isinstance(k, str) for k in override):
        raise TraitError(f"{where}: 'spawner_override' must be a dict of spawner trait names to values")
    return Profile(
        slug=slug, display_name=display_name.strip(), description=description, gpus=gpus, gpu_milli=gpu_milli,
        mig=mig, share=share, max_gpus=max_gpus, models=models, cpu=cpu, memory=memory, default=is_default,
        spawner_override=dict(override),
    )


def parse_profiles(value: Any, trait: str = "GPUPoolSpawner.profiles") -> list[Profile]:
    """Validate a whole profile list; every error names the entry and the bad key."""
    if not isinstance(value, (list, tuple)):
        raise TraitError(f"c.{trait} must be a list of profile dicts, got {value!r}")
    profiles = [parse_profile(raw, i, trait) for i, raw in enumerate(value)]
    seen: dict[str, int] = {}
    for i, p in enumerate(profiles):
        if p.slug in seen:
            raise TraitError(f"c.{trait}[{i}]: slug {p.slug!r} is already used by entry [{seen[p.slug]}]")
        seen[p.slug] = i
    defaults = [p.slug for p in profiles if p.default]
    if len(defaults) > 1:
        raise TraitError(f"c.{trait}: only one profile may be the default, got {defaults}")
    _check_mps(profiles, trait)
    return profiles


def _check_mps(profiles: list[Profile], trait: str) -> None:
    """Refuse ``mps`` profiles two of which fit one GPU together.

    An MPS control daemon serves one Unix user per GPU at a time: a second user's
    CUDA calls wait until every process of the first has ended. Placement packs
    shares without regard to their owner, so two ``mps`` shares that fit one GPU
    may be two users' servers there; the second would hang, not start. Only when
    no two ``mps`` shares fit (each over half a GPU) does every MPS GPU serve one
    user. ``timeslice`` shares of others may fill the rest: they are no MPS clients.
    """
    mps = [p for p in profiles if p.share_class == "mps"]
    for i, a in enumerate(mps):
        for b in mps[i:]:
            if a.gpu_milli + b.gpu_milli > 1000 or not _may_share_models(a, b):
                continue
            pair = f"two {a.slug!r} servers" if a is b else f"a {a.slug!r} and a {b.slug!r} server"
            raise TraitError(
                f"c.{trait}: {pair} fit on one GPU together ({format_decimal(Decimal(a.gpu_milli) / 1000)} + "
                f"{format_decimal(Decimal(b.gpu_milli) / 1000)} <= 1), so servers of two users (two Unix users) "
                "could share one MPS GPU; NVIDIA MPS serves one Unix user per GPU at a time and the second "
                "user's CUDA calls would wait until the first user's processes end. Give 'mps' profiles a "
                "gpu_fraction above 0.5 (one MPS share per GPU, the rest for 'timeslice' shares), restrict "
                "them to different 'models', or use share 'timeslice' or a 'mig' profile.")


def _may_share_models(a: Profile, b: Profile) -> bool:
    """Whether some GPU model may serve both profiles (any model where either names none)."""
    if not a.models or not b.models:
        return True
    return any(model_matches(x, y) or model_matches(y, x) for x in a.models for y in b.models)


# ------------------------------------------------------------- user options


class InvalidOptions(ValueError):
    """``user_options`` that name no profile or a GPU count the profile does not allow."""


def default_profile(profiles: list[Profile]) -> Profile | None:
    """The profile marked ``default``, else the first; None without profiles."""
    if not profiles:
        return None
    return next((p for p in profiles if p.default), profiles[0])


def choose_profile(profiles: list[Profile], user_options: Any) -> tuple[Profile | None, int]:
    """The profile and whole-GPU count ``user_options`` ask for.

    Raises :class:`InvalidOptions` saying what is wrong and what is allowed, so
    that a user of the REST API can correct the request from the message alone.
    """
    if not isinstance(user_options, Mapping) and user_options is not None:
        raise InvalidOptions("user_options must be an object such as {\"profile\": \"<slug>\"}")
    options = dict(user_options or {})
    unknown = sorted(set(options) - {"profile", "gpus"})
    if unknown:
        raise InvalidOptions(f"unknown option(s) {unknown}; this hub accepts 'profile' and 'gpus'")
    slugs = [p.slug for p in profiles]
    slug = options.get("profile")
    if slug is None or slug == "":
        profile = default_profile(profiles)
    elif not isinstance(slug, str):
        raise InvalidOptions(f"'profile' must be a profile name (string), got {slug!r}; choose one of {slugs}")
    else:
        profile = next((p for p in profiles if p.slug == slug), None)
        if profile is None:
            shown = slug if len(slug) <= 80 else slug[:77] + "..."
            raise InvalidOptions(f"unknown profile {shown!r}; choose one of {slugs}")
    gpus = profile.gpus if profile else 0
    if options.get("gpus") is not None:
        gpus = _chosen_gpus(profile, options["gpus"])
    return profile, gpus


def _chosen_gpus(profile: Profile | None, value: Any) -> int:
    if profile is None:
        raise InvalidOptions("'gpus' needs a profile; this hub has no GPU profiles")
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidOptions(f"'gpus' must be a whole number, got {value!r}")
    if not profile.needs_gpu or profile.gpu_milli or profile.mig:
        if value != profile.gpus:
            raise InvalidOptions(f"profile {profile.slug!r} has a fixed GPU amount; leave out 'gpus'")
    else:
        lo, hi = profile.gpus, max(profile.max_gpus, profile.gpus)
        if not lo <= value <= hi:
            rng = f"{lo}" if lo == hi else f"{lo} to {hi}"
            raise InvalidOptions(f"'gpus' for profile {profile.slug!r} must be {rng}, got {value}")
    return value
