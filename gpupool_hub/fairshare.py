"""Team fair share: quotas, borrowing idle GPUs, reclaiming them without thrashing.

Pure logic, no I/O; the pool manager calls it on every admission. See
docs/fairshare.md for the rules in prose. All GPU amounts are milli-GPU ints.

* A team is a JupyterHub group named in ``c.GPUPool.teams``; a user in no
  team belongs to the default team (quota 0 unless configured), a user in
  several teams is charged to the one with the most headroom left (ties: the
  first name in sorted order), decided per server at admission.
* Within quota a server is *guaranteed* and never preempted for fairness;
  above quota it is *borrowed* and may be reclaimed.
* Reclaim (:func:`choose_victims`): only for a request that is within its
  team's quota, only borrowed servers of teams that are over their quota, and
  never so many that a victim team drops below its quota. Most-over-quota team
  first, newest server first, as few GPUs as the request needs, all on the one
  node where the request will then fit (checked by releasing the candidates
  in the live pool and restoring them exactly).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

from .placement.request import MILLI, Request
from .placement.state import Pool
from .money.pricing import model_matches

DEFAULT_TEAM = "default"
Kind = Literal["guaranteed", "borrowed"]


def _milli(value: Any, where: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, float, str, Decimal)):
        raise ValueError(f"{where} must be a number of GPUs, got {value!r}")
    try:
        d = Decimal(str(value))
    except InvalidOperation:
        raise ValueError(f"{where} must be a number of GPUs, got {value!r}") from None
    if not d.is_finite() or d < 0 or (d * MILLI) % 1:
        raise ValueError(f"{where} must be a non-negative number of GPUs with at most 3 decimals, got {value!r}")
    return int(d * MILLI)


@dataclass(frozen=True)
class Quota:
    """A team's nominal share: ``total`` milli-GPU overall, optionally capped per model."""

    total: int
    models: tuple[tuple[str, int], ...] = ()  # (model name as configured, milli)

    def model_entry(self, model: str) -> tuple[str, int] | None:
        """The per-model entry that covers a pool model string, or None (the total alone counts)."""
        for name, milli in self.models:
            if name.lower() == model.lower() or model_matches(name, model):
                return name, milli
        return None

    def as_dict(self) -> dict[str, Any]:
        return {"gpus": _gpus(self.total), "models": {n: _gpus(m) for n, m in self.models}}


def _gpus(milli: int) -> float:
    return milli / MILLI


@dataclass(frozen=True)
class Holding:
    """One active allocation as fair share sees it."""

    id: str
    team: str
    milli: int
    model: str
    borrowed: bool
    created_at: datetime
    node: str = ""
    user: str = ""
    server: str = ""


@dataclass
class TeamUsage:
    total: dict[str, int] = field(default_factory=dict)
    borrowed: dict[str, int] = field(default_factory=dict)
    by_model: dict[tuple[str, str], int] = field(default_factory=dict)  # (team, quota model name) -> milli

    def of(self, team: str) -> int:
        return self.total.get(team, 0)


