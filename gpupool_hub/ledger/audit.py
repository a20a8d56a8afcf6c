"""The audit log (``gpupool_audit``): every cull, idle, fair-share and memory action with its
reason, whether it was a dry run, and who decided; the admins' trail, the users' notices,
and what the service remembers of its own enforcement after a restart. Reached as
``ledger.audit``."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import datetime

import sqlalchemy as sa

from sqlalchemy.engine import Connection

from .database import Db, aware, db_time
from .records import AuditEvent
from .schema import audit


def insert_event(conn: Connection, event: AuditEvent) -> AuditEvent:
    """Record ``event`` in the transaction of ``conn``; the event as recorded (with its id)."""
    new_id = conn.execute(audit.insert().values(
        at=db_time(event.at), user=event.user, server=event.server, action=event.action,
        reason=event.reason, dry_run=event.dry_run, detail=event.detail,
    )).inserted_primary_key[0]
    return AuditEvent(**{**event.__dict__, "id": new_id})


class Audit:
    """Audit events: added one at a time, read newest or oldest first."""

    def __init__(self, db: Db) -> None:
        self.db = db

    def add(self, event: AuditEvent) -> AuditEvent:
        """Record ``event``; the event as recorded (with its id)."""
        with self.db.write() as conn:
            return insert_event(conn, event)

    def _query(self, q: sa.Select) -> list[AuditEvent]:  # type: ignore[type-arg]
        with self.db.read() as conn:
            return [AuditEvent(id=r.id, at=aware(r.at), user=r.user, server=r.server, action=r.action,
                               reason=r.reason, dry_run=bool(r.dry_run), detail=r.detail) for r in conn.execute(q)]

    def page(self, *, limit: int = 100, before: int | None = None, user: str | None = None) -> list[AuditEvent]:
        """Audit events (of ``user``), newest first; ``before`` = the last id of the previous page."""
        q = sa.select(audit).order_by(audit.c.id.desc()).limit(limit)
        if before is not None:
            q = q.where(audit.c.id < before)
        if user is not None:
            q = q.where(audit.c.user == user)
        return self._query(q)

    def latest_per_server(self, actions: Iterable[str], *, dry_run: bool = False) -> list[AuditEvent]:
        """The newest event among ``actions`` per (user, server), oldest first: what the
        service must remember of its own enforcement after a restart."""
        newest = (
            sa.select(sa.func.max(audit.c.id))
            .where(audit.c.action.in_(list(actions)), audit.c.dry_run.is_(dry_run))
            .group_by(audit.c.user, audit.c.server)
        )
        q = sa.select(audit).where(audit.c.id.in_(newest.scalar_subquery())).order_by(audit.c.id)
        return self._query(q)

    def of_user(self, user: str, actions: Iterable[str], *, limit: int = 200) -> list[AuditEvent]:
        """A user's non-dry-run events among ``actions``, newest first (their notices)."""
        q = (sa.select(audit).where(audit.c.user == user, audit.c.action.in_(list(actions)),
                                    audit.c.dry_run.is_(False)).order_by(audit.c.id.desc()).limit(limit))
        return self._query(q)

    def of_actions(self, actions: Iterable[str], *, since: datetime | None = None) -> list[AuditEvent]:
        """Every non-dry-run event among ``actions`` (since ``since``), oldest first."""
        q = sa.select(audit).where(audit.c.action.in_(list(actions)), audit.c.dry_run.is_(False)).order_by(audit.c.id)
        if since is not None:
            q = q.where(audit.c.at >= db_time(since))
        return self._query(q)

    def get(self, event_id: int) -> AuditEvent | None:
        found = self._query(sa.select(audit).where(audit.c.id == event_id))
        return found[0] if found else None
