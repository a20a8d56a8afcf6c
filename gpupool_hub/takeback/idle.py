"""Idle GPUs taken back: the pure rules ``decide_idle`` and ``server_idleness``.

A server is *idle* when every GPU it holds stayed under ``c.GPUPool.idle_threshold``
for ``idle_after`` seconds. On a GPU that several servers share, that is the
server's own processes there (their user's per-process figure from the node
agent), never the GPU's: an idle server next to a busy one is idle, and the
reverse. A server whose own figure is unknown is never idle. An idle server whose GPUs someone else waits for
(the wait queue) gets a warning with a deadline (``GET me``'s ``cull_warning``,
shown by the lab widget); after ``idle_grace`` it is stopped through the hub
API (files untouched) and audited as ``idle_reclaim``. With ``max_idle`` set, a
server idle that long is stopped even when nobody waits. Servers younger than
``min_runtime`` are never touched.

Utilization comes from ``usage/utilization.py`` (Prometheus or the node agents'
reports); the idle job (``service/jobs/idle.py``) feeds it to these rules.

What users and admins see is measured by the same job, once per run, and never
per request (every lab tab polls ``GET me``): each held GPU's latest
utilization and memory and since when it has been idle (``readings``), each
server's idleness (the pure ``server_idleness``: idle since, from when it may be
reclaimed), published whole in ``service/core/idle.py``'s ``IdleWarnings``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from .cull import CullWarning
from ..reasons import AuditAction


@dataclass(frozen=True)
class GpuReading:
    """What is known of one GPU now: shown to its holder (``GET me``) and to admins
    (``GET pool``). ``None`` where the source cannot say."""

    utilization: float | None          # the latest value, 0-1
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    #: start of the current run under the threshold, as far back as the source looked
    #: (``window``); None while busy or unknown
    idle_since: datetime | None


@dataclass(frozen=True)
class IdleServer:
    """What the rule needs to know about one GPU server."""

    user: str
    server: str
    allocation: str
    started: datetime
    idle: bool            # every GPU under the threshold for idle_after
    idle_long: bool       # ... and for max_idle (when set)
    wanted: bool          # another user waits for GPUs like these
    peak: float | None = None  # the highest busy fraction over idle_after (its own, on shared GPUs)
    shared: bool = False  # holds a share of a GPU others hold too


@dataclass(frozen=True)
class IdleDecision:
    user: str
    server: str
    allocation: str
    action: AuditAction  # IDLE_WARN, IDLE_RECLAIM or CLEAR_WARNING
    reason: str
    deadline: datetime | None = None


def _span(seconds: float) -> str:
    return f"{seconds:g} seconds" if seconds < 120 else f"{seconds / 60:g} minutes"


def decide_idle(servers: Iterable[IdleServer], warnings: Mapping[tuple[str, str], CullWarning], now: datetime, *,
                grace: float, min_runtime: float, idle_after: float, max_idle: float) -> list[IdleDecision]:
    """Every idle action due now. Pure."""
    out = []
    for s in servers:
        key = (s.user, s.server)
        warning = warnings.get(key)
        young = (now - s.started).total_seconds() < min_runtime
        why = None
        what, busy = "its GPUs have", ""
        if s.shared:  # "idle for over 60 minutes at 0 % of its share"
            what = "its own processes on its shared GPU have"
            busy = "" if s.peak is None else f" at {s.peak * 100:.0f} % of its share"
        if s.idle and s.wanted and not young:
            why = f"{what} been idle for over {_span(idle_after)}{busy} and another user is waiting for them"
        elif s.idle_long and not young:
            why = f"{what} been idle for over {_span(max_idle)}{busy}"
        if why is None:
            if warning is not None:
                out.append(IdleDecision(s.user, s.server, s.allocation, AuditAction.CLEAR_WARNING,
                                        "the server is no longer idle, or nobody waits for its GPUs any more"))
            continue
        if warning is None:
            out.append(IdleDecision(s.user, s.server, s.allocation, AuditAction.IDLE_WARN,
                                    f"server {s.server or 'default'} will be stopped: {why} (files are kept)",
                                    now + timedelta(seconds=grace)))
        elif now >= warning.deadline:
            out.append(IdleDecision(s.user, s.server, s.allocation, AuditAction.IDLE_RECLAIM,
                                    f"stopped server {s.server or 'default'}: {why}"))
    return out


@dataclass(frozen=True)
class ServerIdleness:
    idle_since: datetime          # every GPU of the server under the threshold since
    reclaimable_at: datetime      # from then on it may be reclaimed if someone waits
    max_idle_at: datetime | None  # ... and stopped anyway (max_idle), when set


def server_idleness(started: datetime, readings: Iterable[GpuReading | None], *, idle_after: float,
                    min_runtime: float, max_idle: float) -> ServerIdleness | None:
    """How idle a server is, from its GPUs' readings (None where unknown). Pure.

    It is idle since the latest of its GPUs' idle runs began (shown no earlier than
    its start), and counts as idle for the rule once that run lasted ``idle_after``,
    never before ``min_runtime`` (the same times ``decide_idle`` acts on). None when
    a GPU is busy or unknown."""
    runs = [r.idle_since if r is not None else None for r in readings]
    if not runs or any(r is None for r in runs):
        return None
    since: datetime = max(runs)  # type: ignore[type-var]
    protected = started + timedelta(seconds=min_runtime)
    return ServerIdleness(
        idle_since=max(since, started),
        reclaimable_at=max(since + timedelta(seconds=idle_after), protected),
        max_idle_at=max(since + timedelta(seconds=max_idle), protected) if max_idle else None)
