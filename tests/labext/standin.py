"""A small real tornado HTTP app standing in for the gpupool hub service.

It serves ``GET /services/gpupool/api/v1/me`` (the JSON contract of the
service, changeable by the test while it runs) and the hub's
``GET /hub/api/services/gpupool`` (for the "ask the hub" path), in a thread of
its own so that a Jupyter server in a subprocess can reach it whatever the
test's own event loop does.

To be replaced by the real hub + service once they exist; only
:func:`example_me` describes the contract.
"""

from __future__ import annotations

import asyncio
import copy
import json
import threading
from datetime import datetime, timedelta, timezone
from typing import Any

import tornado.web
from tornado.httpserver import HTTPServer
from tornado.netutil import bind_sockets

#: The token the stand-in expects from the single-user server.
SERVER_TOKEN = "server-token-for-tests"
SERVICE_PREFIX = "/services/gpupool/"


def iso(dt: datetime) -> str:
    return dt.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def example_me(**changes: Any) -> dict[str, Any]:
    """The service's ``GET me`` example (46.0 tokens, burning 2.0/h), with changes."""
    me: dict[str, Any] = {
        "user": "alice",
        "balance": "46.000",
        "floor": "-10.000",
        "unit": "tokens",
        "status": "fine",
        "credits": {
            "daily": "1.000",
            "monthly": "30.000",
            "next_daily_at": "2026-11-22T00:00:00Z",
            "next_monthly_at": "2026-12-01T00:00:00Z",
            "max_balance": None,
        },
        "allocations": [
            {
                "id": "a1b2",
                "server": "",
                "node": "node-a",
                "gpus": [
                    {"index": 2, "uuid": "GPU-2f6c", "model": "NVIDIA GeForce RTX 3090", "fraction": "1.000"}
                ],
                "price_per_hour": "2.000",
                "borrowed": False,
                "started_at": "2026-11-21T09:00:00Z",
                "description": "node-a, GPUs 2+3 joined by NVLink",
            }
        ],
        "burn_rate_per_hour": "2.000",
        "time_to_floor_seconds": 100800,
        "last_debit_at": "2026-11-21T10:00:00Z",
        "accounting": {"status": "ok", "message": None},
        "cull_warning": None,
    }
    me.update(copy.deepcopy(changes))
    return me


def cull_in(minutes: float, action: str = "server", reason: str = "balance below the floor") -> dict[str, str]:
    deadline = datetime.now(timezone.utc) + timedelta(minutes=minutes)
    return {"action": action, "reason": reason, "deadline": iso(deadline)}


class StandInService:
    """The stand-in; ``me`` and ``mode`` may be changed at any time.

    mode: ``"ok"`` (answer ``me``), ``"error"`` (HTTP 500), ``"slow"`` (answer
    after ``delay`` seconds), ``"garbage"`` (200 with a non-JSON body).
    """

    def __init__(self, token: str = SERVER_TOKEN) -> None:
        self.token = token
        self.me: dict[str, Any] = example_me()
        self.mode = "ok"
        self.delay = 2.0
        #: (path, Authorization header) of every request, in order.
        self.requests: list[tuple[str, str | None]] = []
        self.port = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    # ---- addresses

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_url(self) -> str:
        """What the spawner would put in ``GPUPOOL_API_URL``."""
        return f"{self.base_url}{SERVICE_PREFIX}api/v1/"

    @property
    def hub_api_url(self) -> str:
        """What JupyterHub would put in ``JUPYTERHUB_API_URL``."""
        return f"{self.base_url}/hub/api"

    def set_me(self, **changes: Any) -> None:
        me = copy.deepcopy(self.me)
        me.update(copy.deepcopy(changes))
        self.me = me

    # ---- life cycle

    def start(self) -> StandInService:
        sockets = bind_sockets(0, "127.0.0.1")
        self.port = sockets[0].getsockname()[1]
        ready = threading.Event()

        def run() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            self._loop = loop
            server = HTTPServer(self._app())
            server.add_sockets(sockets)
            loop.call_soon(ready.set)
            try:
                loop.run_forever()
            finally:
                server.stop()
                loop.run_until_complete(server.close_all_connections())
                loop.close()

        self._thread = threading.Thread(target=run, name="gpupool-standin", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("stand-in service did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)

    def __enter__(self) -> StandInService:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _app(self) -> tornado.web.Application:
        standin = self

        class Base(tornado.web.RequestHandler):
            def prepare(self) -> None:
                auth = self.request.headers.get("Authorization")
                standin.requests.append((self.request.path, auth))
                if auth != f"token {standin.token}":
                    raise tornado.web.HTTPError(403)

        class Me(Base):
            async def get(self) -> None:
                mode = standin.mode
                if mode == "error":
                    raise tornado.web.HTTPError(500)
                if mode == "slow":
                    await asyncio.sleep(standin.delay)
                self.set_header("Content-Type", "application/json")
                if mode == "garbage":
                    self.finish("<html>not json</html>")
                else:
                    self.finish(json.dumps(standin.me))

        class HubService(Base):
            def get(self, name: str) -> None:
                if name != "gpupool":
                    raise tornado.web.HTTPError(404)
                self.finish({"name": name, "url": standin.base_url, "prefix": SERVICE_PREFIX})

        return tornado.web.Application(
            [
                (rf"{SERVICE_PREFIX}api/v1/me", Me),
                (r"/hub/api/services/([^/]+)", HubService),
            ]
        )
