"""Shared history for the usage-source tests: one Prometheus serves them all.

Everything is placed relative to ``BASE`` (an hour a few days ago); the
expected GPU-seconds live next to the data so a reader can check them by hand.
The ``prometheus_factory`` fixture comes from ``tests.fixtures.prometheus``,
registered in the root conftest's ``pytest_plugins``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from decimal import Decimal

import pytest

from tests.fixtures.prometheus import (
    OpenMetricsHistory,
    PrometheusServer,
    history_base,
    usage_table_history,
)

H = timedelta(hours=1)
M = timedelta(minutes=1)

A6000 = "NVIDIA RTX A6000"
RTX3090 = "NVIDIA GeForce RTX 3090"
T4 = "Tesla T4"
ODD = 'o\'brien@lab "ünï" \\ x'  # quotes, backslash, unicode, @, spaces


def kubespawner_escape(name: str) -> str:
    """KubeSpawner's legacy label escaping, written independently for the test data."""
    out = []
    for ch in name:
        if ch in "abcdefghijklmnopqrstuvwxyz0123456789":
            out.append(ch)
        else:
            out.extend(f"-{b:02x}" for b in ch.encode("utf-8"))
    return "".join(out)


@dataclass(frozen=True)
class History:
    base: datetime
    server: PrometheusServer

    def at(self, hours: float = 0, minutes: float = 0) -> datetime:
        return self.base + timedelta(hours=hours, minutes=minutes)


def _gpupool(b: datetime, h: OpenMetricsHistory) -> None:
    # Main window [b, b+3h): every span closes with an explicit 0 sample, as
    # the hub's gauge does when an allocation ends.
    usage_table_history(
        {
            ("alice", A6000): [(b, b + 3 * H, 2)],
            ("bob", RTX3090): [(b + H, b + 2 * H, 0.25)],
            ("carol", A6000): [(b, b + H + 30 * M, 1)],  # stops mid-interval
            ("dave", A6000): [(b, b + H, 1)],
            ("dave", RTX3090): [(b + 2 * H, b + 3 * H, 2)],
            (ODD, RTX3090): [(b + 30 * M, b + 2 * H + 30 * M, 0.5)],
        },
        history=h,
    )
    # [b+4h, b+6h): a series that just stops, no end sample (no staleness marker).
    usage_table_history({("erin", T4): [(b + 4 * H, b + 5 * H, 1)]}, history=h, close=False)
    # [b+6h, b+7h): the same allocation scraped by two jobs must count once.
    for instance in ("hub-a:8000", "hub-b:8000"):
        h.gauge(
            "gpupool_allocated_gpus",
            {"user": "frank", "model": T4, "node": "n2", "server": "", "allocation": "42", "instance": instance},
            [(b + 6 * H, b + 7 * H, 1)],
        )
    # Broken exporters, each in its own hour.
    h.gauge("gpupool_allocated_gpus", {"user": "grace", "model": T4, "node": "n", "allocation": "nan"},
            [(b + 8 * H, b + 8 * H + 10 * M, "NaN")])
    h.gauge("gpupool_allocated_gpus", {"user": "heidi", "model": T4, "node": "n", "allocation": "neg"},
            [(b + 10 * H, b + 10 * H + 10 * M, -1)])
    h.gauge("gpupool_allocated_gpus", {"model": T4, "node": "n", "allocation": "nouser"},
            [(b + 12 * H, b + 12 * H + 10 * M, 1)])
    # Heartbeat for coverage checks: a 15-minute gap in the second hour.
    h.gauge("gpupool_hub_up", {"job": "gpupool-hub"}, [(b, b + H + 30 * M, 1), (b + H + 45 * M, b + 3 * H, 1)])


def _agent(b: datetime, h: OpenMetricsHistory) -> None:
    def active(user: str, uuid: str, model: str, spans, node: str = "gpu-node-1") -> None:
        h.gauge("gpupool_agent_user_gpu_active", {"user": user, "gpu_uuid": uuid, "model": model, "node": node}, spans)

    active("alice", "GPU-a1", A6000, [(b, b + 3 * H, 1)])
    active("alice", "GPU-a2", A6000, [(b, b + 3 * H, 1)])
    active("bob", "GPU-b1", RTX3090, [(b + H, b + 2 * H, 1)])
    active("carol", "GPU-c1", A6000, [(b, b + H + 30 * M, 1)])  # stops mid-interval
    # dave: the agent reports 0 while idle, 1 while active, on two models
    active("dave", "GPU-d1", A6000, [(b, b + H, 1), (b + H, b + 3 * H, 0)])
    active("dave", "GPU-d2", RTX3090, [(b + 2 * H, b + 3 * H, 1)], node="gpu-node-2")
    active(ODD, "GPU-o1", RTX3090, [(b + 30 * M, b + 2 * H + 30 * M, 1)])


