"""The pool's closed sessions, by shape and by user: what an estimate learns how long servers hold GPUs
from (the service reads them from the ledger, the replay from the trace's past). Pure."""

from __future__ import annotations

from bisect import insort
from collections.abc import Iterable, Sequence


#: completed sessions the pool needs before estimates come from history
MIN_POOL_SESSIONS = 20
#: sessions of one profile (or one user's of it) before they are used instead of the wider set
MIN_PROFILE_SESSIONS = 10
MIN_USER_SESSIONS = 10


def profile_key(gpus: int, gpu_milli: int, mig: str | None = None) -> str:
    """The shape a session is filed under: ``"2x1000"``, ``"1x500"``, ``"mig:3g.40gb"``."""
    return f"mig:{mig}" if mig else f"{gpus or 1}x{gpu_milli if not gpus else 1000}"


class SessionHistory:
    """Completed session lengths in seconds (each list sorted), per profile and per (user, profile)."""

    def __init__(self, sessions: Iterable[tuple[str, str, float]] = ()) -> None:
        """``sessions``: (profile key, user, seconds held) of each closed allocation."""
        self.by_profile: dict[str, list[float]] = {}
        self.by_user: dict[tuple[str, str], list[float]] = {}
        self.all: list[float] = []
        # release CDFs per (id of a samples list, age bucket, deadline): valid until the next add
        self.cdfs: dict[tuple[int, int, float | None], list[float]] = {}
        # the same on the forecast's steps (queue/forecast.py): rebuilt each time the held servers are read
        self.step_cdfs: dict[tuple[int, int, float | None], list[float]] = {}
        for profile, user, seconds in sessions:
            self.add(profile, user, seconds)

    def add(self, profile: str, user: str, seconds: float) -> None:
        s = max(0.0, float(seconds))
        for bucket in (self.by_profile.setdefault(profile, []), self.by_user.setdefault((user, profile), []),
                       self.all):
            insort(bucket, s)  # kept sorted: estimates bisect them
        self.cdfs = {}
        self.step_cdfs = {}

    def __len__(self) -> int:
        return len(self.all)

    @property
    def enough(self) -> bool:
        return len(self.all) >= MIN_POOL_SESSIONS

    def samples(self, profile: str, user: str) -> list[float]:
        """The sorted lengths a server of ``user`` with ``profile`` is judged by."""
        mine = self.by_user.get((user, profile), [])
        if len(mine) >= MIN_USER_SESSIONS:
            chosen = mine
        elif len(self.by_profile.get(profile, ())) >= MIN_PROFILE_SESSIONS:
            chosen = self.by_profile[profile]
        else:
            chosen = self.all
        return chosen


def quantile(xs: Sequence[float], q: float) -> float:
    """The ``q`` quantile of sorted ``xs``, interpolated between neighbours."""
    pos = q * (len(xs) - 1)
    i = int(pos)
    return xs[i] + (xs[min(i + 1, len(xs) - 1)] - xs[i]) * (pos - i)
