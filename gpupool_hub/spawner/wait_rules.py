"""How long a spawn keeps asking while the pool says "wait", and what it says when it stops.

A reclaim of borrowed GPUs is waited for ``reclaim_wait`` seconds; a place in
the wait queue until just before the hub's own ``start_timeout`` would end the
spawn, so that the final message is the pool's (why, and where the user was),
not the hub's generic timeout. The spawner raises its own ``start_timeout``
(:func:`start_timeout_for_waits`) to cover the pool's ``max_wait``, so that
the pool's limit, not the hub's default 60 s, is what ends a queued spawn.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from datetime import datetime, timezone
from typing import Any

from ..reasons import RefusalReason
from ..money.units import plural
from .errors import GPUPoolRefused

#: seconds before the hub's start_timeout at which a queued spawn stops waiting
TIMEOUT_MARGIN = 3.0
#: ``Spawner.pending`` while a spawn waits in the pool's queue (see :func:`hub_answered_at`)
QUEUE_PENDING = "queue"
#: seconds past the hub's slow_spawn_timeout by which the request that started a spawn has answered
ANSWERED_MARGIN = 1.0
#: start_timeout covers c.GPUPool.preempt_grace plus this much for the server itself to start
RECLAIM_START_ALLOWANCE = 60.0


def start_timeout_for_waits(config: Any, start_timeout: float, log: Any) -> float:
    """The start timeout that lets a spawn wait as long as the pool allows, so that the hub
    does not give up on it first: with the wait queue on (the default), ``c.GPUPool.max_wait``
    plus ``start_timeout`` itself for the server's own start; with team fair share on,
    ``c.GPUPool.preempt_grace`` of a reclaim plus ``RECLAIM_START_ALLOWANCE``. The raise is
    logged once per hub process, not once per server."""
    from ..config import GPUPool

    section = config.GPUPool if "GPUPool" in config else {}
    defaults = GPUPool.class_traits()
    needs = {}
    if section.get("queue_enabled", defaults["queue_enabled"].default_value):
        max_wait = float(section.get("max_wait", defaults["max_wait"].default_value))
        needs[f"c.GPUPool.max_wait ({max_wait:g} s) in the wait queue"] = max_wait + start_timeout
    if section.get("teams"):
        grace = float(section.get("preempt_grace", defaults["preempt_grace"].default_value))
        needs[f"c.GPUPool.preempt_grace ({grace:g} s) of reclaims"] = grace + RECLAIM_START_ALLOWANCE
    if not needs or max(needs.values()) <= start_timeout:
        return start_timeout
    why, needed = max(needs.items(), key=lambda item: item[1])
    if (start_timeout, needed) not in _RAISES_LOGGED:
        _RAISES_LOGGED.add((start_timeout, needed))
        log.info("Raising the spawner's start_timeout from %g s to %g s to cover %s plus the server's own "
                 "start; no c.Spawner.start_timeout needs setting for it", start_timeout, needed, why)
    return needed


#: (from, to) start_timeout raises already logged by this process
_RAISES_LOGGED: set[tuple[float, float]] = set()


def hub_answered_at(handler: Any, started: float) -> float:
    """When (event-loop time) the request that started a spawn has surely answered.

    A spawn waiting in the pool's queue reports ``pending == "queue"``, so that
    JupyterHub does not count it against ``c.JupyterHub.concurrent_spawn_limit``
    (``count_active_users`` counts only ``spawn`` and ``proxy`` events). It
    switches only once the starting request has answered: the REST API waits
    ``slow_spawn_timeout`` (10 s by default) for the spawn and then answers 202
    if ``pending == "spawn"``, else 201 ("started"), which a waiting server is not.
    """
    try:
        timeout = float(getattr(handler, "slow_spawn_timeout", 10))
    except (TypeError, ValueError):
        timeout = 10.0
    return started + max(timeout, 0.0) + ANSWERED_MARGIN


def queue_wait_limit(refusal: GPUPoolRefused, reclaim_wait: float, start_timeout: float) -> float:
    """Seconds since the first request after which a retryable refusal is final."""
    if refusal.refusal is RefusalReason.QUEUED:
        return max(start_timeout - TIMEOUT_MARGIN, 1.0)
    return reclaim_wait


def gave_up_waiting(last: GPUPoolRefused, waited: float) -> GPUPoolRefused:
    """The final refusal of a spawn that waited in the queue until its start timeout."""
    where = last.details.get("position")
    place = f" (you were number {where} in line)" if where else ""
    span = plural(round(waited), "second") if waited < 120 else plural(round(waited / 60), "minute")
    message = (f"No GPU became free in the {span} you waited, the longest this pool lets a start wait{place}. "
               "Start again within a minute to keep your place in the queue, or pick a smaller profile.")
    return GPUPoolRefused(message, reason=RefusalReason.QUEUED.value, status_code=RefusalReason.QUEUED.status,
                          message_html=f"<strong>{RefusalReason.QUEUED.title}.</strong> {message}",
                          details=last.details)


def service_away(queued: GPUPoolRefused) -> GPUPoolRefused:
    """What a queued spawn says while the service does not answer (a restart): the
    queue is in the ledger database, so the place is kept; keep asking."""
    message = f"The GPU pool service is restarting; your place is kept ({queued.message})"
    return GPUPoolRefused(message, reason=RefusalReason.QUEUED.value, status_code=RefusalReason.QUEUED.status,
                          details=queued.details)


def full_text(entries: Iterable[Mapping[str, Any]], now: datetime | None = None) -> str:
    """"full — 2 waiting, about 20–45 min" for a profile none of whose models has room, from
    ``GET models`` entries (``waiting``; ``eta_text`` when learned from history, else ``eta``:
    "about 20 min"); "full — none waiting, about 20 min" when nobody waits yet (the pool
    estimates a full model before anyone waits for it); "full" without an estimate."""
    entries = list(entries)
    waiting = max((int(e.get("waiting") or 0) for e in entries), default=0)
    etas = []
    for e in entries:
        try:
            etas.append(datetime.fromisoformat(str(e["eta"]).replace("Z", "+00:00")))
        except (KeyError, ValueError):
            continue
    text = f"full — {waiting} waiting" if waiting else "full — none waiting"
    # a range learned from the pool's history ("about 20–45 min"): the model expected soonest
    ranged = sorted((str(e.get("eta_low") or ""), str(e["eta_text"])) for e in entries
                    if e.get("eta_basis") == "history" and e.get("eta_text"))
    if ranged:
        return f"{text}, {ranged[0][1]}"
    if etas:
        minutes = max(0, round((min(etas) - (now or datetime.now(timezone.utc))).total_seconds() / 60))
        return text + (", under a minute" if minutes < 1 else f", about {minutes} min" if minutes < 90
                       else f", about {minutes / 60:.1f} h")
    return text if waiting else "full"
