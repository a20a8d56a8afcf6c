"""``GET``/``PUT nodes/{node}/boundary``: the node agents' boundary guard asks who holds
each GPU of the node and reports the processes it found out of bounds (their owner
holds no allocation on that GPU) and what it stopped (rules in ``agent/boundary.py``).
Each warning and each stop goes to the audit log; the agent sends a warning once."""

from __future__ import annotations

from datetime import datetime, timezone

from tornado import web

from ..ledger import AllocationRecord, AuditEvent
from ..reasons import AuditAction
from .agents import AgentHandler
from .memory_api import _checked, checked_pids_and_dry_run

MAX_REPORT_BYTES = 256 * 1024

_WARNING_FIELDS = {"user": str, "gpu_uuid": str, "gpu_index": int, "deadline": str, "pids": list}
_ACTION_FIELDS = {"user": str, "gpu_uuid": str, "pid": int, "action": str, "detail": str}


def holders_on(records: list[AllocationRecord], node: str) -> dict[str, list[str]]:
    """GPU UUID (and MIG instance UUID) -> the users holding it or a share of it on ``node``."""
    out: dict[str, set[str]] = {}
    for r in records:
        if r.node != node:
            continue
        for g in r.gpus:
            out.setdefault(g.get("mig_uuid") or g["uuid"], set()).add(r.user)
    return {uuid: sorted(users) for uuid, users in sorted(out.items())}


class BoundaryHandler(AgentHandler):
    max_body_bytes = MAX_REPORT_BYTES

    async def get(self, _node: str) -> None:
        self.touch()
        records = await self.read_db(self.manager.ledger.active_allocations)
        self.write_json({"holders": holders_on(records, self.node), "dry_run": self.context.agent_dry_run})

    async def put(self, _node: str) -> None:
        body = self.json_body()
        warnings = _checked(body.get("warnings"), _WARNING_FIELDS, "warnings")
        actions = _checked(body.get("actions", []), _ACTION_FIELDS, "actions")
        dry = checked_pids_and_dry_run(body, warnings) or self.context.agent_dry_run
        self.check_own_devices({x["gpu_uuid"] for x in warnings + actions})
        self.touch()
        now = datetime.now(timezone.utc)
        events = [AuditEvent(now, w["user"], "", AuditAction.GPU_OUT_OF_BOUNDS.value,
                             f"process(es) {', '.join(map(str, w['pids']))} on GPU {w['gpu_uuid']} of {self.node}, "
                             f"which {w['user']} holds no allocation on; stopped from {w['deadline']}", dry,
                             {"node": self.node, **w})
                  for w in warnings]
        events += [AuditEvent(now, a["user"], "", AuditAction.GPU_OUT_OF_BOUNDS_STOP.value,
                              f"pid {a['pid']} on GPU {a['gpu_uuid']} of {self.node}: {a['action']}"
                              + (f" ({a['detail']})" if a["detail"] else ""), dry, {"node": self.node, **a})
                   for a in actions]
        for event in events:
            await self.core(self.manager.ledger.add_audit, event)
        self.write_json({"node": self.node, "audited": len(events)})


def boundary_routes(prefix: str) -> list[tuple[str, type[web.RequestHandler]]]:
    api = prefix.rstrip("/") + "/api/v1"
    return [(rf"{api}/nodes/([^/]+)/boundary", BoundaryHandler)]
