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


@dataclass(frozen=True)
class NoticeKind:
    """How one kind of audit event reads to the user it happened to."""

    kind: str
    title: str
    kept: str


#: audit action → what the user is told; the words the widget, the spawn page and docs/user-guide.md show
KINDS: dict[str, NoticeKind] = {
    AuditAction.PREEMPT.value: NoticeKind(
        "preempted", "Your server was stopped: its borrowed GPUs were reclaimed for another team", KEPT_SERVER),
    AuditAction.CULL_KERNELS.value: NoticeKind(
        "kernels_stopped", "Your kernels were stopped and their GPUs taken back", KEPT_KERNELS),
    AuditAction.STOP_SERVER.value: NoticeKind(
        "floor_stop", "Your server was stopped: your balance reached the floor", KEPT_SERVER),
    AuditAction.IDLE_RECLAIM.value: NoticeKind(
        "idle_reclaim", "Your server was stopped: its GPUs were idle while others waited", KEPT_SERVER),
}


def notice_json(event: AuditEvent) -> dict[str, Any]:
    k = KINDS[event.action]
    return {"id": event.id, "kind": k.kind, "at": iso(event.at), "server": event.server,
            "title": k.title, "why": event.reason, "kept": k.kept}


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
