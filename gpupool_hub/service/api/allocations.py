"""``allocations``, ``allocations/{id}``, ``allocations/by-key/{key}`` and ``reclaims``:
what the spawner asks for, gives back and gives up."""

from __future__ import annotations

from tornado import web

from ..core.admission import parse_request
from ..core.attempts import KEY_MAX_LENGTH, AttemptAbandoned, parse_instant
from ..core.errors import BadRequest, Refused
from .base import APIHandler


class AllocationsHandler(APIHandler):
    max_body_bytes = 64 * 1024
    openapi_path = "/allocations"

    async def get(self) -> None:
        self.require_spawner_or_admin()
        views = self.manager.views
        active = await self.manager.records.active_allocations.off_loop()
        self.write_json({"allocations": [views.allocation_json(r) for r in active]})

    async def post(self) -> None:
        self.require_spawner_or_admin()
        body = self.json_body()
        key, user, server = body.get("key"), body["user"], body.get("server", "")
        groups = body.get("groups")
        request = body["request"]
        try:
            req = parse_request(request)
        except BadRequest as e:
            raise web.HTTPError(400, f"invalid request: {e}") from None
        models = request.get("models")
        if groups is None:
            groups = await self.groups_of(user)
        try:
            record = await self.manager.admission.admit.off_loop(user, groups, server, req, models, key=key,
                                                                 pending=bool(body.get("pending")))
        except BadRequest as e:
            raise web.HTTPError(400, str(e)) from None
        except AttemptAbandoned as e:
            self.write_json({"allocated": False, "reason": "abandoned", "message": str(e)}, 410)
            return
        except Refused as e:
            self.write_json({"allocated": False, **e.as_dict()}, 409)
            return
        self.write_json({"allocated": True, "allocation": self.manager.views.allocation_json(record)}, 201)


class AllocationHandler(APIHandler):
    async def get(self, alloc_id: str) -> None:
        self.require_spawner_or_admin()
        record = await self.manager.records.allocation.off_loop(self.path_text(alloc_id, "allocation id"))
        if record is None:
            raise web.HTTPError(404, f"no allocation {alloc_id!r}")
        self.write_json({"allocation": self.manager.views.allocation_json(record)})

    async def delete(self, alloc_id: str) -> None:
        self.require_spawner_or_admin()
        reason = self.text_arg("reason", "server stopped", max_length=1000)[:200]  # type: ignore[index]
        at = self.text_arg("at")  # when the server stopped, for a release that comes late
        try:
            stopped = parse_instant(at) if at is not None else None
        except ValueError as e:
            raise web.HTTPError(400, f"'at' must be an ISO 8601 instant: {e}") from None
        record = await self.manager.admission.release.off_loop(self.path_text(alloc_id, "allocation id"), reason,
                                                               at=stopped)
        if record is None:
            raise web.HTTPError(404, f"no allocation {alloc_id!r}")
        self.write_json({"allocation": self.manager.views.allocation_json(record)})

    max_body_bytes = 16 * 1024
    openapi_path = "/allocations/{id}"

    async def patch(self, alloc_id: str) -> None:
        """The spawner reports on the allocation's server (gpupool-slurm): the GPU indices its job was
        really bound to, when its work started (the charge starts then), or that its stop is not yet
        confirmed (held and charged until it is)."""
        if not self.is_spawner:
            raise web.HTTPError(403, "only the hub's spawner reports on an allocation's server")
        body = self.json_body()
        alloc_id = self.path_text(alloc_id, "allocation id")
        m = self.manager
        try:
            started = parse_instant(body["started_at"]) if "started_at" in body else None
        except ValueError as e:
            raise web.HTTPError(400, f"request body field /started_at: {e}") from None
        record = await m.records.allocation.off_loop(alloc_id)
        if record is None or record.released_at is not None:
            raise web.HTTPError(404, f"no held allocation {alloc_id!r}")
        if "gpu_indices" in body:
            try:
                record = await m.rebinds.rebind.off_loop(m.ledger, alloc_id, body["gpu_indices"])
            except LookupError:
                raise web.HTTPError(404, f"no held allocation {alloc_id!r}") from None
            except ValueError as e:
                raise web.HTTPError(409, str(e)) from None
        if started is not None:
            await m.admission.started.off_loop(alloc_id, started)
        if body.get("stopping"):
            await m.admission.stopping.off_loop(alloc_id)
        record = await m.records.allocation.off_loop(alloc_id) or record
        self.write_json({"allocation": m.views.allocation_json(record)})


class ReclaimsHandler(APIHandler):
    """The spawner gives up a spawn that waits for a reclaim: its victims keep their GPUs."""

    async def delete(self) -> None:
        self.require_spawner_or_admin()
        user = self.name_arg("user")
        if not user:
            raise web.HTTPError(400, "'user' is required")
        server = self.name_arg("server", "") or ""
        why = self.text_arg("reason", "the spawn was cancelled", max_length=1000)[:200]  # type: ignore[index]
        cancelled = await self.manager.reclaims.cancel_pending.off_loop(user, server, why)
        self.write_json({"cancelled": cancelled})


class AllocationByKeyHandler(APIHandler):
    """``DELETE /allocations/by-key/{key}``: the spawner gave up on a spawn attempt."""

    async def delete(self, key: str) -> None:
        self.require_spawner_or_admin()
        key = self.path_text(key, "spawn attempt key")
        if not 0 < len(key) <= KEY_MAX_LENGTH:
            raise web.HTTPError(400, f"a spawn attempt's key has 1-{KEY_MAX_LENGTH} characters")
        reason = self.text_arg("reason", "spawn abandoned", max_length=1000)[:200]  # type: ignore[index]
        record = await self.manager.admission.release_key.off_loop(key, reason)
        views = self.manager.views
        self.write_json({"allocation": views.allocation_json(record) if record is not None else None})


NAME = r"([^/]+)"

default_handlers = [
    (r"api/v1/allocations", AllocationsHandler),
    (r"api/v1/reclaims", ReclaimsHandler),
    (rf"api/v1/allocations/by-key/{NAME}", AllocationByKeyHandler),  # before allocations/{id}
    (rf"api/v1/allocations/{NAME}", AllocationHandler),
]
