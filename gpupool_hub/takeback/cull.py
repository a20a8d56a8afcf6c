"""Taking GPUs back from users who ran out of tokens.

Two rules, decided by a pure function (``decide``) and carried out by the
service's cull job:

- balance below zero **and** the pool under pressure → a warning first
  (visible in ``GET me`` and the lab widget, with a deadline), then, after a
  grace period, the user's kernels on their GPU servers are shut down through
  the Jupyter Server REST API (reached via the hub's proxy with a token the
  hub mints for that one server, expiring in minutes: ``service/jobs/userserver.py``)
  and the GPUs go back to the pool. Notebooks and files are untouched: only
  kernel processes end.
- balance at or below the floor → the GPU server is stopped through the hub
  API, pressure or not, and its GPUs released. The balance here counts the GPU
  time used since the last charged interval (``UserState.uncharged``): the stop
  comes when the floor is reached, not at the first debit past it.

Exempt users and groups are never touched; a dry run only logs and audits.
Every action lands in the audit log that admins read at ``GET audit``.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal
from typing import Any
from urllib.parse import quote

from traitlets import Bool, Float, Set, Unicode
from traitlets.config import Configurable

from ..reasons import AuditAction
from ..timefmt import iso

log = logging.getLogger("gpupool.cull")


class Culler(Configurable):
    """When and how GPUs are taken back (``c.Culler``)."""

    enabled = Bool(True, help="Run the cull job at all.").tag(config=True)
    dry_run = Bool(
        False, help="Only log and audit what would be done; warn, cull and stop nothing.",
    ).tag(config=True)
    interval = Float(60, help="Seconds between cull runs.").tag(config=True)
    grace_period = Float(
        600, help="Seconds between the warning and the shutdown of a negative-balance user's kernels.",
    ).tag(config=True)
    pressure_allocated_fraction = Float(
        0.8, help="The pool is under pressure when more than this fraction of its GPU capacity is allocated.",
    ).tag(config=True)
    pressure_refusal_window = Float(
        600, help="…or when a GPU spawn was refused for lack of capacity within this many seconds.",
    ).tag(config=True)
    pressure_utilization = Float(
        0, help="""Optional: …or when the pool's measured GPU utilization (0–1) exceeds this. 0 = off.
        Measured from each server's own utilization (the same source as idle reclaim: Prometheus
        with c.GPUPoolService.utilization_metric, else the node agents' reports): on a shared GPU a
        server counts its own processes; GPUs nobody holds count as idle; a server whose
        utilization is unknown is left out.""",
    ).tag(config=True)
    exempt_users = Set(help="Users never culled or stopped.").tag(config=True)
    exempt_groups = Set(help="Members of these JupyterHub groups are never culled or stopped.").tag(config=True)
    hub_public_url = Unicode(
        help="""The proxy's URL, through which the service reaches users' servers
        (their Jupyter API for kernels). Default: c.JupyterHub.bind_url from the
        same configuration file, else http://127.0.0.1:8000.""",
    ).tag(config=True)


@dataclass
class CullWarning:
    """What a user sees before GPUs are taken back: what stops, why, and when."""

    action: str  # "kernels" | "server"
    reason: str
    deadline: datetime
    # when it was carried out while the warning still stands (kernels culled, pressure on):
    # the widget then says the kernels *were* stopped instead of counting down past zero
    done_at: datetime | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"action": self.action, "reason": self.reason, "deadline": iso(self.deadline),
                "done_at": iso(self.done_at)}



@dataclass(frozen=True)
class UserState:
    """What the decision needs to know about one user holding GPUs."""

    user: str
    balance: Decimal
    floor: Decimal
    servers: tuple[str, ...]  # servers with an active allocation
    exempt: bool = False
    # GPU time used but not charged yet (``credits.uncharged_cost``): counted by the floor rule
    uncharged: Decimal = Decimal(0)

    @property
    def owed_balance(self) -> Decimal:
        """The balance once the GPU time used so far is charged."""
        return self.balance - self.uncharged


@dataclass(frozen=True)
class Decision:
    user: str
    action: AuditAction  # WARN, CLEAR_WARNING, CULL_KERNELS or STOP_SERVER
    reason: str
    server: str = ""
    deadline: datetime | None = None
    # facts for the audit event's detail (a floor stop: the floor and the balance it counted)
    detail: Mapping[str, str] | None = None


def last_refusal_of_others(refusals: Mapping[str, datetime], user: str) -> datetime | None:
    """The newest capacity refusal of anyone but ``user``: the refusal signal of
    ``pressure`` when judging ``user``. A user's own refused spawn says the pool is
    full *for them*; counting it would warn them for wanting more."""
    return max((at for who, at in refusals.items() if who != user), default=None)