@dataclass(frozen=True)
class Teams:
    quotas: Mapping[str, Quota]
    default_team: str = DEFAULT_TEAM

    @classmethod
    def from_config(cls, teams: Mapping[str, Any], default_team: str = DEFAULT_TEAM,
                    where: str = "c.GPUPool.teams") -> Teams:
        """Validate ``{"vision": {"gpus": 20}, "nlp": {"gpus": 20, "models": {"A100": 8}}}``."""
        if not isinstance(teams, Mapping):
            raise ValueError(f"{where} must be a dict of team (group) name to quota, got {teams!r}")
        quotas = {}
        for name, spec in teams.items():
            w = f"{where}[{name!r}]"
            if not isinstance(name, str) or not name:
                raise ValueError(f"{where}: team names must be non-empty strings (JupyterHub groups), got {name!r}")
            if not isinstance(spec, Mapping):
                raise ValueError(f"{w} must be a dict like {{'gpus': 20}}, got {spec!r}")
            unknown = sorted(set(spec) - {"gpus", "models"})
            if unknown:
                raise ValueError(f"{w}: unknown key(s) {unknown}; a quota takes 'gpus' and/or 'models'")
            if "gpus" not in spec and "models" not in spec:
                raise ValueError(f"{w} needs 'gpus' (a number) or 'models' ({{model: gpus}})")
            models = spec.get("models", {})
            if not isinstance(models, Mapping):
                raise ValueError(f"{w}['models'] must be a dict of GPU model to GPUs, got {models!r}")
            per = tuple((str(m), _milli(v, f"{w}['models'][{m!r}]")) for m, v in models.items())
            total = _milli(spec["gpus"], f"{w}['gpus']") if "gpus" in spec else sum(v for _, v in per)
            quotas[name] = Quota(total, per)
        if not isinstance(default_team, str) or not default_team:
            raise ValueError(f"c.GPUPool.default_team must be a non-empty string, got {default_team!r}")
        return cls(quotas, default_team)

    @property
    def enabled(self) -> bool:
        return bool(self.quotas)

    def quota(self, team: str) -> Quota:
        return self.quotas.get(team) or Quota(0)

    def names(self) -> list[str]:
        return sorted(set(self.quotas) | {self.default_team})

    def teams_of(self, groups: Iterable[str]) -> list[str]:
        mine = sorted(set(groups) & set(self.quotas))
        return mine or [self.default_team]

    def resolve(self, groups: Iterable[str], usage: TeamUsage) -> str:
        """The team a new server counts against: of the user's teams, the one with the
        most headroom (quota minus usage) left; ties go to the first in sorted order."""
        return max(self.teams_of(groups), key=lambda t: (self.quota(t).total - usage.of(t), _neg(t)))

    def overage(self, team: str, usage: TeamUsage) -> int:
        """Milli-GPU the team holds above its quota (negative: headroom)."""
        return usage.of(team) - self.quota(team).total

    def within_quota(self, team: str, milli: int, usage: TeamUsage, model: str | None = None) -> bool:
        """Whether ``milli`` more (on ``model``, if known) keeps the team within its quota."""
        q = self.quota(team)
        if usage.of(team) + milli > q.total:
            return False
        if model is not None:
            entry = q.model_entry(model)
            if entry is not None and usage.by_model.get((team, entry[0]), 0) + milli > entry[1]:
                return False
        return True

    def classify(self, team: str, milli: int, model: str, usage: TeamUsage) -> Kind:
        """"guaranteed" if this placement keeps the team within quota, else "borrowed"."""
        return "guaranteed" if self.within_quota(team, milli, usage, model) else "borrowed"

    def usage(self, holdings: Iterable[Holding]) -> TeamUsage:
        u = TeamUsage()
        for h in holdings:
            u.total[h.team] = u.total.get(h.team, 0) + h.milli
            if h.borrowed:
                u.borrowed[h.team] = u.borrowed.get(h.team, 0) + h.milli
            entry = self.quota(h.team).model_entry(h.model)
            if entry is not None:
                key = (h.team, entry[0])
                u.by_model[key] = u.by_model.get(key, 0) + h.milli
        return u

    def report(self, holdings: Sequence[Holding]) -> list[dict[str, Any]]:
        """Per team: quota, usage, borrowed and over-quota GPUs (for the API, CLI and metrics)."""
        u = self.usage(holdings)
        out = []
        for t in sorted(set(self.names()) | set(u.total)):
            q = self.quota(t)
            out.append({
                "team": t, "quota_gpus": _gpus(q.total), "quota_models": {n: _gpus(m) for n, m in q.models},
                "used_gpus": _gpus(u.of(t)), "borrowed_gpus": _gpus(u.borrowed.get(t, 0)),
                "over_quota_gpus": _gpus(max(0, self.overage(t, u))),
                "servers": sum(1 for h in holdings if h.team == t),
                "default": t == self.default_team,
            })
        return out


def _neg(name: str) -> tuple[int, ...]:
    """Sort key that makes ``max`` prefer the alphabetically first name among ties."""
    return tuple(-ord(c) for c in name) + (1,)