def _dcgm(b: datetime, h: OpenMetricsHistory) -> None:
    """DCGM exporter (utilisation %, varying) + kube-state-metrics pod labels/annotations.

    DCGM series just end when the pod goes away (a real scrape would leave a
    staleness marker, which OpenMetrics cannot express), so these tests use
    ``max_sample_age``.
    """
    pods = {
        # pod: (username, namespace)
        "jupyter-alice": ("alice", "jhub"),
        "jupyter-carol": ("carol", "jhub"),
        "jupyter-dave": ("dave", "jhub"),
        "jupyter-dave--big": ("dave", "jhub"),
        f"jupyter-{kubespawner_escape(ODD)}"[:63]: (ODD, "jhub"),
    }
    for pod, (user, ns) in pods.items():
        for ksm in ("ksm-0", "ksm-1"):  # two kube-state-metrics replicas: must not double
            h.gauge("kube_pod_labels",
                    {"namespace": ns, "pod": pod, "uid": f"uid-{pod}", "instance": ksm,
                     "label_hub_jupyter_org_username": kubespawner_escape(user), "label_component": "singleuser-server"},
                    [(b - H, b + 4 * H, 1)], close=False)
        h.gauge("kube_pod_annotations",
                {"namespace": ns, "pod": pod, "uid": f"uid-{pod}", "annotation_hub_jupyter_org_username": user},
                [(b - H, b + 4 * H, 1)], close=False)
    # a GPU pod that is not a JupyterHub server: no username label, never charged
    h.gauge("kube_pod_labels", {"namespace": "ml", "pod": "trainer-0", "uid": "uid-t"}, [(b - H, b + 4 * H, 1)], close=False)

    util = iter(["37", "0", "100", "12.5", "99"])

    def gpu(i: int, uuid: str, model: str, pod: str | None, spans, host: str = "gpu-node-1", ns: str = "jhub") -> None:
        labels = {"gpu": str(i), "UUID": uuid, "device": f"nvidia{i}", "modelName": model, "Hostname": host,
                  "DCGM_FI_DRIVER_VERSION": "550.54.15", "instance": f"{host}:9400", "job": "dcgm"}
        if pod:
            labels.update(pod=pod, namespace=ns, container="notebook")
        h.gauge("DCGM_FI_DEV_GPU_UTIL", labels, [(s, e, next(util, "50")) for s, e in spans], close=False)
        # the same GPU as seen with honor_labels off: pod/namespace renamed
        if pod:
            renamed = {k: v for k, v in labels.items() if k not in ("pod", "namespace", "container")}
            renamed.update(exported_pod=pod, exported_namespace=ns, exported_container="notebook",
                           pod="dcgm-exporter-x", namespace="gpu-operator")
            h.gauge("DCGM_FI_PROF_GR_ENGINE_ACTIVE", renamed, [(s, e, "0.5") for s, e in spans], close=False)

    gpu(0, "GPU-a1", A6000, "jupyter-alice", [(b, b + 3 * H)])
    gpu(1, "GPU-a2", A6000, "jupyter-alice", [(b, b + 3 * H)])
    gpu(2, "GPU-c1", A6000, "jupyter-carol", [(b, b + H + 30 * M)])  # pod deleted mid-interval
    gpu(3, "GPU-d1", A6000, "jupyter-dave", [(b, b + H)])
    gpu(0, "GPU-d2", RTX3090, "jupyter-dave--big", [(b + 2 * H, b + 3 * H)], host="gpu-node-2")
    gpu(1, "GPU-o1", RTX3090, f"jupyter-{kubespawner_escape(ODD)}"[:63], [(b + 30 * M, b + 2 * H + 30 * M)], host="gpu-node-2")
    gpu(2, "GPU-t1", RTX3090, "trainer-0", [(b, b + 3 * H)], host="gpu-node-2", ns="ml")
    gpu(3, "GPU-idle", RTX3090, None, [(b, b + 3 * H)], host="gpu-node-2")  # no pod: unallocated


def _custom(b: datetime, h: OpenMetricsHistory) -> None:
    # A site's own exporter with different label names.
    h.gauge("lab_gpu_alloc", {"username": "alice", "gpu_model": A6000, "slot": "1"}, [(b, b + 3 * H, 2)])
    h.gauge("lab_gpu_alloc", {"username": ODD, "gpu_model": RTX3090, "slot": "2"}, [(b + 30 * M, b + 2 * H + 30 * M, 0.5)])


@pytest.fixture(scope="session")
def usage_history(prometheus_factory) -> History:
    """One server with the gpupool, agent, dcgm and custom histories."""
    b = history_base(days_back=3)
    h = OpenMetricsHistory()
    _gpupool(b, h)
    _agent(b, h)
    _dcgm(b, h)
    _custom(b, h)
    return History(base=b, server=prometheus_factory(h))


# Exact expectations for [base, base+3h). The agent and DCGM see whole GPUs
# (bob's and the odd user's GPU counts 1, dave has one RTX 3090 there).
EXPECTED_GPUPOOL = {
    ("alice", A6000): Decimal(2 * 3 * 3600),
    ("bob", RTX3090): Decimal(900),
    ("carol", A6000): Decimal(5400),
    ("dave", A6000): Decimal(3600),
    ("dave", RTX3090): Decimal(7200),
    (ODD, RTX3090): Decimal(3600),
}
EXPECTED_AGENT = {
    **EXPECTED_GPUPOOL,
    ("bob", RTX3090): Decimal(3600),
    ("dave", RTX3090): Decimal(3600),
    (ODD, RTX3090): Decimal(7200),
}
EXPECTED_DCGM = {k: v for k, v in EXPECTED_AGENT.items() if k[0] != "bob"}
