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
import threading
from collections.abc import Awaitable, Callable
from urllib.parse import urlparse

from jupyterhub.services.auth import HubAuth, HubOAuth
from tornado import web
from tornado.httpserver import HTTPServer
from tornado.ioloop import IOLoop
from traitlets import Bool, Dict, Enum, Float, Integer, Unicode, default
from traitlets.config import Application, catch_config_error

from .. import __version__
from ..config import GPUPool, make_inventory_source, make_pool
from ..engines import Engine, engines, in_use
from ..ledger import Ledger, LedgerError, upgrade_database
from ..placement.request import Request
from ..profiles import Profile, parse_profiles
from ..identity.spawner_token import SpawnerTokenError, resolve_spawner_token
from ..usage import UsageSource
from .configfile import DbUrlFileError, ledger_url, load_config_file
from .common.context import ServiceContext
from ..takeback.cull import Culler
from .heap import keep_start_up_heap
from .common.hubapi import GroupCache, HubClient
from .jobs import JobRunner
from .jobs.accounting import DebitJob, ReplenishJob
from .jobs.cull import CullJob, ServerUtilization
from .jobs.gpuuse import GPU_USE_INTERVAL, GpuUseJob
from .jobs.node_refresh import InventoryRefreshJob
from ..usage.utilization import PrometheusUtilization, ReportedUtilization
from .jobs.idle import IdleJob
from .jobs.queue import QueueJob
from .jobs.reclaim import ReclaimExecutor
from .jobs.reconcile import DebitAfterReconcile, ReconcileJob
from .core.jobs_lease import JobsLease
from ..lifetime import STOP_DEADLINE, exit_with_parent, listen_sockets, on_stop_signals
from .core.errors import Refused
from .core.manager import PoolManager
from .core.pool_inventory import PoolInventory
from .common.metrics import ServiceMetrics
from .usage import UsageConfigError, make_usage_source
from .api.openapi import warm_up
from .webapp import MAX_BODY_SIZE, make_app

log = logging.getLogger("gpupool")

#: seconds between checkpoints of the SQLite ledger's write-ahead log (a few hundred pages each)
CHECKPOINT_INTERVAL = 5.0


