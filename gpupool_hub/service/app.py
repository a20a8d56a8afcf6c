"""The gpupool service: a hub-managed tornado app that owns money and GPUs.

JupyterHub starts it from ``c.JupyterHub.services`` and passes its URL, API
token and prefix in the environment. It reads the same ``jupyterhub_config.py``
as the hub, so prices, grants, the pool and Prometheus are configured once.
Run it standalone for development as an *external* service: set
``JUPYTERHUB_API_URL`` and ``JUPYTERHUB_API_TOKEN`` and point the hub's
service entry at its URL.
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import quote, urlparse

from jupyterhub.services.auth import HubAuth
from tornado import web
from tornado.ioloop import IOLoop
from traitlets import Bool, Dict, Enum, Float, Integer, Unicode, default
from traitlets.config import Application, catch_config_error

from .. import __version__
from ..config import GPUPool
from ..ledger import Ledger
from ..usage.records import AllocationRecordsSource
from .agents import agent_routes
from .cull import Culler, Decision, UserState, decide, pressure, server_api_url
from .handlers import routes
from .hubapi import HubClient, HubError
from .manager import PoolManager
from .metrics import ServiceMetrics

log = logging.getLogger("gpupool")


class GPUPoolService(Application):
    """The gpupool hub service."""

    name = "gpupool-service"
    version = __version__
    description = "Token balances, GPU placement, usage debits and culling for a JupyterHub GPU pool."
    classes = [GPUPool, Culler]  # type: ignore[assignment]

    aliases = {  # type: ignore[assignment]
        "config": "GPUPoolService.config_file",
        "f": "GPUPoolService.config_file",
        "port": "GPUPoolService.port",
        "log-level": "Application.log_level",
    }

    config_file = Unicode(
        "jupyterhub_config.py",
        help="The hub's configuration file, read for c.GPUPool and c.GPUPoolService settings.",
    ).tag(config=True)

    ip = Unicode(help="Interface to listen on (default: from JUPYTERHUB_SERVICE_URL).").tag(config=True)
    port = Integer(help="Port to listen on (default: from JUPYTERHUB_SERVICE_URL, else 10101).").tag(config=True)
    prefix = Unicode(help="URL prefix (default: JUPYTERHUB_SERVICE_PREFIX, else /services/gpupool/).").tag(config=True)

    @default("ip")
    def _ip(self) -> str:
        return urlparse(os.environ.get("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:10101")).hostname or "127.0.0.1"

    @default("port")
    def _port(self) -> int:
        return urlparse(os.environ.get("JUPYTERHUB_SERVICE_URL", "http://127.0.0.1:10101")).port or 10101

    @default("prefix")
    def _prefix(self) -> str:
        return os.environ.get("JUPYTERHUB_SERVICE_PREFIX", "/services/gpupool/")

    hub_api_url = Unicode(help="JupyterHub API URL (default: JUPYTERHUB_API_URL).").tag(config=True)
    api_token = Unicode(help="This service's hub API token (default: JUPYTERHUB_API_TOKEN).").tag(config=True)

    @default("hub_api_url")
    def _hub_api_url(self) -> str:
        return os.environ.get("JUPYTERHUB_API_URL", "http://127.0.0.1:8081/hub/api")

    @default("api_token")
    def _api_token(self) -> str:
        return os.environ.get("JUPYTERHUB_API_TOKEN", "")

    admin_scope = Unicode(
        "custom:gpupool:admin",
        help="Scope that admin endpoints require; declare it in c.JupyterHub.custom_scopes and grant it to admins' roles.",
    ).tag(config=True)

    max_grant = Integer(1_000_000, help="Largest amount (either sign) one admin grant may move.").tag(config=True)

    debit_interval = Integer(
        3600, help="Seconds per debit interval; intervals are aligned to multiples of this since the epoch.",
    ).tag(config=True)
    debit_check_interval = Float(60, help="Seconds between checks for closed, uncharged intervals.").tag(config=True)
    replenish_interval = Float(300, help="Seconds between credit runs over all hub users.").tag(config=True)
    reconcile_interval = Float(60, help="Seconds between checks that allocations' servers still run.").tag(config=True)
    reconcile_grace = Float(
        120, help="Allocations younger than this are never reconciled away (their server may still be starting).",
    ).tag(config=True)
    debit_delay_tolerance = Integer(
        900, help="Seconds past an interval's end before accounting is reported as delayed.",
    ).tag(config=True)

    prometheus_url = Unicode(
        "", help="Prometheus base URL for usage. Empty: charge from the service's own allocation records.",
    ).tag(config=True)
    usage_preset = Enum(
        ["gpupool", "agent", "dcgm", "custom"], "gpupool",
        help="Which metrics describe usage: this service's allocation gauge, the node agent, the DCGM exporter, or usage_query.",
    ).tag(config=True)
    usage_query = Unicode("", help="PromQL template for usage_preset='custom'; see docs/usage-sources.md.").tag(config=True)
    prometheus_step = Integer(60, help="Resolution of usage range queries, in seconds.").tag(config=True)
    prometheus_settle = Integer(120, help="Seconds an interval must be closed before Prometheus data counts as final.").tag(config=True)
    prometheus_token = Unicode("", help="Bearer token for Prometheus, if it needs one.").tag(config=True)
    prometheus_options = Dict(help="More keyword arguments for PrometheusUsageSource.").tag(config=True)

    agent_tokens = Dict(
        help="""Per-node tokens for node agents, e.g. ``{"node-a": "<secret>"}``; an agent
        authenticates with its node's token and may only report for that node.""",
    ).tag(config=True)
    agent_dry_run = Bool(False, help="Tell node agents to only log the GPU processes they would stop.").tag(config=True)

    run_jobs = Bool(True, help="Run the scheduled jobs (turn off for a read-only replica or some tests).").tag(config=True)

    @catch_config_error
    def initialize(self, argv: list[str] | None = None) -> None:
        super().initialize(argv)
        explicit = "config_file" in self.cli_config.get("GPUPoolService", {})
        path = os.environ.get("GPUPOOL_CONFIG_FILE") or self.config_file
        if os.path.exists(path):
            self.load_config_file(path)
            self.update_config(self.cli_config)  # command line wins over the file
        elif explicit or "GPUPOOL_CONFIG_FILE" in os.environ:
            raise SystemExit(f"gpupool: config file {path!r} not found")
        self._check_profiles()
        self.settings_ = GPUPool(parent=self)
        self.ledger = Ledger(self.settings_.db_url)
        self.manager = PoolManager(
            settings=self.settings_, ledger=self.ledger, pool=self.settings_.make_pool(),
            usage_source=self.make_usage_source() or AllocationRecordsSource(self.ledger), debit_interval=self.debit_interval,
            debit_delay_tolerance=self.debit_delay_tolerance,
        )
        self.manager.on_reclaim = self._schedule_reclaim
        restored = self.manager.restore()
        self.log.info("gpupool %s: %d node(s), %d allocation(s) restored, ledger %s",
                      __version__, len(self.manager.pool.nodes), restored, self.ledger.engine.url.render_as_string())
        self.metrics = ServiceMetrics(self.manager)
        self.hub = HubClient(self.hub_api_url, self.api_token)
        self.hub_auth = HubAuth(api_token=self.api_token, api_url=self.hub_api_url, cache_max_age=60)
        self._groups: dict[str, tuple[float, list[str]]] = {}
        self.reconcile_findings: list[dict[str, Any]] = []
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="gpupool-job")
        self.culler = Culler(parent=self)
        if not self.culler.hub_public_url:
            hub_cfg = self.config.get("JupyterHub", {})
            self.culler.hub_public_url = hub_cfg.get("bind_url") or (
                f"http://{hub_cfg.get('ip') or '127.0.0.1'}:{hub_cfg.get('port', 8000)}")
        self._dry_warnings: dict[str, Any] = {}

    def _check_profiles(self) -> None:
        """The hub only validates spawner profiles at the first spawn; the service,
        reading the same file at start-up, reports a bad profile at once."""
        profiles = self.config.get("GPUPoolSpawner", {}).get("profiles")
        if profiles is None:
            return
        from ..spawner import parse_profiles

        try:
            parse_profiles(profiles)
        except Exception as e:
            self.log.critical("Invalid spawner profiles in %s: %s", self.config_file, e)
            raise SystemExit(f"gpupool: invalid c.GPUPoolSpawner.profiles: {e}") from None

    def make_usage_source(self) -> Any:
        if not self.prometheus_url:
            return None  # the embedded default: the service's own allocation records
        from ..usage.prometheus import PrometheusUsageSource

        return PrometheusUsageSource(
            self.prometheus_url, self.usage_preset, self.usage_query or None, step_seconds=self.prometheus_step,
            settle_seconds=self.prometheus_settle, bearer_token=self.prometheus_token or None,
            **self.prometheus_options,
        )

    async def groups_of(self, user: str) -> list[str]:
        """A user's hub groups, cached for a minute (credit rules depend on them)."""
        cached = self._groups.get(user)
        if cached and time.monotonic() - cached[0] < 60:
            return cached[1]
        try:
            model = await self.hub.user(user)
        except HubError as e:
            self.log.warning("Cannot read groups of %s: %s", user, e)
            return cached[1] if cached else []
        groups = list((model or {}).get("groups", []))
        self._groups[user] = (time.monotonic(), groups)
        return groups

    def make_app(self) -> web.Application:
        access = {f"access:services!service={os.environ.get('JUPYTERHUB_SERVICE_NAME', 'gpupool')}", "access:services"}
        return web.Application(
            routes(self.prefix) + agent_routes(self.prefix),
            manager=self.manager, hub_auth=self.hub_auth, hub=self.hub, metrics=self.metrics,
            spawner_token=self.api_token, admin_scope=self.admin_scope, access_scopes=access,
            groups=self.groups_of, max_grant=self.max_grant,
            agent_tokens=self.agent_tokens, agent_dry_run=self.agent_dry_run,
            reconcile_report=lambda: list(self.reconcile_findings),
            log_function=self._log_request,
        )

    def _log_request(self, handler: web.RequestHandler) -> None:
        status = handler.get_status()
        # Successful reads are routine (every lab tab polls GET me): debug, not info.
        if status < 400:
            level = logging.DEBUG if handler.request.method == "GET" else logging.INFO
        else:
            level = logging.WARNING if status < 500 else logging.ERROR
        if level < self.log_level:  # the logger itself is at DEBUG; skip building a record nobody prints
            return
        self.log.log(level, "%d %s %s %.1fms", status, handler.request.method, handler.request.path,
                     1000 * handler.request.request_time())

    # ------------------------------------------------------------------ jobs

    async def _in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await IOLoop.current().run_in_executor(self.executor, fn, *args)

    async def _timed(self, job: str, fn: Callable[[], Awaitable[Any]]) -> None:
        started = time.perf_counter()
        try:
            await fn()
        except Exception:
            self.metrics.job_failures.labels(job).inc()
            self.log.exception("Job %s failed; it will run again", job)
        finally:
            self.metrics.job_duration.labels(job).observe(time.perf_counter() - started)

    async def debit(self) -> None:
        await self._in_thread(self.manager.debit_due)

    async def replenish(self) -> None:
        pairs = [(u["name"], u.get("groups", [])) async for u in self.hub.users()]
        for name, groups in pairs:
            self._groups[name] = (time.monotonic(), list(groups))
        await self._in_thread(self.manager.replenish, pairs)

    async def reconcile(self) -> None:
        """Release allocations whose server is gone; report servers claiming unknown allocations."""
        running: dict[tuple[str, str], dict[str, Any]] = {}
        async for user in self.hub.users(state="active"):
            for server_name, server in (user.get("servers") or {}).items():
                running[(user["name"], server_name)] = server
        now = datetime.now(timezone.utc)
        active = self.ledger.active_allocations()
        for record in active:
            if (record.user, record.server) in running:
                continue
            if now - record.created_at < timedelta(seconds=self.reconcile_grace):
                continue
            self.log.warning("Releasing allocation %s: server %s/%s is not running", record.id, record.user, record.server)
            self.manager.release(record.id, "reconcile: server not running")
        known = {r.id for r in active}
        findings = []
        for (user, server_name), server in running.items():
            alloc = (server.get("state") or {}).get("gpupool_allocation")
            if alloc and alloc not in known:
                findings.append({"user": user, "server": server_name, "allocation": alloc,
                                 "message": "server claims GPUs the pool has no allocation for"})
                self.log.error("Server %s/%s holds allocation %s the pool does not know", user, server_name, alloc)
        self.reconcile_findings = findings

    async def cull(self) -> None:
        """Warn, shut down kernels, stop servers: see cull.py for the rules."""
        from decimal import Decimal

        now = datetime.now(timezone.utc)
        m, culler = self.manager, self.culler
        servers: dict[str, set[str]] = {}
        allocated = Decimal(0)
        for record in self.ledger.active_allocations():
            servers.setdefault(record.user, set()).add(record.server)
            allocated += sum((Decimal(g["milli"]) / 1000 for g in record.gpus), Decimal(0))
        for user, server in m.revoked:
            servers.setdefault(user, set()).add(server)
        capacity = Decimal(sum(len(ns.node.gpus) for ns in m.pool.nodes))
        last_refusal = m.capacity_refusals[-1] if m.capacity_refusals else None
        del m.capacity_refusals[:-1]  # only the newest matters
        why = pressure(allocated, capacity, last_refusal, now, culler, await self._utilization())
        warnings = self._dry_warnings if culler.dry_run else m.cull_warnings
        states = []
        # users the agents enforce against are re-checked too, so a top-up frees them
        for user in set(servers) | set(warnings) | set(m.enforce_users):
            groups = set(await self.groups_of(user))
            rules = self.settings_.rules_for(groups)
            try:
                balance = self.ledger.balance(user)
            except Exception:
                continue
            exempt = user in culler.exempt_users or bool(groups & culler.exempt_groups)
            states.append(UserState(user, balance, rules.floor, tuple(sorted(servers.get(user, ()))), exempt))
            if balance >= 0:
                m.enforce_users.discard(user)
                for key in [k for k in m.revoked if k[0] == user]:
                    del m.revoked[key]
        for d in decide(states, warnings, why, now, timedelta(seconds=culler.grace_period)):
            await self._carry_out(d, warnings)

    async def _utilization(self) -> float | None:
        if not (self.culler.pressure_utilization and self.prometheus_url):
            return None
        from urllib.parse import urlencode

        from tornado.httpclient import AsyncHTTPClient

        url = f"{self.prometheus_url.rstrip('/')}/api/v1/query?" + urlencode({"query": self.culler.utilization_query})
        headers = {"Authorization": f"Bearer {self.prometheus_token}"} if self.prometheus_token else {}
        try:
            resp = await AsyncHTTPClient().fetch(url, headers=headers, request_timeout=10)
            import json

            return float(json.loads(resp.body)["data"]["result"][0]["value"][1])
        except Exception as e:  # pressure from allocation and refusals still works
            self.log.warning("GPU utilization unavailable for the pressure check: %s", e)
            return None

    async def _carry_out(self, d: Decision, warnings: dict[str, Any]) -> None:
        from ..ledger import AuditEvent
        from .manager import CullWarning

        dry = self.culler.dry_run
        now = datetime.now(timezone.utc)
        detail: dict[str, Any] = {}
        if dry:
            self.log.warning("[dry run] would %s for %s/%s: %s", d.action, d.user, d.server, d.reason)
        if d.action == "warn":
            warnings[d.user] = CullWarning("kernels", d.reason, d.deadline)  # type: ignore[arg-type]
            self.manager.forget(d.user)
            self.log.warning("Cull warning for %s until %s: %s", d.user, d.deadline, d.reason)
        elif d.action == "clear_warning":
            warnings.pop(d.user, None)
            self.manager.forget(d.user)
        elif not dry:
            try:
                if d.action == "cull_kernels":
                    detail["kernels"] = await self._shutdown_kernels(d.user, d.server)
                    self.manager.revoked[(d.user, d.server)] = now
                    self.manager.enforce_users.add(d.user)
                    if not detail["kernels"] and not self._holds(d.user, d.server):
                        return  # a revoked server with nothing new to shut down: nothing to record
                elif d.action == "stop_server":
                    await self.hub.stop_server(d.user, d.server)
                    self.manager.revoked.pop((d.user, d.server), None)
                    self.manager.enforce_users.add(d.user)
                released = [r.id for r in self.ledger.active_allocations(d.user) if r.server == d.server]
                for alloc in released:
                    self.manager.release(alloc, f"{d.action}: {d.reason}")
                detail["released"] = released
                self.log.warning("%s for %s/%s: %s", d.action, d.user, d.server, d.reason)
            except HubError as e:
                self.log.error("Could not %s for %s/%s: %s", d.action, d.user, d.server, e)
                self.ledger.add_audit(AuditEvent(now, d.user, d.server, "failed", f"{d.action}: {e}", dry))
                return
        self.ledger.add_audit(AuditEvent(now, d.user, d.server, d.action, d.reason, dry, detail or None))

    def _schedule_reclaim(self, reclaim: Any) -> None:
        IOLoop.current().add_callback(self._reclaim, reclaim)

    async def _reclaim(self, reclaim: Any) -> None:
        """Fair share: after the grace, stop the borrowed servers a reclaim preempts
        and release their allocations; the requester's retry then gets the GPUs."""
        delay = (reclaim.deadline - datetime.now(timezone.utc)).total_seconds()
        if delay > 0:
            await asyncio.sleep(delay)
        for victim in reclaim.victims:
            if self.manager.reclaims.get((reclaim.user, reclaim.server)) is not reclaim:
                return  # cancelled meanwhile: the remaining victims keep their GPUs
            error = None
            try:
                await self.hub.stop_server(victim.user, victim.server)
            except HubError as e:  # released anyway: the GPUs are reassigned as announced
                error = str(e)
                self.log.error("Could not stop %s/%s to reclaim its borrowed GPUs: %s", victim.user, victim.server, e)
            self.manager.preempt(reclaim, victim, stopped=error is None, error=error)

    def _holds(self, user: str, server: str) -> bool:
        return any(r.server == server for r in self.ledger.active_allocations(user))

    async def _shutdown_kernels(self, user: str, server: str) -> list[str]:
        """Shut down every kernel of the server; notebooks and files stay as they are."""
        api = server_api_url(self.culler.hub_public_url, user, server)
        kernels = await self.hub.request("GET", "", url=api + "kernels", allow_404=True) or []
        done = []
        for kernel in kernels:
            await self.hub.request("DELETE", "", url=api + f"kernels/{quote(kernel['id'], safe='')}", allow_404=True)
            done.append(kernel["id"])
        return done

    async def _every(self, seconds: float, job: str, fn: Callable[[], Awaitable[Any]]) -> None:
        while True:
            await self._timed(job, fn)
            await asyncio.sleep(seconds)

    def start_jobs(self) -> None:
        loop = asyncio.get_event_loop()
        self._tasks = [
            loop.create_task(self._every(self.replenish_interval, "replenish", self.replenish)),
            loop.create_task(self._every(self.debit_check_interval, "debit", self.debit)),
            loop.create_task(self._every(self.reconcile_interval, "reconcile", self.reconcile)),
        ]
        if self.culler.enabled:
            self._tasks.append(loop.create_task(self._every(self.culler.interval, "cull", self.cull)))

    def start(self) -> None:
        app = self.make_app()
        app.listen(self.port, address=self.ip, xheaders=True)
        self.log.info("gpupool service listening on http://%s:%d%s", self.ip, self.port, self.prefix)
        if self.run_jobs:
            IOLoop.current().add_callback(self.start_jobs)
        IOLoop.current().start()


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="[%(levelname)1.1s %(asctime)s %(name)s] %(message)s")
    app = GPUPoolService.instance()
    app.initialize(argv)
    app.start()
