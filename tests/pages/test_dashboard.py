"""The Grafana dashboard ``dashboards/gpupool.json`` against a real Prometheus.

Prometheus scrapes, every second, the two real metrics endpoints the dashboard
is made for, as docs/admin-guide.md configures them:

* the service's ``{prefix}metrics`` (the real ``make_app`` over a real
  ``PoolManager``: balances, a negative one, allocations of two models, teams,
  scheduled job runs through the real ``JobRunner`` including a failure, API
  requests, and minutes charged by the real ``Debits`` and recorded by the real
  gpu-use job from agent reports: alice's GPUs 30 % busy, bob's share unknown),
  scraped with a bearer token and without ``honor_labels``;
* a node agent's ``/metrics`` (the real ``AgentMetrics`` with a snapshot: GPU
  utilisation and memory, a user's process, a system process).

Then every panel's PromQL, with Grafana's variables filled in as "All" does,
is run against it and must answer with data. Grafana itself is not needed:
what can break is the PromQL and the metric and label names it relies on.
"""

from __future__ import annotations

import asyncio
import json
import re
import shutil
import threading
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.fixtures.hub import wait_for
from tests.fixtures.manager import make_manager
from tests.fixtures.prometheus import PrometheusServer
from tests.fixtures.ports import free_port

pytestmark = pytest.mark.integration

DASHBOARD = Path(__file__).resolve().parents[2] / "dashboards" / "gpupool.json"
PREFIX = "/services/gpupool/"
SCRAPE_TOKEN = "prometheus-secret"
A100, T4 = "NVIDIA A100-SXM4-80GB", "Tesla T4"
NODES = [{"name": "gpu-a", "cpu_milli": 64000, "memory_mib": 262144, "gpus": {"count": 4, "model": A100}},
         {"name": "gpu-b", "cpu_milli": 64000, "memory_mib": 262144, "gpus": {"count": 4, "model": T4}}]
#: What Grafana puts in for its built-in variables, and for "All" of the dashboard's own.
#: minutes charged and recorded while Prometheus watches (one more before it starts)
MINUTES = 3
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "15s", "$__range": "1h",
                     "$user": ".*", "$model": ".*", "$node": ".*"}


def panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in dashboard["panels"]:
        out.extend(p.get("panels", []))
        if p["type"] != "row":
            out.append(p)
    return out


def promql(expr: str) -> str:
    for name in sorted(GRAFANA_VARIABLES, key=len, reverse=True):
        expr = expr.replace(name, GRAFANA_VARIABLES[name])
    assert "$" not in expr, f"unknown variable in {expr!r}"
    return expr


