"""``gpupool-agent``: one per GPU node; discovers, attributes, exports, enforces.

Each tick (``interval`` seconds):

1. snapshot: GPUs and their processes from NVML, owners from psutil;
2. export: the snapshot becomes the ``/metrics`` series (served in a thread,
   so a slow tick never delays a scrape);
3. report: the node's inventory goes to the service (``PUT nodes/{node}/inventory``)
   when it changed or every ``inventory_interval`` seconds;
4. pull: ``GET nodes/{node}/enforce`` names the users whose GPU processes
   must stop, and says when the service has no inventory of this node (it
   restarted): the agent then reports at once. Each call is also this node's
   sign of life (with ``c.GPUPool.inventory = "agents"`` a silent node takes no
   new placements);
5. enforce: see :mod:`.enforce`;
6. shares (:mod:`.shares`): ``GET nodes/{node}/memory`` names the shares of GPUs
   on this node and their class; ``mps`` shares are capped through each GPU's
   MPS control daemon (:mod:`.mps`); users over their share's memory are warned
   through ``PUT nodes/{node}/memory`` and, after ``memory_grace``, their biggest
   processes there are stopped (:mod:`.memguard`). While the node holds shares
   the guard also looks every ``memory_interval`` seconds between ticks;
7. boundary guard: ``GET nodes/{node}/boundary`` names who holds each GPU of
   this node; a GPU process whose owner holds nothing there (kernels of
   running servers included) is warned about through ``PUT nodes/{node}/boundary``
   and, after ``boundary_grace``, stopped (see :mod:`.boundary`);
8. utilization: each GPU's utilization and memory go to
   ``PUT nodes/{node}/utilization`` (idle reclaim and the lab widget when the
   service has no Prometheus; a service that reads Prometheus answers 409 and
   is not asked again until the agent restarts).

The service being down never stops 1-2: the node keeps exporting usage (which
is what bills users), and while the service cannot be asked the agent enforces
nothing: it never acts on a stale list, since a user may have been topped up
in the meantime.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import socket
import time
import uuid
from typing import Any

from traitlets import Any as AnyTrait
from traitlets import Bool, Dict, Float, Integer, TraitError, Unicode, default, validate
from traitlets.config import Application, catch_config_error

from .. import __version__
from ..identity.unix import ordinary_uid_range
from .activity import AttributionHealth
from .attribution import Snapshot, take_snapshot
from .boundary import BoundaryGuard
from .client import ServiceClient
from .enforce import Enforcer
from .errors import AgentServiceError
from .lifecycle import ANOTHER_AGENT_EXIT, AgentLifecycle
from .memguard import MemoryGuard
from .metrics import AgentMetrics
from .nvml import GpuInfo, build_inventory, default_nvml, discover_links, list_gpus
from .results import TickResult
from .scrape import open_endpoint
from .servers import RECORD_DIR, ServerRecords
from .shares import ShareSteps

log = logging.getLogger("gpupool.agent")


class GPUPoolAgent(Application):
    """The gpupool node agent: its settings and its tick. It builds and holds its collaborators:
    ``share_steps`` (:class:`.ShareSteps`, the memory guard and MPS caps) and ``lifecycle``
    (:class:`.AgentLifecycle`, the loop and the stop)."""

    name = "gpupool-agent"
    version = __version__
    description = ("GPU node agent for gpupool_hub: reports this node's GPUs to the gpupool service, exports "
                   "per-user GPU usage for Prometheus, and stops GPU processes of users the service names.")

    aliases = {  # type: ignore[assignment]
        "config": "GPUPoolAgent.config_file",
        "f": "GPUPoolAgent.config_file",
        "service-url": "GPUPoolAgent.service_url",
        "node": "GPUPoolAgent.node_name",
        "port": "GPUPoolAgent.metrics_port",
        "interval": "GPUPoolAgent.interval",
        "min-uid": "GPUPoolAgent.min_uid",
        "log-level": "Application.log_level",
    }
    flags = {  # type: ignore[assignment]
        "dry-run": ({"GPUPoolAgent": {"dry_run": True}}, "Only log what enforcement would stop."),
        "once": ({"GPUPoolAgent": {"once": True}},
                 "Run one tick, print its report as JSON and exit (no metrics server)."),
    }

    config_file = Unicode("", help="Python config file (c.GPUPoolAgent.…); empty: none.").tag(config=True)

    service_url = Unicode(
        help="Base URL of the gpupool service, e.g. http://hub:10101/services/gpupool/ (the agent adds "
             "api/v1/nodes/<node>/…). Default: $GPUPOOL_SERVICE_URL. Empty: run without a service "
             "(export metrics only, enforce nothing).",
    ).tag(config=True)

    @default("service_url")
    def _service_url(self) -> str:
        return os.environ.get("GPUPOOL_SERVICE_URL", "")

    token = Unicode(
        help="This node's token for the service (c.GPUPoolService.agent_tokens[node]). "
             "Default: $GPUPOOL_AGENT_TOKEN; prefer the environment over a config file.",
    ).tag(config=True)

    @default("token")
    def _token(self) -> str:
        return os.environ.get("GPUPOOL_AGENT_TOKEN", "")

    node_name = Unicode(help="Node name as the pool knows it (default: the short host name).").tag(config=True)

    @default("node_name")
    def _node_name(self) -> str:
        return socket.gethostname().split(".")[0]

    labels = Dict(help="Labels reported with the inventory (strings to strings), e.g. {'rack': 'r1'}.").tag(config=True)
    cpu_milli = Integer(0, help="CPU capacity to report, in milli-CPUs; 0: the CPUs this process may use.").tag(config=True)
    memory_mib = Integer(0, help="Memory to report, in MiB; 0: physical memory.").tag(config=True)

    metrics_port = Integer(9445, help="Port of the /metrics endpoint; 0 picks a free one.").tag(config=True)
    metrics_address = Unicode("127.0.0.1", help="Address the /metrics endpoint listens on (its series show every "
                              "user's GPU use); one other machines reach needs metrics_token_file.").tag(config=True)
    metrics_token_file = Unicode("", help="File (mode 600) holding the token a scrape must send as 'Authorization: "
                                 "Bearer' (Prometheus: authorization.credentials_file); others get 401.",
                                 ).tag(config=True)
    metrics_without_token = Bool(
        False, help="Serve /metrics on a loopback metrics_address without a token. Then every process on this "
                    "node can read every user's GPU use and processes: users' own servers and kernels too, when "
                    "they run here. Only for nodes where no user runs code. Default: a scrape needs the token of "
                    "metrics_token_file, and without one the agent does not start.",
    ).tag(config=True)
    metrics_min_uid = Integer(
        help="Processes of uids below this count as system processes in metrics, not as a user's usage "
             "(keeps e.g. Xorg's root out of billing with usage_preset='agent'). Default: UID_MIN of the "
             "node's /etc/login.defs, else 1000 (gpupool_hub.identity.unix.ordinary_uid_range).",
    ).tag(config=True)

    interval = Float(15.0, help="Seconds between ticks (snapshot, export, enforcement).").tag(config=True)
    inventory_interval = Float(
        300.0, help="Seconds between inventory reports when nothing changed (a change is reported at once).",
    ).tag(config=True)
    request_timeout = Float(10.0, help="Seconds before a call to the service counts as failed.").tag(config=True)

    dry_run = Bool(False, help="Only log what enforcement would stop; signal nothing.").tag(config=True)
    grace = Float(10.0, help="Seconds between SIGTERM and SIGKILL.").tag(config=True)
    min_uid = Integer(
        help="Never stop processes of uids below this (system accounts). Root (0) is never touched, "
             "whatever this says; the minimum is 1. Default: UID_MIN of the node's /etc/login.defs, else "
             "1000: the same range the hub's spawners require of the accounts that run servers "
             "(c.GPUPool.unix_uid_min).",
    ).tag(config=True)

    @default("min_uid")
    def _default_min_uid(self) -> int:
        return ordinary_uid_range()[0]

    @default("metrics_min_uid")
    def _default_metrics_min_uid(self) -> int:
        return ordinary_uid_range()[0]

    @validate("min_uid")
    def _check_min_uid(self, proposal: Any) -> int:
        if proposal["value"] < 1:
            raise TraitError("min_uid must be at least 1: the agent never touches root")
        return proposal["value"]

    boundary_guard = Bool(
        True, help="Stop GPU processes whose owner holds no allocation on that GPU (kernels of running servers "
                   "included), after a warning to the service and boundary_grace seconds (needs a service). "
                   "Root and accounts below min_uid are only reported. Turn off only on nodes shared with GPU "
                   "work the pool does not allocate.",
    ).tag(config=True)
    boundary_grace = Float(
        60.0, help="Seconds between a boundary warning reaching the service and its processes being stopped.",
    ).tag(config=True)

    memory_guard = Bool(
        True, help="Keep GPU shares to their memory: warn users over their share's limit, "
                   "then stop their biggest processes on that GPU (needs a service).",
    ).tag(config=True)
    memory_tolerance = Float(
        0.10, help="How far over its share a fraction may go: the limit is fraction x GPU memory x "
                   "(1 + memory_tolerance); 0.10 lets a 0.5 share of an 80 GB GPU hold 44 GB.",
    ).tag(config=True)
    memory_grace = Float(
        10.0, help="Seconds between the memory warning reaching the service (and the user's widget) and "
                   "the first process being stopped. With memory_interval, how long a neighbour's memory may "
                   "be taken: about memory_grace + 2 x memory_interval (16 s by default).",
    ).tag(config=True)
    memory_interval = Float(
        3.0, help="Seconds between the memory guard's looks while this node holds GPU shares (the full "
                  "tick, interval, may be longer).",
    ).tag(config=True)

    @validate("boundary_grace", "memory_tolerance", "memory_grace", "memory_interval")
    def _check_not_negative(self, proposal: Any) -> float:
        if proposal["value"] < 0:
            raise TraitError(f"{proposal['trait'].name} must not be negative")
        return proposal["value"]

    mps = Bool(
        True, help="Cap 'mps' shares through one NVIDIA MPS control daemon per GPU (started by the agent, "
                   "which must run as root). Off: mps shares are kept by the memory guard only.",
    ).tag(config=True)
    mps_control = Unicode(
        "nvidia-cuda-mps-control", help="The MPS control binary (a path, or a name looked up on PATH).",
    ).tag(config=True)
    mps_root = Unicode(
        "/run/gpupool-mps", help="Where each GPU's MPS pipe directory is (<mps_root>/<GPU UUID>/pipe); the "
                                 "same as c.GPUPoolSpawner.mps_root, which points servers there.",
    ).tag(config=True)

    once = Bool(False, help="Run one tick, print its report as JSON and exit.").tag(config=True)

    server_record_dir = Unicode(RECORD_DIR, help="Where gpupool-localprocess records the servers it starts here "
                                "(its server_record_dir): only their kernels are left to the hub.").tag(config=True)
    nvml = AnyTrait(None, help="The NVML module (pynvml); tests inject a fake. Not configurable.")

    # ------------------------------------------------------------------ setup

    @catch_config_error
    def initialize(self, argv: list[str] | None = None) -> None:
        super().initialize(argv)
        if self.config_file:
            if not os.path.exists(self.config_file):
                raise SystemExit(f"gpupool-agent: config file {self.config_file!r} not found")
            self.load_config_file(self.config_file)
            self.update_config(self.cli_config)  # command line wins over the file
        self.setup()

    def setup(self) -> None:
        """Objects the loop needs; callable without ``initialize`` (tests build agents directly)."""
        if self.nvml is None:
            try:
                self.nvml = default_nvml()
            except ImportError as e:
                raise SystemExit(f"gpupool-agent: pynvml is missing ({e}); install nvidia-ml-py") from None
        self.metrics = AgentMetrics(self.node_name, metrics_min_uid=self.metrics_min_uid)
        self.enforcer = Enforcer(min_uid=self.min_uid, grace=self.grace, dry_run=self.dry_run)
        self.memguard = MemoryGuard(self.enforcer, tolerance=self.memory_tolerance, grace=self.memory_grace)
        self.boundary = BoundaryGuard(self.enforcer, grace=self.boundary_grace)
        self._boundary_unreported: list[dict[str, Any]] = []  # stops the service has not recorded yet
        self.instance = f"{socket.gethostname()} pid {os.getpid()} {uuid.uuid4().hex[:8]}"
        self.client = (ServiceClient(self.service_url, self.node_name, self.token, self.request_timeout,
                                     instance=self.instance) if self.service_url else None)
        if self.client is not None and not self.token:
            self.log.warning("No agent token (set GPUPOOL_AGENT_TOKEN): the service will refuse this agent")
        self._nvml_open = False
        self._inventory: dict[str, Any] | None = None
        self._gpu_key: Any = None
        self._reported: tuple[float, str] | None = None  # (when, json) of the last accepted report
        self._report_utilization = True  # until the service says it reads Prometheus (409)
        self._samples_seen: dict[str, int] = {}  # per GPU: the newest per-process sample read
        self.servers = ServerRecords(self.server_record_dir)  # which kernels are a running server's
        self.health = AttributionHealth()
        self._attribution_sent: str | None = None  # the last attribution report the service accepted
        self.share_steps = ShareSteps(
            self.client, self.metrics, self.memguard, self.guard_sample, log=self.log, enabled=self.memory_guard,
            mps=self.mps, mps_control=self.mps_control, mps_root=self.mps_root, dry_run=self.dry_run)
        self.lifecycle = AgentLifecycle(self.tick, self.share_steps, self.client, self._close_nvml,
                                        node_name=self.node_name, request_timeout=self.request_timeout, log=self.log)

    # ------------------------------------------------------------------ running

    def start(self) -> None:
        if self.once:
            result = asyncio.run(self.tick())
            self._close_nvml()
            print(json.dumps(result.as_dict(), indent=2, default=str))
            if not result.nvml_ok:
                raise SystemExit(1)
            return
        server = open_endpoint(self.metrics.registry, self.metrics_port, self.metrics_address, self.metrics_token_file,
                               self.metrics_without_token)
        self.log.info("gpupool-agent %s on node %s: metrics on http://%s:%d/metrics%s, service %s%s", __version__,
                      self.node_name, self.metrics_address, server.server_port, self.metrics_token_file and " (token)",
                      self.service_url or "(none: metrics only)", ", DRY RUN" if self.dry_run else "")
        status = self.lifecycle.serve(self.interval, self.memory_interval)
        server.shutdown()
        if status:
            raise SystemExit(status)

    async def run(self) -> None:
        """Tick until :meth:`stop` (see :meth:`.AgentLifecycle.run`)."""
        await self.lifecycle.run(self.interval, self.memory_interval)

    def stop(self) -> None:
        self.lifecycle.stop()

    @property
    def exit_status(self) -> int:
        """Non-zero: why the agent stopped by itself (the lifecycle's)."""
        return self.lifecycle.exit_status

    # ------------------------------------------------------------------ steps

    def _open_nvml(self) -> None:
        if not self._nvml_open:
            self.nvml.nvmlInit()
            self._nvml_open = True

    def _close_nvml(self) -> None:
        if self._nvml_open:
            self._nvml_open = False
            try:
                self.nvml.nvmlShutdown()
            except Exception as e:
                self.log.debug("nvmlShutdown: %s", e)

    def sample(self) -> tuple[list[GpuInfo], dict[str, Any], Snapshot]:
        """NVML part of a tick (blocking; runs in a thread). Re-initialises NVML after a failure."""
        try:
            self._open_nvml()
            gpus = list_gpus(self.nvml)
            key = [(g.index, g.uuid, g.model, g.memory_mib, [(m.uuid, m.profile) for m in g.mig]) for g in gpus]
            if self._inventory is None or key != self._gpu_key:
                # Links are only needed for the inventory, and only change with the hardware.
                self._inventory = build_inventory(
                    self.node_name, gpus, discover_links(self.nvml, gpus), cpu_milli=self.cpu_milli or None,
                    memory_mib=self.memory_mib or None, labels=self.labels)
                self._gpu_key = key
            snapshot = take_snapshot(self.nvml, gpus, self._samples_seen, self.servers)
            self.health.update(snapshot.gpus)
            return gpus, self._inventory, snapshot
        except Exception:
            self._close_nvml()
            raise

    def guard_sample(self) -> Snapshot:
        """Memory and processes now, for the memory guard's looks between ticks; the
        per-process utilization windows stay the full tick's."""
        self._open_nvml()
        return take_snapshot(self.nvml, list_gpus(self.nvml), dict(self._samples_seen))

    async def tick(self) -> TickResult:
        """One pass of the loop; never raises (each failure is logged, counted and reported)."""
        result = TickResult()
        loop = asyncio.get_running_loop()
        try:
            _gpus, result.inventory, result.snapshot = await loop.run_in_executor(None, self.sample)
            result.nvml_ok = True
        except Exception as e:
            result.nvml_error = f"{type(e).__name__}: {e}"
            self.log.error("GPU discovery failed (no usage exported until it works again): %s", result.nvml_error)
            self.metrics.loop_errors.labels("nvml").inc()
        self.metrics.nvml_up.set(1 if result.nvml_ok else 0)
        self.metrics.update(result.snapshot)

        if self.client is None:
            return result
        try:
            if result.inventory is not None:
                result.inventory_reported = await self._maybe_report(result.inventory)
            result.enforce = await self.client.enforcement()
            if result.enforce.report_inventory and result.inventory is not None and not result.inventory_reported:
                self._reported = None  # the service lost it: whatever was sent before
                result.inventory_reported = await self._maybe_report(result.inventory)
            result.service_ok = True
        except AgentServiceError as e:
            result.service_ok, result.service_error = False, str(e)
            if e.another_agent:
                self.log.error("Stopping: %s", e)
                self.lifecycle.stop(ANOTHER_AGENT_EXIT)
                return result
            self.log.warning("gpupool service unavailable, enforcing nothing this tick: %s", e)
            self.metrics.loop_errors.labels("service").inc()
        self.metrics.service_up.set(1 if result.service_ok else 0)
        if result.enforce is not None:
            self.metrics.enforcement_users.set(len(result.enforce.users))
        if result.enforce is not None and result.snapshot is not None and (
                result.enforce.users or result.enforce.allowed):
            enforce = result.enforce
            try:
                result.actions = await loop.run_in_executor(
                    None, lambda: self.enforcer.enforce(result.snapshot, enforce.users, enforce.kernels,
                                                        dry_run=enforce.dry_run)
                    + self.enforcer.enforce_stray(result.snapshot, enforce.allowed, dry_run=enforce.dry_run))
            except Exception:
                self.log.exception("Enforcement failed")
                self.metrics.loop_errors.labels("enforce").inc()
            for a in result.actions:
                self.metrics.enforcement_actions.labels(a.user, a.action).inc()
        if self.memory_guard and result.service_ok and result.snapshot is not None:
            await self.share_steps.guard_memory(result)
        if self.boundary_guard and result.service_ok and result.snapshot is not None:
            await self._guard_boundary(result)
        if result.service_ok and result.snapshot is not None:
            await self._send_attribution(result.snapshot, result.inventory_reported)
            if self._report_utilization:
                await self._send_utilization(result.snapshot)
        return result

    async def _send_attribution(self, snapshot: Snapshot, again: bool) -> None:
        """What the agent cannot attribute, when it changed (or the inventory was just sent:
        the service may have restarted)."""
        text = json.dumps({g.uuid: g.why_not() for g in snapshot.gpus}, sort_keys=True)
        if text == self._attribution_sent and not again:
            return
        try:
            await self.client.report_attribution(snapshot)  # type: ignore[union-attr]
            self._attribution_sent = text
        except AgentServiceError as e:
            self.log.warning("Could not report which GPUs cannot be attributed: %s", e)
            self.metrics.loop_errors.labels("attribution").inc()

    async def _guard_boundary(self, result: TickResult) -> None:
        """Warn, report, stop what is due; nothing is stopped unless its warning reached the service."""
        snapshot = result.snapshot
        assert snapshot is not None and self.client is not None
        try:
            holders, dry = await self.client.gpu_holders()
            now = time.time()
            result.boundary_warnings = self.boundary.observe(snapshot, holders, now)
            done = await asyncio.get_running_loop().run_in_executor(
                None, lambda: self.boundary.enforce(snapshot, now, dry_run=dry))
            result.boundary_actions = [a for _w, a in done]
            self._boundary_unreported += [{"user": a.user, "gpu_uuid": w.found.gpu_uuid, "pid": a.pid,
                                           "action": a.action, "detail": a.detail[:255]} for w, a in done]
            new = self.boundary.unreported()
            if new or self._boundary_unreported:
                await self.client.report_boundary({
                    "dry_run": dry or self.dry_run, "warnings": [w.as_dict(now + self.boundary.grace) for w in new[:1000]],
                    "actions": self._boundary_unreported[:1000]})
                self.boundary.accepted(new[:1000], now)
                del self._boundary_unreported[:1000]
        except AgentServiceError as e:
            self.log.warning("Boundary guard: service unavailable, stopping nothing this tick: %s", e)
            self.metrics.loop_errors.labels("boundary").inc()
        except Exception:
            self.log.exception("Boundary guard failed")
            self.metrics.loop_errors.labels("boundary").inc()
        for a in result.boundary_actions:
            self.metrics.enforcement_actions.labels(a.user, a.action).inc()

    async def _send_utilization(self, snapshot: Snapshot) -> None:
        try:
            await self.client.report_utilization(snapshot)  # type: ignore[union-attr]
        except AgentServiceError as e:
            if e.status == 409:
                self._report_utilization = False
                self.log.info("The service reads GPU utilization from Prometheus: not reporting it")
            else:
                self.log.warning("Could not report GPU utilization: %s", e)
                self.metrics.loop_errors.labels("utilization").inc()

    async def _maybe_report(self, inventory: dict[str, Any]) -> bool:
        text = json.dumps(inventory, sort_keys=True)
        now = time.monotonic()
        if self._reported and self._reported[1] == text and now - self._reported[0] < self.inventory_interval:
            return False
        await self.client.report_inventory(inventory)  # type: ignore[union-attr]
        self._reported = (now, text)
        self.log.info("Reported inventory: %d GPU(s)", len(inventory["gpus"]))
        return True


def main(argv: list[str] | None = None) -> None:
    logging.basicConfig(level=logging.INFO, format="[%(levelname)1.1s %(asctime)s %(name)s] %(message)s")
    app = GPUPoolAgent.instance()
    app.initialize(argv)
    app.start()