class GPUPoolService(*(e.service_settings for e in engines() if e.service_settings), Application):  # type: ignore[misc]
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

    subcommands = {  # type: ignore[assignment]
        "upgrade-db": ("gpupool_hub.service.app.UpgradeDB",
                       "Upgrade the ledger database to this release's schema (an SQLite file is backed up first)."),
    }

    config_file = Unicode(
        "jupyterhub_config.py",
        help="""The hub's configuration file, read for c.GPUPool and c.GPUPoolService settings.

        The example configuration passes the hub's own file (its ``-f``) as
        ``--config``, found by ``gpupool_hub.service.configfile.hub_config_file``,
        so a file that ``load_subconfig``s the example is the one read.
        Env ``GPUPOOL_CONFIG_FILE`` overrides it.""",
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

    spawner_token = Unicode(
        help="""The secret the hub's spawner sends to this service (at least 16 characters). Not a
        hub token, and never the service's api_token: a user who learnt one must not hold the
        other. The spawner reads the same setting from the same file. Empty (default): the
        secret in spawner_token_file.""",
    ).tag(config=True)
    spawner_token_file = Unicode(
        help="""File holding the spawner's secret when spawner_token is empty (an absolute path;
        the example configuration puts it next to itself). Created with a random secret, mode
        0600, if missing; refused if other users may read it. If the service runs as a Unix user
        of its own, let that user read it (group-readable is fine). With neither set, the
        service does not start if the same file configures a gpupool spawner.""",
    ).tag(config=True)

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
        ["gpupool", "agent", "dcgm", "custom", *(e.name for e in engines() if e.usage is not None)], "gpupool",
        help="""Where usage comes from: with prometheus_url, this service's allocation gauge ('gpupool'), the
        node agent, the DCGM exporter or usage_query; or an engine's own accounting, by its name ('slurm':
        Slurm accounting, ``sacct``, with c.GPUPool.slurm_gpu_models and c.GPUPool.slurm_conf), Prometheus
        or not. See docs/usage-sources.md.""",
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

    db_write_timeout = Float(
        5, help="""Seconds a write (a grant, an allocation, a debit) waits for the ledger database
        while another writer holds it; then the API answers 503 with Retry-After. Reads never wait.""",
    ).tag(config=True)

    upgrade_db = Bool(
        False, help="""Upgrade the ledger database's schema when it is older than this release's, at start
        (an SQLite file is copied next to itself first, as ``gpupool-service upgrade-db`` does). By default
        the service refuses to start on an older schema and says to run ``gpupool-service upgrade-db``:
        opening the ledger never changes it unasked (docs/ledger.md, Upgrading).""",
    ).tag(config=True)

    queue_interval = Float(
        5, help="Seconds between wait-queue checks (entries whose spawner stopped asking; dispatch).",
    ).tag(config=True)

    idle_interval = Float(60, help="Seconds between idle reclaim runs (settings in c.GPUPool.idle_*).").tag(config=True)
    utilization_metric = Unicode(
        "gpupool_agent_gpu_utilization_ratio",
        help="""Prometheus metric of GPU utilization per GPU for idle reclaim; e.g. DCGM_FI_DEV_GPU_UTIL
        (with utilization_uuid_label = "UUID" and utilization_scale = 100). Without prometheus_url the
        node agents' reports to PUT nodes/{node}/utilization are used.""",
    ).tag(config=True)
    utilization_uuid_label = Unicode("gpu_uuid", help="Label of utilization_metric holding the GPU UUID.").tag(
        config=True)
    utilization_scale = Float(1, help="What utilization_metric reads for a fully busy GPU (1, or 100 for DCGM).").tag(
        config=True)
    memory_used_query = Unicode(
        "gpupool_agent_gpu_memory_used_bytes",
        help="""PromQL giving GPU memory in use, in bytes, by utilization_uuid_label (shown in the lab widget);
        for DCGM: 'DCGM_FI_DEV_FB_USED * 1048576'. Empty: not shown.""",
    ).tag(config=True)
    memory_total_query = Unicode(
        "gpupool_agent_gpu_memory_total_bytes",
        help="""PromQL giving each GPU's total memory in bytes, by utilization_uuid_label; for DCGM:
        '(DCGM_FI_DEV_FB_USED + DCGM_FI_DEV_FB_FREE) * 1048576'. Empty: not shown.""",
    ).tag(config=True)

    run_jobs = Bool(True, help="Run the scheduled jobs (turn off for a read-only replica or some tests).").tag(config=True)

    jobs_lease_ttl = Float(
        30.0,
        help="""Seconds a service's claim on the periodic jobs lasts without renewal (renewed every third of it).

        Of several services on one ledger only the lease holder debits, culls, reconciles and
        dispatches the queue; another takes over when the holder stops, at once when the holder
        was a process of the same host that died, else once its lease expired.""",
    ).tag(config=True)

    exit_with_hub = Bool(
        True,
        help="""Exit when the hub that started this service exits, even by kill -9 (Linux:
        PR_SET_PDEATHSIG, and a check of the parent PID every second). Only for a hub-managed
        service (JUPYTERHUB_SERVICE_NAME set); an external service is never stopped this way.""",
    ).tag(config=True)

    @catch_config_error
    def initialize(self, argv: list[str] | None = None) -> None:
        super().initialize(argv)
        if self.subapp is not None:  # upgrade-db: main() runs it, and nothing of the service
            return
        load_config_file(self)
        profiles = self._check_profiles()
        self.spawner_secret = self._spawner_secret()
        self.settings_ = GPUPool(parent=self)
        self.engines = in_use(self.config, self.settings_.inventory, self.usage_preset)
        self.settings_.account_rule()  # the spawners' account rule: a bad range stops the start, naming it
        for engine in self.engines:  # what its configuration alone says (before the ledger opens)
            for check in engine.config_checks:
                check(self, profiles)
        try:
            db_url = ledger_url(self.settings_)
        except DbUrlFileError as e:
            self.log.critical("%s", e)
            raise SystemExit(f"gpupool: {e}") from None
        # writes leave the WAL's checkpoints to the "checkpoint" job (a reader thread; see ledger/engine.py)
        try:
            self.ledger = Ledger(db_url, busy_timeout=self.db_write_timeout, background_checkpoints=True,
                                 upgrade=self.upgrade_db)
        except LedgerError as e:  # an older schema, one newer than this code, another upgrade running
            self.log.critical("%s", e)
            raise SystemExit(f"gpupool: {e}") from None
        self.inventory_source = make_inventory_source(self.settings_)
        self.manager = PoolManager(
            settings=self.settings_, ledger=self.ledger, pool=make_pool(self.settings_, self.inventory_source),
            usage_source=self.make_usage_source(),
            debit_interval=self.debit_interval, debit_delay_tolerance=self.debit_delay_tolerance,
            source=self.inventory_source,
        )
        for engine in self.engines:  # what each engine in use needs of its cluster (a Slurm cluster's shards, say)
            for check in engine.start_checks:
                check(self, profiles)
        restored = self.manager.restore()
        teams = self.settings_.team_table()
        owed = max((q.total for q in teams.quotas.values()), default=0) // 1000 if teams.enabled else None
        self.manager.inventory.expect_profiles(profiles, owed)
        warn_unfit_profiles(self.manager.inventory, profiles)
        if self.inventory_source.dynamic:  # before the first request: nodes down, GPUs held outside the hub
            self.manager.inventory.apply_node_status(self.inventory_source.node_status())
        self.log.info("gpupool %s: %d node(s), %d allocation(s) restored, ledger %s",
                      __version__, len(self.manager.pool.nodes), restored, self.ledger.db.engine.url.render_as_string())
        self.metrics = ServiceMetrics(self.manager)
        self.hub = HubClient(self.hub_api_url, self.api_token)
        self.groups = GroupCache(self.hub)
        self.culler = Culler(parent=self)
        if not self.culler.hub_public_url:
            hub_cfg = self.config.get("JupyterHub", {})
            self.culler.hub_public_url = hub_cfg.get("bind_url") or (
                f"http://{hub_cfg.get('ip') or '127.0.0.1'}:{hub_cfg.get('port', 8000)}")
        m = self.manager
        self.lease = JobsLease(self.ledger, self.jobs_lease_ttl, threads=m.threads)
        self.jobs = JobRunner(self.metrics, self.lease)
        self.server: HTTPServer | None = None
        self.reconciler = ReconcileJob(self.hub, m.records, m.admission, self.reconcile_grace,
                                       engine_work=engine_work(self.engines, self))
        self.reclaimer = ReclaimExecutor(self.hub, m.reclaims)
        m.reclaims.announce_to(self.reclaimer.schedule)
        m.debits.report_to(self.metrics.count_charges)
        self.utilization = (PrometheusUtilization(self.prometheus_url, self.utilization_metric,
                                                  self.utilization_uuid_label, self.utilization_scale,
                                                  self.prometheus_token,
                                                  threshold=self.settings_.idle_threshold,
                                                  memory_used_query=self.memory_used_query,
                                                  memory_total_query=self.memory_total_query)
                            if self.prometheus_url else ReportedUtilization(self.settings_.idle_threshold))
        self.context = self.make_context()

    def _check_profiles(self) -> list[Profile]:
        """The hub only validates spawner profiles at the first spawn; the service,
        reading the same file at start-up, reports a bad profile at once. The
        profiles are the request shapes placement keeps room for."""
        profiles = self.config.get("GPUPoolSpawner", {}).get("profiles")
        if profiles is None:
            return []
        try:
            return parse_profiles(profiles)
        except Exception as e:
            self.log.critical("Invalid spawner profiles in %s: %s", self.config_file, e)
            raise SystemExit(f"gpupool: invalid c.GPUPoolSpawner.profiles: {e}") from None

    def _spawner_secret(self) -> str:
        """The spawner's secret (``gpupool_hub/identity/spawner_token.py``); a setting that cannot work stops the
        service here, with what to set, rather than refusing every spawn later."""
        try:
            secret = resolve_spawner_token(self.spawner_token, self.spawner_token_file)
        except SpawnerTokenError as e:
            self.log.critical("%s", e)
            raise SystemExit(f"gpupool: {e}") from None
        # the spawner's own setting, if the file sets one (an old configuration passed the service's token)
        spawner_side = self.config.get("GPUPoolSpawner", {}).get("gpupool_api_token")
        problem = None
        if self.api_token and self.api_token in (secret, spawner_side):
            problem = ("the spawner's token is the service's own hub api_token (one token for both, as older "
                       "configurations had it): give the spawner a secret of its own: remove "
                       "c.GPUPoolSpawner.gpupool_api_token and let both use c.GPUPoolService.spawner_token "
                       "or spawner_token_file")
        elif isinstance(spawner_side, str) and spawner_side and spawner_side != secret:
            problem = ("c.GPUPoolSpawner.gpupool_api_token differs from the service's spawner token: "
                       "set only c.GPUPoolService.spawner_token (or spawner_token_file), which both read")
        if not secret and self._configures_gpupool_spawner():
            problem = ("no token for the hub's spawner: set c.GPUPoolService.spawner_token_file (a file only the "
                       "hub's user may read, created if missing) or c.GPUPoolService.spawner_token; the spawner "
                       "no longer uses the service's api_token")
        if problem:
            self.log.critical("%s (docs/spawner.md, 'Tokens')", problem)
            raise SystemExit(f"gpupool: {problem}")
        if not secret:
            self.log.warning("No spawner token (c.GPUPoolService.spawner_token or spawner_token_file): "
                             "no spawner can allocate GPUs from this service")
        return secret

    def _configures_gpupool_spawner(self) -> bool:
        """Whether the configuration runs the hub with a gpupool spawner (then it needs the spawner token)."""
        spawner_class = self.config.get("JupyterHub", {}).get("spawner_class", "")
        name = spawner_class if isinstance(spawner_class, str) else getattr(spawner_class, "__module__", "")
        return "gpupool" in name or any(section.startswith("GPUPool") and section.endswith("Spawner")
                                        for section in self.config)

    def make_usage_source(self) -> UsageSource:
        """The debit job's usage source; a setting that cannot work stops the service here."""
        try:
            return make_usage_source(self, self.settings_, self.ledger)
        except UsageConfigError as e:
            self.log.critical("%s", e)
            raise SystemExit(f"gpupool: {e}") from None

    def make_context(self) -> ServiceContext:
        access = {f"access:services!service={os.environ.get('JUPYTERHUB_SERVICE_NAME', 'gpupool')}", "access:services"}
        return ServiceContext(
            manager=self.manager, hub_auth=HubAuth(api_token=self.api_token, api_url=self.hub_api_url, cache_max_age=60),
            hub=self.hub, metrics=self.metrics, prefix=self.prefix, spawner_token=self.spawner_secret,
            admin_scope=self.admin_scope, access_scopes=access, max_grant=self.max_grant,
            agent_tokens=dict(self.agent_tokens), agent_dry_run=self.agent_dry_run,
            groups=self.groups, reconcile_report=self.reconciler.report, page_auth=self.make_page_auth(),
            utilization=self.utilization if isinstance(self.utilization, ReportedUtilization) else None,
        )

    def make_page_auth(self) -> HubOAuth | None:
        """The pages' OAuth client. The hub gives a managed service with a URL an OAuth
        client and passes its id (``JUPYTERHUB_CLIENT_ID``); without one the pages are off."""
        if not os.environ.get("JUPYTERHUB_CLIENT_ID"):
            self.log.warning("No JUPYTERHUB_CLIENT_ID from the hub: the gpupool pages are off (the API works)")
            return None
        return HubOAuth(api_token=self.api_token, api_url=self.hub_api_url, base_url=self.prefix, cache_max_age=60)

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

    async def start_jobs(self) -> None:
        m, jobs = self.manager, self.jobs
        await self.lease.renew.off_loop()  # before the first run: is it ours to run the jobs?
        jobs.every(self.jobs_lease_ttl / 3, "lease", self.lease.renew.off_loop, leased=False)
        jobs.every(CHECKPOINT_INTERVAL, "checkpoint", m.records.checkpoint.off_loop, leased=False)
        jobs.every(self.replenish_interval, "replenish", ReplenishJob(self.hub, self.groups, m.accounts))
        # an interval is charged once the servers were reconciled after it closed (jobs/reconcile.py)
        debit = DebitAfterReconcile(self.reconciler, DebitJob(m.debits, jobs.in_thread), m.debits)
        jobs.every(self.debit_check_interval, "debit", debit)
        jobs.every(self.reconcile_interval, "reconcile", self.reconciler)
        jobs.every(self.queue_interval, "queue", QueueJob(m.queue))
        if m.settings.idle_reclaim:
            jobs.every(self.idle_interval, "idle", IdleJob(
                self.hub, self.utilization, settings=m.settings, records=m.records, idle=m.idle,
                queue=m.queue, admission=m.admission, enforcement=m.enforcement, notices=m.notices, cache=m.cache))
        # each minute's GPU use, for "My GPU usage" and the admins' idle GPU-hours (once per minute)
        jobs.every(GPU_USE_INTERVAL / 3, "gpu-use", GpuUseJob(self.utilization, records=m.records, log=m.gpu_use,
                                                              settings=m.settings, interval=GPU_USE_INTERVAL,
                                                              on_recorded=self.metrics.count_gpu_use))
        if self.inventory_source.dynamic:
            jobs.every(self.inventory_source.refresh_interval, "inventory",  # this service's own pool view
                       InventoryRefreshJob(self.inventory_source, m.inventory, jobs.in_thread, m.rebinds, m.ledger),
                       leased=False)
        if self.culler.enabled:
            probe = ServerUtilization(self.culler, self.utilization)
            jobs.every(self.culler.interval, "cull", CullJob(
                self.hub, self.culler, self.groups, probe, settings=m.settings, records=m.records,
                inventory=m.inventory, queue=m.queue, admission=m.admission, debits=m.debits,
                enforcement=m.enforcement, notices=m.notices, cache=m.cache))

    def start(self) -> None:
        self.reclaimer.loop = IOLoop.current()  # reclaims are announced from the writer thread
        on_stop_signals(self.stop)
        if self.exit_with_hub and os.environ.get("JUPYTERHUB_SERVICE_NAME"):
            exit_with_parent(self.stop)
        app = make_app(self.context, log_function=self._log_request)
        self.server = HTTPServer(app, xheaders=True, max_body_size=MAX_BODY_SIZE)
        self.server.add_sockets(listen_sockets(self.port, self.ip, self.config_file))
        self.log.info("gpupool service listening on http://%s:%d%s (pid %d)", self.ip, self.port, self.prefix,
                      os.getpid())
        # request bodies' validators, whose import is slow, are built while the service already answers
        threading.Thread(target=warm_up, name="gpupool-schema", daemon=True).start()
        if self.run_jobs:
            IOLoop.current().add_callback(self.start_jobs)
        IOLoop.current().start()

    def stop(self, why: str) -> None:
        """Stop taking requests and starting jobs, give the jobs lease up, end the IOLoop
        (``lifetime.on_stop_signals`` guarantees the exit within its deadline)."""
        self.log.warning("gpupool service stopping: %s", why)
        if self.server is not None:
            self.server.stop()
        self.jobs.stop()
        IOLoop.current().add_callback(self._release_and_end)

    async def _release_and_end(self) -> None:
        try:
            await asyncio.wait_for(self.lease.release.off_loop(), STOP_DEADLINE / 2)
        except Exception as e:  # it expires by itself
            self.log.warning("gpupool: jobs lease not released (%s); it expires in %.0f s", e, self.jobs_lease_ttl)
        IOLoop.current().stop()

def engine_work(used: list[Engine], service: GPUPoolService) -> Callable[[], Awaitable[set[str]]] | None:
    """How reconcile asks the engine in use which servers' work still runs (``Engine.work_alive``), if
    any engine can say."""
    for engine in used:
        if engine.work_alive is not None and (alive := engine.work_alive(service)) is not None:
            return alive
    return None


def warn_unfit_profiles(inventory: PoolInventory, profiles: list[Profile]) -> list[str]:
    """One WARNING at start naming the GPU profiles no node of the pool could ever take (8 CPUs and
    32 GB where the nodes have fewer): a user picking one would wait or be refused. Their names."""
    unfit = []
    for p in profiles:
        if not p.needs_gpu or p.mig:
            continue
        try:
            models = inventory.resolve_models(p.models) if p.models else frozenset(inventory.models())
        except Refused:
            continue  # a model this pool lacks: the refusal says so at the spawn
        if not models:
            continue  # no GPU node yet (inventory "agents" before the first report)
        body = p.request()
        request = Request(cpu_milli=body.get("cpu_milli", 0), memory_mib=body.get("memory_mib", 0),
                          gpus=0 if p.gpu_milli else p.gpus, gpu_milli=p.gpu_milli, models=models)
        if not inventory.pool.could_ever_fit(request):
            unfit.append(f"{p.slug!r} ({request.describe()})")
    if unfit:
        log.warning("gpupool: no node of the pool can ever take profile(s) %s: their GPUs, CPUs or memory are "
                    "more than any node has; change them in c.GPUPoolSpawner.profiles", ", ".join(unfit))
    return unfit


class UpgradeDB(Application):
    """``gpupool-service upgrade-db``: what the service does to the ledger at start, on request,
    with a backup first (see docs/ledger.md, Upgrading)."""

    name = "gpupool-service upgrade-db"
    version = __version__
    description = """Upgrade the ledger database to this release's schema and exit. An SQLite file is
    copied next to itself first (<file>.<date-time>.bak); back a PostgreSQL database up with pg_dump
    before. The service does the same upgrade, without the copy, when it starts."""
    classes = [GPUPool]  # type: ignore[assignment]
    aliases = {"config": "UpgradeDB.config_file", "f": "UpgradeDB.config_file"}  # type: ignore[assignment]
    config_file = Unicode("jupyterhub_config.py", help="The hub's configuration file (c.GPUPool.db_url).").tag(
        config=True)

    def start(self) -> None:
        load_config_file(self)
        try:
            done = upgrade_database(ledger_url(GPUPool(parent=self)))
        except (DbUrlFileError, LedgerError) as e:
            raise SystemExit(f"gpupool: {e}") from None
        print("\n".join(done) or "The ledger is at this release's schema already.")


def main(argv: list[str] | None = None) -> None:
    # The ledger (SQLite files) and anything else the service creates is for the service
    # alone: users' servers must not read other users' balances from the database file.
    os.umask(0o077)
    logging.basicConfig(level=logging.INFO, format="[%(levelname)1.1s %(asctime)s %(name)s] %(message)s")
    app = GPUPoolService.instance()
    app.initialize(argv)
    if app.subapp is not None:
        app.subapp.start()
        return
    # what start-up built lives as long as the process: no full collection walks it again
    log.debug("%d start-up objects kept out of the collector's full passes", keep_start_up_heap())
    app.start()
    log.info("gpupool service stopped")
    # Work still queued on the core's threads is abandoned: each write is one transaction,
    # and a half-done job is redone by the next service. Do not wait for those threads.
    logging.shutdown()
    os._exit(0)