class ServiceThread:
    """The real service app (API, pages, /metrics) on its own event loop in a thread."""

    def __init__(self, tmp_path: Path) -> None:
        from gpupool_hub.service.core.admission import parse_request
        from gpupool_hub.service.common.context import ServiceContext
        from gpupool_hub.service.jobs import JobRunner
        from gpupool_hub.service.jobs.gpuuse import GpuUseJob
        from gpupool_hub.service.common.metrics import ServiceMetrics
        from gpupool_hub.usage.utilization import ReportedUtilization

        # charging runs on this clock, a minute at a time, from a few minutes ago
        self.now = datetime.now(timezone.utc).replace(second=0, microsecond=0) - timedelta(minutes=MINUTES + 1)
        m = make_manager(NODES, {"A100": 3, "T4": "0.5"}, f"sqlite:///{tmp_path / 'ledger.sqlite'}",
                         clock=lambda: self.now, debit_interval=60, epoch=self.now,
                         teams={"vision": {"gpus": 2}, "nlp": {"gpus": 4}}, default_team="nlp")
        held = {}
        for user, team, request in (("alice", "vision", {"gpus": 2, "models": ["A100"]}),
                                    ("bob", "nlp", {"gpu_fraction": 0.5, "models": ["T4"]})):
            held[user] = m.admission.admit(user, [team], "", parse_request(request), request["models"])
        m.accounts.ensure("carol")
        m.accounts.grant("carol", Decimal(-150), "overdrawn", "admin", "neg")
        self.metrics = ServiceMetrics(m)
        m.debits.report_to(self.metrics.count_charges)  # as the service wires them (app.py)
        self.debits = m.debits
        # alice's agent reports her two GPUs 30 % busy; bob's T4 is never reported: unknown
        self.utilization = ReportedUtilization(m.settings.idle_threshold)
        self.alice_gpus = [g["uuid"] for g in held["alice"].gpus]
        self.gpu_use = GpuUseJob(self.utilization, records=m.records, log=m.gpu_use, settings=m.settings,
                                 on_recorded=self.metrics.count_gpu_use)
        self.context = ServiceContext(manager=m, hub_auth=None, metrics=self.metrics, prefix=PREFIX,
                                      spawner_token=SCRAPE_TOKEN)
        self.runner = JobRunner(self.metrics)
        self.port = free_port()
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        assert self.ready.wait(10)

    def _run(self) -> None:
        from gpupool_hub.service.webapp import make_app

        asyncio.set_event_loop(self.loop)
        server = make_app(self.context).listen(self.port, address="127.0.0.1")
        self.ready.set()
        self.loop.run_forever()
        server.stop()

    def run_jobs(self, *, fail: str | None = None) -> None:
        """A round of scheduled job runs through the real JobRunner (``fail``: that one raises)."""
        async def ok() -> None:
            await asyncio.sleep(0.01)

        async def broken() -> None:
            raise RuntimeError("hub unreachable (test)")

        async def run() -> None:
            for name in ("debit", "replenish", "reconcile", "cull"):
                await self.runner.run_once(name, broken if name == fail else ok)

        asyncio.run_coroutine_threadsafe(run(), self.loop).result(10)

    def record_minute(self) -> None:
        """One more minute held: charged by the debit job, recorded by the gpu-use job."""
        self.now += timedelta(minutes=1)
        assert self.debits.debit_due() == 1
        self.utilization.report({uuid: 0.3 for uuid in self.alice_gpus}, datetime.now(timezone.utc))
        recorded = asyncio.run_coroutine_threadsafe(self.gpu_use(self.now), self.loop).result(10)
        assert recorded

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)
        self.runner.executor.shutdown(wait=False)


