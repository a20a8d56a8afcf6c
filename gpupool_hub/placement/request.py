"""What a user asks for: CPU, memory and whole GPUs or one GPU fraction."""

from __future__ import annotations

from dataclasses import dataclass
from typing import AbstractSet, Iterable, Optional

from ..mig import MigProfileError, nominal_milli, parse_mig_profile
from .errors import InvalidRequest

MILLI = 1000  # one whole GPU, in milli-GPU
MAX_GPUS = 16


def normalize_model(model: str) -> str:
    """Canonical key for a GPU model string.

    NVML spells models like "NVIDIA GeForce RTX 3090"; admins and users type them
    with arbitrary case and stray spaces. Matching is deliberately exact apart
    from case and whitespace: fuzzy matching lives in the pricing module, and
    keeping this in one function means there is one place to change it.
    """
    return " ".join(model.split()).casefold()


def model_allowed(gpu_model_key: str, allowed_keys: Optional[AbstractSet[str]]) -> bool:
    """Whether a GPU (already normalized with :func:`normalize_model`) may serve a request."""
    return allowed_keys is None or gpu_model_key in allowed_keys


@dataclass(frozen=True, slots=True)
class Request:
    """A server's resource request.

    Either ``gpus`` whole GPUs (0-16) or one fraction ``gpu_milli`` (1-999) of a
    single GPU, never both: a fraction spread over several devices is not
    something a notebook can use. ``models`` restricts which GPU models may
    serve it (``None`` = any).

    ``required`` and ``preferred`` name devices by UUID (a GPU's, or a MIG
    instance's), like go-gpuallocator's required devices: the placement
    includes every ``required`` device (so they pin the node too), and as many
    ``preferred`` ones as it can, on the node holding most of them. The
    service uses them to put a server back on the GPUs it had, or to pin one.
    A fraction takes at most one required device; naming a GPU with MIG
    instances lets it take any of them.

    ``mig`` (a profile such as ``"1g.10gb"``) asks for exactly one free MIG
    instance of that profile, instead of ``gpus`` or ``gpu_milli``: MIG
    instances are fixed partitions, so the profile, not a share, is what fits.
    """

    cpu_milli: int = 0
    memory_mib: int = 0
    gpus: int = 0
    gpu_milli: int = 0
    models: Optional[frozenset] = None
    required: frozenset = frozenset()
    preferred: frozenset = frozenset()
    mig: Optional[str] = None
    share: str = ""  # a fraction's guarantee class ("mps", "timeslice"); placement does not read it

    def __post_init__(self) -> None:
        for name in ("cpu_milli", "memory_mib", "gpus", "gpu_milli"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise InvalidRequest(f"{name} must be a whole number, got {value!r}")
            if value < 0:
                raise InvalidRequest(f"{name} must not be negative, got {value}")
        if self.gpus > MAX_GPUS:
            raise InvalidRequest(f"at most {MAX_GPUS} GPUs per server, got gpus={self.gpus}")
        if self.gpu_milli:
            if self.gpus:
                raise InvalidRequest(
                    "ask for either whole GPUs (gpus=N) or a fraction of one GPU "
                    f"(gpu_milli), not both (gpus={self.gpus}, gpu_milli={self.gpu_milli})"
                )
            if self.gpu_milli >= MILLI:
                raise InvalidRequest(
                    f"gpu_milli is a fraction of one GPU (1-999 milli); for whole GPUs use gpus=N "
                    f"(got gpu_milli={self.gpu_milli})"
                )
        if self.share not in ("", "mps", "timeslice"):
            raise InvalidRequest(f"share must be 'timeslice' or 'mps', got {self.share!r}")
        if self.share and not self.gpu_milli:
            raise InvalidRequest(f"share ({self.share}) says how a fraction is kept; this request has no gpu_fraction")
        if self.mig is not None:
            try:
                object.__setattr__(self, "mig", parse_mig_profile(self.mig))
            except MigProfileError as e:
                raise InvalidRequest(str(e)) from None
            if self.gpus or self.gpu_milli:
                raise InvalidRequest(f"a MIG request ({self.mig}) takes one instance; leave out gpus and gpu_milli")
        if self.models is not None:
            models = self.models
            if isinstance(models, str):
                models = (models,)
            try:
                keys = frozenset(normalize_model(m) for m in models)
            except (TypeError, AttributeError):
                raise InvalidRequest(f"models must be a set of GPU model names, got {self.models!r}") from None
            if not keys or "" in keys:
                raise InvalidRequest("models, when given, must name at least one GPU model")
            object.__setattr__(self, "models", keys)
        for name in ("required", "preferred"):
            value = getattr(self, name)
            if isinstance(value, str):
                value = (value,)
            try:
                uuids = frozenset(value)
            except TypeError:
                raise InvalidRequest(f"{name} must be a set of device UUIDs, got {value!r}") from None
            if not all(isinstance(u, str) and u.strip() for u in uuids):
                raise InvalidRequest(f"{name} must name devices by non-empty UUID strings, got {sorted(map(repr, uuids))}")
            object.__setattr__(self, name, frozenset(u.strip() for u in uuids))
        if (self.required or self.preferred) and not (self.gpus or self.gpu_milli or self.mig):
            raise InvalidRequest("a request without GPUs cannot require or prefer GPU devices")
        limit = self.gpus if self.gpus else 1
        if len(self.required) > limit:
            raise InvalidRequest(f"{len(self.required)} required devices do not fit a request for "
                                 f"{self.gpus or 'a fraction of 1'} GPU{'s' if self.gpus > 1 else ''}")
        if self.required & self.preferred:
            object.__setattr__(self, "preferred", self.preferred - self.required)

    @classmethod
    def fraction(cls, share: float, *, cpu_milli: int = 0, memory_mib: int = 0,
                 models: Optional[Iterable[str]] = None) -> "Request":
        """Build a fractional request from a float share (0 < share < 1), rounded to milli."""
        if not (0 < share < 1):
            raise InvalidRequest(f"a GPU fraction must be between 0 and 1 exclusive, got {share}")
        milli = round(share * MILLI)
        if milli in (0, MILLI):
            raise InvalidRequest(f"GPU fraction {share} rounds to {milli} milli; use 0.001-0.999")
        return cls(cpu_milli=cpu_milli, memory_mib=memory_mib, gpu_milli=milli,
                   models=frozenset(models) if models is not None else None)

    @property
    def is_fraction(self) -> bool:
        return self.gpu_milli > 0

    @property
    def total_gpu_milli(self) -> int:
        """GPU demand in milli-GPU, the unit every ratio in the engine is measured in
        (a MIG request: its profile's slices out of 7, before the GPU is known)."""
        if self.mig:
            return nominal_milli(self.mig)
        return self.gpu_milli if self.gpu_milli else self.gpus * MILLI

    @property
    def shape(self) -> tuple:
        """Hashable key of what the policies care about (memory excluded on purpose)."""
        return (self.cpu_milli, self.gpus, self.gpu_milli, self.models) + ((self.mig,) if self.mig else ())

    @property
    def pinned(self) -> bool:
        """Whether the request names devices (required or preferred)."""
        return bool(self.required or self.preferred)

    def describe(self) -> str:
        gpu = (f"a {self.mig} MIG instance" if self.mig
               else f"{self.gpu_milli / MILLI:g} of a GPU" if self.gpu_milli
               else f"{self.gpus} GPU{'s' if self.gpus != 1 else ''}")
        models = f" ({' or '.join(sorted(self.models))})" if self.models else ""
        pins = f", on {' and '.join(sorted(self.required))}" if self.required else ""
        return f"{gpu}{models}, {self.cpu_milli / 1000:g} CPU, {self.memory_mib} MiB{pins}"


def same_request(a: Request, a_models: Optional[list[str]], b: Request, b_models: Optional[list[str]]) -> bool:
    """Whether a retry asks for what its queue entry (or reclaim) waits for: the same shape and the
    same requested models. The narrowed ``models`` (what the balance affords) may change between
    retries and is not compared; the models the user asked for are (an A6000 spawn must not
    inherit the place, or the reserved GPUs, of an earlier RTX 3090 one)."""
    def models(names: Optional[list[str]]) -> Optional[list[str]]:
        return sorted({normalize_model(n) for n in names}) if names else None

    return ((a.cpu_milli, a.memory_mib, a.gpus, a.gpu_milli, a.mig) == (b.cpu_milli, b.memory_mib, b.gpus,
                                                                          b.gpu_milli, b.mig)
            and models(a_models) == models(b_models))