def may_preempt(teams: Teams, team: str, milli: int, usage: TeamUsage, now: datetime,
                cooldown_until: Mapping[str, datetime], models: Iterable[str] | None = None) -> bool:
    """Whether a request may reclaim borrowed GPUs at all: it must be within its team's
    quota (on at least one of the models it may use), and the team must not have been
    preempted itself within the cool-down."""
    until = cooldown_until.get(team)
    if until is not None and now < until:
        return False
    if models is None:
        return teams.within_quota(team, milli, usage)
    return any(teams.within_quota(team, milli, usage, m) for m in models)


def preemptible(holdings: Iterable[Holding], now: datetime, min_runtime: timedelta,
                victim_cooldown_until: Mapping[tuple[str, str], datetime]) -> list[Holding]:
    """Holdings minus borrowed servers that are protected from preemption for now:
    younger than ``min_runtime``, or a (user, server) preempted within the cool-down.
    Guaranteed servers pass through (they are never victims anyway)."""
    out = []
    for h in holdings:
        if h.borrowed:
            if now - h.created_at < min_runtime:
                continue
            until = victim_cooldown_until.get((h.user, h.server))
            if until is not None and now < until:
                continue
        out.append(h)
    return out


def victim_order(teams: Teams, team: str, milli: int, holdings: Iterable[Holding], usage: TeamUsage) -> list[Holding]:
    """Reclaimable servers, most-over-quota team first, newest first.

    Only borrowed servers of other teams that are over quota, and strictly more
    over quota than the requester will be after its placement."""
    after = teams.overage(team, usage) + milli
    cands = [h for h in holdings if h.borrowed and h.team != team
             and teams.overage(h.team, usage) > max(0, after)]
    return sorted(cands, key=lambda h: (-teams.overage(h.team, usage), h.team, -h.created_at.timestamp(), h.id))


def choose_victims(pool: Pool, request: Request, teams: Teams, team: str, holdings: Sequence[Holding],
                   usage: TeamUsage) -> list[Holding] | None:
    """The fewest borrowed GPUs whose release lets ``request`` fit on one node, or None.

    Per node, candidates on it are taken in :func:`victim_order` until the
    request fits there (each victim team keeps at least its quota), then victims
    that turn out unnecessary are dropped again. Of all nodes the cheapest set
    wins: fewest GPUs freed, then the most-over-quota / newest victims, then fewest
    servers. The pool is released into and restored exactly; it is unchanged on return.
    """
    order = victim_order(teams, team, request.total_gpu_milli, holdings, usage)
    rank = {h.id: i for i, h in enumerate(order)}
    by_node: dict[str, list[Holding]] = {}
    for h in order:
        if h.id in pool:
            by_node.setdefault(pool.get(h.id).node, []).append(h)  # type: ignore[union-attr]
    best: tuple[tuple[int, int, int], list[Holding]] | None = None
    for node, cands in by_node.items():
        chosen = _victims_on_node(pool, request, node, cands, teams, usage)
        if chosen is None:
            continue
        cost = (sum(h.milli for h in chosen), max(rank[h.id] for h in chosen), len(chosen))
        if best is None or cost < best[0]:
            best = (cost, chosen)
    return best[1] if best else None


def _fits_on(pool: Pool, request: Request, node: str) -> bool:
    return any(ns.real.name == node for ns in pool.open_to(request))


def _victims_on_node(pool: Pool, request: Request, node: str, cands: list[Holding], teams: Teams,
                     usage: TeamUsage) -> list[Holding] | None:
    budget = {t: teams.overage(t, usage) for t in {h.team for h in cands}}
    released: dict[str, Any] = {}
    try:
        chosen: list[Holding] = []
        for h in cands:
            if _fits_on(pool, request, node):
                break
            if h.milli > budget[h.team]:
                continue  # would push its team below quota
            released[h.id] = pool.release(h.id)
            budget[h.team] -= h.milli
            chosen.append(h)
        if not _fits_on(pool, request, node):
            return None
        # Drop victims that are not needed after all (least preferred first).
        for h in reversed(list(chosen)):
            pool.restore(h.id, released.pop(h.id))
            if _fits_on(pool, request, node):
                chosen.remove(h)
            else:
                released[h.id] = pool.release(h.id)
        return chosen
    finally:
        for alloc_id, placement in released.items():
            pool.restore(alloc_id, placement)