def pressure(allocated: Decimal, capacity: Decimal, last_refusal: datetime | None, now: datetime,
             culler: Culler, utilization: float | None = None) -> str | None:
    """Why the pool is under pressure, or None. Pure: the job gathers the inputs.

    ``last_refusal`` is the newest sign that someone else needs GPUs: with the wait
    queue on, the last retry of another user's queued spawn that the judged user's
    GPUs would serve (``WaitQueue.demand_for``); without it, others' refusals.
    ``utilization``: how busy the others keep the pool (:func:`others_utilization`)."""
    if capacity > 0 and allocated / capacity > Decimal(str(culler.pressure_allocated_fraction)):
        return f"{allocated:g} of {capacity:g} GPUs allocated (over {culler.pressure_allocated_fraction:.0%})"
    if last_refusal is not None and now - last_refusal <= timedelta(seconds=culler.pressure_refusal_window):
        return (f"a GPU spawn of another user was refused for lack of capacity and waits for GPUs like these "
                f"(last asked at {last_refusal:%H:%M:%S} UTC)")
    if culler.pressure_utilization and utilization is not None and utilization > culler.pressure_utilization:
        return (f"other users' servers keep the GPUs {utilization:.0%} busy "
                f"(GPU utilization over {culler.pressure_utilization:.0%})")
    return None


def others_utilization(user: str, holdings: Iterable[tuple[str, Decimal, float | None]],
                       capacity: Decimal) -> float | None:
    """How busy other users keep the pool, for judging ``user`` (0–1), from each server's own
    figure: ``(holder, GPUs held, the fraction of that GPU its own processes use, or None)``
    per server and GPU. As with refusals, a user's own work is no pressure on that user,
    which a whole-GPU figure cannot tell apart on a shared GPU. GPUs nobody holds count as
    idle; a holding whose figure is unknown counts neither way (never a guess). None when
    every other holding is unknown. Pure."""
    busy, unknown, measured, own = Decimal(0), Decimal(0), False, Decimal(0)
    for holder, gpus, utilization in holdings:
        if holder == user:
            own += gpus
        elif utilization is None:
            unknown += gpus
        else:
            busy += Decimal(str(utilization))
            measured = True
    room = capacity - own - unknown
    if (unknown and not measured) or room <= 0:
        return None
    return min(float(busy / room), 1.0)


def decide(users: Sequence[UserState], warnings: Mapping[str, Any], pressure_reason: str | None,
           now: datetime, grace: timedelta) -> list[Decision]:
    """Every action due now. ``warnings`` maps users to their current warning (with ``deadline``)."""
    out: list[Decision] = []
    for u in users:
        if u.exempt:
            if u.user in warnings:
                out.append(Decision(u.user, AuditAction.CLEAR_WARNING, "user is exempt from culling"))
            continue
        if u.owed_balance <= u.floor:
            owed = u.owed_balance
            unposted = f" ({u.uncharged:.3f} of it GPU time not charged yet)" if u.uncharged else ""
            facts = {"balance": f"{owed:.3f}", "floor": f"{u.floor:f}"}
            for server in u.servers:
                out.append(Decision(u.user, AuditAction.STOP_SERVER,
                                    f"balance {owed:.3f}{unposted} is at or below the floor {u.floor:g}", server,
                                    detail=facts))
            continue
        warning = warnings.get(u.user)
        if u.balance < 0 and pressure_reason:
            if warning is None:
                out.append(Decision(u.user, AuditAction.WARN,
                                    f"balance {u.balance:.3f} is below zero and the pool is under pressure "
                                    f"({pressure_reason}); GPU kernels will be shut down",
                                    deadline=now + grace))
            elif now >= warning.deadline:
                for server in u.servers:
                    out.append(Decision(u.user, AuditAction.CULL_KERNELS,
                                        f"balance {u.balance:.3f} below zero past the grace period, "
                                        f"pool under pressure ({pressure_reason})", server))
        elif warning is not None:
            why = "balance is no longer negative" if u.balance >= 0 else "the pool is no longer under pressure"
            out.append(Decision(u.user, AuditAction.CLEAR_WARNING, why))
    return out


def server_api_url(hub_public_url: str, user: str, server: str) -> str:
    """The Jupyter Server API of a user's server, through the proxy; names are URL-quoted."""
    base = hub_public_url.rstrip("/") + f"/user/{quote(user, safe='')}/"
    if server:
        base += f"{quote(server, safe='')}/"
    return base + "api/"