def agent_metrics() -> Any:
    from gpupool_hub.agent.attribution import GpuProcess, GpuStatus, Snapshot
    from gpupool_hub.agent.metrics import AgentMetrics

    metrics = AgentMetrics("gpu-a", metrics_min_uid=1000)
    gpus = [GpuStatus(i, f"GPU-a-{i}", A100, 80 << 30, (i + 1) << 30, 0.25 * i) for i in range(4)]
    processes = [GpuProcess(pid=4242, gpu_index=0, gpu_uuid="GPU-a-0", model=A100, memory_bytes=1 << 30,
                            uid=1001, user="alice"),
                 GpuProcess(pid=77, gpu_index=1, gpu_uuid="GPU-a-1", model=A100, memory_bytes=1 << 20,
                            uid=0, user="root")]
    metrics.update(Snapshot(taken_at=1.0, gpus=gpus, processes=processes))
    metrics.nvml_up.set(1)
    metrics.service_up.set(1)
    return metrics


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    binary = shutil.which("prometheus")
    if not binary:
        pytest.skip("prometheus not installed (Debian package 'prometheus')")
    tmp = tmp_path_factory.mktemp("dashboard")
    (tmp / "prom").mkdir()
    server = PrometheusServer(binary, tmp / "prom", free_port())
    service = ServiceThread(tmp)
    agent_server = agent_metrics().serve(0, "127.0.0.1")
    server.config.write_text(f"""
global:
  scrape_interval: 1s
  evaluation_interval: 1s
scrape_configs:
  - job_name: gpupool-hub
    metrics_path: {PREFIX}metrics
    authorization:
      credentials: {SCRAPE_TOKEN}
    static_configs:
      - targets: ["127.0.0.1:{service.port}"]
  - job_name: gpupool-agent
    static_configs:
      - targets: ["127.0.0.1:{agent_server.server_port}"]
""")
    try:
        service.run_jobs(fail="cull")  # every job has run once (so every job's series exists)
        service.record_minute()  # so every user's GPU-time series exists before the first scrape
        # a few API requests, so the latency histogram has series
        for _ in range(3):
            r = requests.get(f"http://127.0.0.1:{service.port}{PREFIX}api/v1/allocations",
                             headers={"Authorization": f"token {SCRAPE_TOKEN}"}, timeout=10)
            assert r.status_code == 200, r.text
        server.start()

        def scraped() -> bool:
            r = requests.get(f"{server.url}/api/v1/query", timeout=5,
                             params={"query": "min(count_over_time(up[1m])) >= 3 and min(up) == 1"}).json()
            return bool(r["data"]["result"])

        wait_for(scraped, 60, "three successful scrapes of the service and the agent")
        # jobs keep running while Prometheus watches: the counters move, one cull run fails again
        service.run_jobs(fail="cull")
        service.run_jobs()
        for _ in range(MINUTES - 1):  # GPU time goes on: the counters move while Prometheus watches
            service.record_minute()
        wait_for(lambda: query(server, 'increase(gpupool_job_failures_total{exported_job="cull"}[1m]) > 0'),
                 30, "the new cull failure to be scraped")
        wait_for(lambda: query(server, f'gpupool_gpu_held_seconds_total{{user="alice"}} >= {MINUTES * 120}'),
                 30, "the last recorded minute to be scraped")
        yield server
    finally:
        server.stop()
        agent_server.shutdown()
        service.stop()


def query(server: PrometheusServer, expr: str) -> list[dict[str, Any]]:
    r = requests.get(f"{server.url}/api/v1/query", params={"query": expr}, timeout=10)
    body = r.json()
    assert r.status_code == 200 and body["status"] == "success", f"{expr}: {body}"
    return body["data"]["result"]


def test_the_dashboard_is_an_importable_grafana_model():
    dashboard = json.loads(DASHBOARD.read_text())
    assert dashboard["uid"] and dashboard["title"] and dashboard["schemaVersion"] >= 36
    ids = [p["id"] for p in dashboard["panels"]]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    for p in panels(dashboard):
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert {"h", "w", "x", "y"} <= set(p["gridPos"]) and p["gridPos"]["x"] + p["gridPos"]["w"] <= 24
        assert p["targets"] and all(t["expr"] and t["refId"] for t in p["targets"]), p["title"]
        assert p.get("description"), f"{p['title']}: say what the panel shows"
    titles = " ".join(p["title"] for p in panels(dashboard)).lower()
    for topic in ("balances", "per model", "per gpu", "job", "tokens charged per user per day",
                  "busy % of held gpu time", "idle gpu-hours by user", "idle gpu-hours by team",
                  "waiting in the queue per model", "queue wait until placed"):
        assert topic in titles, topic


def test_every_panel_query_returns_data_from_a_real_prometheus(prometheus):
    dashboard = json.loads(DASHBOARD.read_text())
    empty, checked = [], 0
    for p in panels(dashboard):
        for target in p["targets"]:
            expr = promql(target["expr"])
            if not query(prometheus, expr):
                empty.append(f"{p['title']}: {expr}")
            checked += 1
    assert checked >= 15
    assert not empty, "panels without data:\n" + "\n".join(empty)


def test_the_variables_find_their_values(prometheus):
    dashboard = json.loads(DASHBOARD.read_text())
    found = {}
    for var in dashboard["templating"]["list"]:
        if var["type"] != "query":
            continue
        m = re.fullmatch(r"label_values\((\w+), (\w+)\)", var["query"]["query"])
        assert m, var["query"]
        r = requests.get(f"{prometheus.url}/api/v1/label/{m.group(2)}/values",
                         params={"match[]": m.group(1)}, timeout=10).json()
        found[var["name"]] = set(r["data"])
    assert found == {"user": {"alice", "bob", "carol"}, "model": {A100, T4}, "node": {"gpu-a"}}


