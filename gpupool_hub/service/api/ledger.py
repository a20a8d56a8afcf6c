"""``ledger/verify``, ``ledger/export`` and ``audit``: the admins' views of the books."""

from __future__ import annotations

import csv
import io

from ...timefmt import iso as _iso
from ...money.units import format_tokens
from .base import MAX_PAGE, APIHandler


class VerifyHandler(APIHandler):
    async def get(self) -> None:
        self.require_admin()
        report = await self.manager.records.verify.off_loop()
        self.write_json({
            "ok": report.ok, "accounts": report.accounts, "entries": report.entries,
            "mismatches": [{"user": m.account, "stored": format_tokens(m.stored), "computed": format_tokens(m.computed)}
                           for m in report.mismatches],
        })


class ExportHandler(APIHandler):
    def set_default_headers(self) -> None:
        self.set_header("Cache-Control", "no-store")

    async def get(self) -> None:
        self.require_admin()
        self.set_header("Content-Type", "text/csv; charset=utf-8")
        buf = io.StringIO()
        writer = csv.writer(buf)
        writer.writerow(["id", "user", "kind", "amount", "created_at", "interval_start", "interval_end",
                         "model", "gpu_seconds", "reason", "actor", "idempotency_key"])
        entries = self.manager.ledger.iter_entries()
        while batch := await self.manager.records.take.off_loop(entries, 1000):
            for e in batch:
                writer.writerow([e.id, e.account, e.kind, format_tokens(e.amount), _iso(e.created_at),
                                 _iso(e.interval_start), _iso(e.interval_end), e.model or "", e.gpu_seconds or "",
                                 e.reason, e.actor, e.key])
            self.write(buf.getvalue())
            buf.seek(0)
            buf.truncate()
            await self.flush()
        self.write(buf.getvalue())
        self.finish()


class AuditHandler(APIHandler):
    """Every cull action with its reason (admins)."""

    async def get(self) -> None:
        self.require_admin()
        limit = self.int_arg("limit", 100, minimum=1, maximum=MAX_PAGE)
        before = self.int_arg("before", None, minimum=1)
        user = self.name_arg("user")
        events = await self.manager.records.audit_log.off_loop(limit=limit, before=before, user=user)  # type: ignore[arg-type]
        self.write_json({
            "events": [{"id": e.id, "at": _iso(e.at), "user": e.user, "server": e.server, "action": e.action,
                        "reason": e.reason, "dry_run": e.dry_run, "detail": e.detail} for e in events],
            "next_before": events[-1].id if len(events) == limit else None,
        })


default_handlers = [
    (r"api/v1/ledger/verify", VerifyHandler),
    (r"api/v1/ledger/export", ExportHandler),
    (r"api/v1/audit", AuditHandler),
]
