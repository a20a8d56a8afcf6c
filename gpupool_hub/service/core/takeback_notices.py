"""Notices: what a user is told after the pool took GPUs back, until they dismiss it.

A preempted, culled, floor-stopped or idle-reclaimed user otherwise sees only
JupyterLab's "Server unavailable" (issue 18.5). Every such action is already in
the audit log (``preempt``, ``cull_kernels``, ``stop_server``, ``idle_reclaim``),
so a notice is simply one of those events of the user's; dismissing it writes a
``notice_dismissed`` event naming it. Nothing new to migrate, and notices
survive a restart because the audit log does.

The notices are part of the user's ``me`` view (the lab widget, the spawn page
through ``GET users/{name}``), which is cached: every write here, and every
event that makes a notice, goes through :meth:`Notices.record`, which forgets
the user's cached view after the write.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from decimal import Decimal, InvalidOperation
from typing import Any

from ...ledger import AuditEvent, Ledger
from ...reasons import AuditAction
from ...timefmt import iso
from .views import ViewCache
from .threads import CoreThreads, reads, writes

#: the most notices a user is shown (the newest); older ones stay in the audit log
MAX_NOTICES = 10

KEPT_SERVER = ("Your files and notebooks on disk are untouched; only the running kernels ended, "
               "so what they held in memory is lost.")
KEPT_KERNELS = ("Your server, notebooks and files are untouched; only the running kernels ended, "
                "so what they held in memory is lost.")


MINUS = "\u2212"

#: why a floor stop happened, in a researcher's words (no trailing stop: the spawn page adds one)
FLOOR_WHY = ("Servers holding GPUs stop when your balance reaches the floor, so it goes no further below "
             "zero; the GPU time used until the stop is charged with the next debit, which brings the balance "
             "shown to the floor. GPU servers can start again once credits or a grant bring your balance back "
             "above the floor; a server without GPUs can start now")


@dataclass(frozen=True)
class NoticeKind:
    """How one kind of audit event reads to the user it happened to: ``what`` happened and
    ``because`` of what, so that a page can say when in between ("Your GPU server was
    stopped at 14:02 because your balance reached the floor (−10 tokens)")."""

    kind: str
    what: str
    because: str
    kept: str

    @property
    def title(self) -> str:
        return f"{self.what} {self.because}"


#: audit action → what the user is told; the words the widget, the spawn page, "My GPU usage" and
#: docs/user-guide.md show
KINDS: dict[str, NoticeKind] = {
    AuditAction.PREEMPT.value: NoticeKind(
        "preempted", "Your server was stopped", "because its borrowed GPUs were reclaimed for another team",
        KEPT_SERVER),
    AuditAction.CULL_KERNELS.value: NoticeKind(
        "kernels_stopped", "Your kernels were stopped and their GPUs taken back",
        "because your balance was below zero while the pool was short of GPUs", KEPT_KERNELS),
    AuditAction.STOP_SERVER.value: NoticeKind(
        "floor_stop", "Your GPU server was stopped", "because your balance reached the floor", KEPT_SERVER),
    AuditAction.IDLE_RECLAIM.value: NoticeKind(
        "idle_reclaim", "Your server was stopped", "because its GPUs were idle while others waited", KEPT_SERVER),
}


def amount_words(value: str) -> str:
    """A token amount from an audit detail as a researcher reads it: "-10.000" → "−10"."""
    try:
        amount = Decimal(value)
    except (InvalidOperation, TypeError):
        return str(value)
    text = f"{amount:f}"
    if "." in text:
        text = text.rstrip("0").rstrip(".")
    return text.replace("-", MINUS)


def notice_json(event: AuditEvent) -> dict[str, Any]:
    """One notice: ``title`` is ``what`` and ``because`` together (clients before issue 39.6
    show it alone); a page puts the local time between them. A floor stop names the floor
    it reached (the cull job records it in the event's detail since issue 39.6) and says
    why in a researcher's words, not the audit's "balance -10.020 is at or below …"."""
    k = KINDS[event.action]
    because, why = k.because, event.reason
    if k.kind == "floor_stop":
        floor = (event.detail or {}).get("floor")
        if floor is not None:
            because = f"{because} ({amount_words(floor)} tokens)"
        why = FLOOR_WHY
    return {"id": event.id, "kind": k.kind, "at": iso(event.at), "server": event.server,
            "title": f"{k.what} {because}", "what": k.what, "because": because, "why": why, "kept": k.kept}


class Notices:
    """Users' notices, derived from the audit log; records the events they come from."""

    def __init__(self, ledger: Ledger, cache: ViewCache, clock: Callable[[], datetime],
                 *, threads: CoreThreads | None = None) -> None:
        self.ledger = ledger
        self.cache = cache
        self.clock = clock
        self.threads = threads

    @writes
    def record(self, event: AuditEvent) -> AuditEvent:
        """Write an audit event and drop the user's cached view (it may carry a new notice)."""
        written = self.ledger.audit.add(event)
        self.cache.forget(event.user)
        return written

    @reads
    def for_user(self, user: str) -> list[dict[str, Any]]:
        """The user's notices not dismissed yet, newest first (database reads only)."""
        return [notice_json(e) for e in self._pending(user)[:MAX_NOTICES]]

    def _pending(self, user: str) -> list[AuditEvent]:
        events = self.ledger.audit.of_user(user, [*KINDS, AuditAction.NOTICE_DISMISSED.value])
        dismissed = {(e.detail or {}).get("notice") for e in events
                     if e.action == AuditAction.NOTICE_DISMISSED.value}
        return [e for e in events if e.action in KINDS and e.id not in dismissed]

    @writes
    def dismiss(self, user: str, notice_id: int) -> bool:
        """Dismiss one of ``user``'s notices (writer thread). False when ``user`` has no
        such notice: another user's event is not theirs to dismiss, nor to learn about."""
        event = self.ledger.audit.get(notice_id)
        if event is None or event.user != user or event.action not in KINDS or event.dry_run:
            return False
        if any(e.id == notice_id for e in self._pending(user)):
            self.record(AuditEvent(self.clock(), user, event.server, AuditAction.NOTICE_DISMISSED.value,
                                   "dismissed by the user", False, {"notice": notice_id}))
        return True
