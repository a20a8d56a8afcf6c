"""``PUT nodes/{node}/utilization``: node agents report their GPUs' utilization, for
idle reclaim without Prometheus (``service/idle.py``)."""

from __future__ import annotations

from datetime import datetime, timezone

from tornado import web

from .agents import AgentHandler


class UtilizationHandler(AgentHandler):
    """Body: ``{"gpus": {"<GPU UUID>": 0.0-1.0, ...}}``, the node's own agent token or an admin."""

    max_body_bytes = 64 * 1024

    def put(self, _node: str) -> None:
        source = self.context.utilization
        if source is None:
            raise web.HTTPError(409, "this service reads GPU utilization from Prometheus; reports are not used")
        gpus = self.json_body().get("gpus")
        if not isinstance(gpus, dict) or not all(
                isinstance(k, str) and k and isinstance(v, (int, float)) and not isinstance(v, bool) and 0 <= v <= 1
                for k, v in gpus.items()):
            raise web.HTTPError(400, "'gpus' must map GPU UUIDs to utilization between 0 and 1")
        known = {g.uuid for ns in self.manager.pool.nodes if ns.name == self.node for g in ns.node.gpus}
        unknown = sorted(set(gpus) - known)
        if unknown:
            raise web.HTTPError(400, f"GPU(s) {unknown[:5]} are not in node {self.node!r} of the pool")
        self.touch()
        source.report({k: float(v) for k, v in gpus.items()}, datetime.now(timezone.utc))
        self.write_json({"node": self.node, "accepted": len(gpus)})


def idle_routes(prefix: str) -> list[tuple[str, type[web.RequestHandler]]]:
    api = prefix.rstrip("/") + "/api/v1"
    return [(rf"{api}/nodes/([^/]+)/utilization", UtilizationHandler)]
