"""``GET``/``PUT nodes/{node}/memory``: the node agents' memory guard asks which shares
to watch and reports its warnings and what it stopped (rules in ``service/memory.py``
and ``agent/memguard.py``); new warnings and every stop go to the audit log."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

from tornado import web

from ..ledger import AuditEvent
from ..reasons import AuditAction
from .agents import AgentHandler
from .handlers import text_problem
from .httpargs import INT64_MAX
from .memory import shares_on

MAX_REPORT_BYTES = 256 * 1024

_WARNING_FIELDS = {"user": str, "server": str, "gpu_uuid": str, "gpu_index": int, "fraction_milli": int,
                   "limit_bytes": int, "used_bytes": int, "since": str, "deadline": str, "pids": list}
_ACTION_FIELDS = {"user": str, "server": str, "gpu_uuid": str, "pid": int, "memory_bytes": int, "action": str,
                  "detail": str}


def checked_pids_and_dry_run(body: dict[str, Any], warnings: list[dict[str, Any]]) -> bool:
    """The rules a field table cannot say, shared by the memory and boundary reports:
    bounded lists of real process ids, and a boolean ``dry_run`` (returned)."""
    if not all(isinstance(w["pids"], list) and len(w["pids"]) <= 1024 and all(
            isinstance(p, int) and not isinstance(p, bool) and 0 < p <= INT64_MAX for p in w["pids"])
            for w in warnings):
        raise web.HTTPError(400, "warnings[].pids must be a list of at most 1024 process ids")
    if not isinstance(body.get("dry_run", False), bool):
        raise web.HTTPError(400, "dry_run must be true or false")
    return bool(body.get("dry_run", False))


def _checked(items: Any, fields: dict[str, type], what: str) -> list[dict[str, Any]]:
    """Each item has every field, of its type; texts as any request text, counts not negative."""
    if not isinstance(items, list):
        raise web.HTTPError(400, f"'{what}' must be a list")
    for i, item in enumerate(items):
        if not isinstance(item, dict):
            raise web.HTTPError(400, f"{what}[{i}] must be an object")
        for name, kind in fields.items():
            value = item.get(name)
            if not isinstance(value, kind) or isinstance(value, bool):
                raise web.HTTPError(400, f"{what}[{i}].{name} must be a {kind.__name__}")
            if kind is int and not 0 <= value <= INT64_MAX:
                raise web.HTTPError(400, f"{what}[{i}].{name} must be between 0 and {INT64_MAX}")
            problem = text_problem(value, max_length=255, allow_empty=name in ("server", "detail")) \
                if kind is str else None
            if problem:
                raise web.HTTPError(400, f"{what}[{i}].{name} {problem}")
    return [{k: item[k] for k in fields} for item in items]


class MemoryHandler(AgentHandler):
    max_body_bytes = MAX_REPORT_BYTES

    async def get(self, _node: str) -> None:
        self.touch()
        records = await self.read_db(self.manager.ledger.active_allocations)
        self.write_json({"shares": shares_on(records, self.node), "dry_run": self.context.agent_dry_run})

    async def put(self, _node: str) -> None:
        body = self.json_body()
        warnings = _checked(body.get("warnings"), _WARNING_FIELDS, "warnings")
        actions = _checked(body.get("actions", []), _ACTION_FIELDS, "actions")
        dry = checked_pids_and_dry_run(body, warnings) or self.context.agent_dry_run
        self.check_own_devices({x["gpu_uuid"] for x in warnings + actions})
        self.touch()
        new = self.manager.memory.report(self.node, warnings, dry)
        now = datetime.now(timezone.utc)
        events = [AuditEvent(now, w["user"], w["server"], AuditAction.MEMORY_WARN.value,
                             f"uses {w['used_bytes'] >> 20} MiB of GPU {w['gpu_uuid']} on {self.node}, over the "
                             f"{w['limit_bytes'] >> 20} MiB limit of a {w['fraction_milli'] / 1000:.3f} share; "
                             f"processes stop from {w['deadline']}", dry,
                             {"node": self.node, **{k: w[k] for k in ("gpu_uuid", "limit_bytes", "used_bytes",
                                                                       "deadline", "pids")}})
                  for w in new]
        events += [AuditEvent(now, a["user"], a["server"], AuditAction.MEMORY_STOP.value,
                              f"pid {a['pid']} ({a['memory_bytes'] >> 20} MiB on GPU {a['gpu_uuid']}): {a['action']}"
                              + (f" ({a['detail']})" if a["detail"] else ""), dry,
                              {"node": self.node, **a})
                   for a in actions]
        for event in events:
            await self.core(self.manager.ledger.add_audit, event)
        self.write_json({"node": self.node, "warnings": len(warnings), "audited": len(events)})


def memory_routes(prefix: str) -> list[tuple[str, type[web.RequestHandler]]]:
    api = prefix.rstrip("/") + "/api/v1"
    return [(rf"{api}/nodes/([^/]+)/memory", MemoryHandler)]