def test_panels_show_the_right_numbers(prometheus):
    """A few panels checked against what the service and the agent know."""
    def value(expr: str, **labels: str) -> float:
        rows = query(prometheus, expr)
        [row] = [r for r in rows if all(r["metric"].get(k) == v for k, v in labels.items())]
        return float(row["value"][1])

    assert value("count(gpupool_balance_tokens < 0) or vector(0)") == 1  # carol
    assert value("sum by (model) (gpupool_allocated_gpus_by_model)", model=A100) == 2
    assert value("sum by (model) (gpupool_allocated_gpus_by_model)", model=T4) == 0.5
    assert value("sum(gpupool_allocated_gpus_by_model) / sum(gpupool_capacity_gpus)") == pytest.approx(2.5 / 8)
    assert value("sum by (team) (gpupool_team_quota_gpus)", team="vision") == 2
    assert value("gpupool_agent_gpu_utilization_ratio", index="2") == 0.5
    assert value("sum by (user) (gpupool_agent_user_gpu_active)", user="alice") == 1
    assert value("sum by (node, kind) (gpupool_agent_gpu_other_processes)", kind="system") == 1
    assert value("sum by (exported_job) (increase(gpupool_job_failures_total[1h]))", exported_job="cull") > 0
    assert value("sum by (exported_job) (increase(gpupool_job_failures_total[1h])) or "
                 "sum by (exported_job) (increase(gpupool_job_duration_seconds_count[1h])) * 0",
                 exported_job="debit") == 0


def test_gpu_time_panels_show_what_the_ledger_recorded(prometheus):
    """The panels of 'What the GPUs did' agree with the ledger's figures for the same minutes:
    the pages' "you paid ..., your GPUs were busy ..." and the admins' idle GPU-hours."""
    def values(expr: str, by: str) -> dict[str, float]:
        return {r["metric"].get(by, ""): float(r["value"][1]) for r in query(prometheus, expr)}

    dashboard = json.loads(DASHBOARD.read_text())
    exprs = {p["title"]: [promql(t["expr"]) for t in p["targets"]] for p in panels(dashboard)}
    # raw counters first: MINUTES minutes of 2 A100s (3 tokens/h each) and half a T4 (0.5 tokens/h)
    held = values("gpupool_gpu_held_seconds_total", "user")
    assert held == {"alice": MINUTES * 120, "bob": MINUTES * 30}
    charged = values("gpupool_tokens_charged_total", "user")
    assert charged == {"alice": pytest.approx(MINUTES * 0.1), "bob": pytest.approx(MINUTES * 0.004, abs=0.002)}
    # busy % of held time: alice's GPUs at 30 %; bob's share unknown, so no figure rather than 0 %
    [busy] = exprs["Busy % of held GPU time per user per day"]
    busy_by_user = values(busy, "user")
    assert busy_by_user["alice"] == pytest.approx(30)
    assert "bob" not in busy_by_user or busy_by_user["bob"] != busy_by_user["bob"]  # NaN: 0 / 0
    # idle GPU-hours, largest first: alice 70 % of 2 GPUs; bob's unknown time is not idle
    for title, by in (("Idle GPU-hours by user, 7 and 30 days", "user"),
                      ("Idle GPU-hours by team, 7 and 30 days", "team")):
        for expr in exprs[title]:
            rows = query(prometheus, expr)
            name = "alice" if by == "user" else "vision"
            assert rows[0]["metric"][by] == name, (title, rows)
            idle = values(expr, by)
            # increase() extrapolates over the scrapes it has: compare with the counters' own ratio
            assert idle[name] > 0 and idle.get("bob" if by == "user" else "nlp", 0) == 0, (title, idle)
