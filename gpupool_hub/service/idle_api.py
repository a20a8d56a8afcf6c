"""``PUT nodes/{node}/utilization``: node agents report their GPUs' utilization, for
idle reclaim without Prometheus (``service/idle.py``)."""

from __future__ import annotations

from datetime import datetime, timezone

from tornado import web

from .agents import AgentHandler


class UtilizationHandler(AgentHandler):
    """Body: ``{"gpus": {"<GPU UUID>": 0.0-1.0, ...}, "memory": {"<GPU UUID>": [used, total], ...}}``
    (memory in bytes, optional), the node's own agent token or an admin."""

    max_body_bytes = 64 * 1024

    def put(self, _node: str) -> None:
        source = self.context.utilization
        if source is None:
            raise web.HTTPError(409, "this service reads GPU utilization from Prometheus; reports are not used")
        body = self.json_body()
        gpus = body.get("gpus")
        if not isinstance(gpus, dict) or not all(
                isinstance(k, str) and k and isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1
                for k, v in gpus.items()):
            raise web.HTTPError(400, "'gpus' must map GPU UUIDs to utilization between 0 and 1")
        memory = body.get("memory") or {}
        if not isinstance(memory, dict) or not all(
                isinstance(k, str) and isinstance(v, list) and len(v) == 2
                and all(isinstance(x, int) and not isinstance(x, bool) and x >= 0 for x in v) and v[0] <= v[1]
                for k, v in memory.items()):
            raise web.HTTPError(400, "'memory' must map GPU UUIDs to [used, total] bytes (whole numbers, used <= total)")
        self.check_own_devices(set(gpus) | set(memory))
        self.touch()
        source.report({k: float(v) for k, v in gpus.items()}, datetime.now(timezone.utc),
                      {k: (v[0], v[1]) for k, v in memory.items()})
        self.write_json({"node": self.node, "accepted": len(gpus)})


def idle_routes(prefix: str) -> list[tuple[str, type[web.RequestHandler]]]:
    api = prefix.rstrip("/") + "/api/v1"
    return [(rf"{api}/nodes/([^/]+)/utilization", UtilizationHandler)]
