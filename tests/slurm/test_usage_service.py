"""usage_preset = "slurm": the real service charging from real Slurm accounting.

A cluster of its own (module scope) with the seed's three GPU models: a
node of eight RTX 2080, one of four RTX 3090, one of four RTX A6000. Jobs of
hours cannot run in a test, so each job runs for real (a second or so, with
the GPUs, name and comment the test asks for; slurmctld sends slurmdbd its
record) and then has its times moved hours back in slurmdbd's database
(``SlurmCluster.rewrite_job_times``). Everything after that is real:
``sacct`` answers from slurmdbd, the service process (``python -m
gpupool_hub.service``) charges each closed twenty-minute interval through its
debit job into an SQLite ledger, and the test reads the ledger. The test
never computes tokens: only the worked example's totals are written here.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import uuid
from collections import Counter
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

import pytest

from gpupool_hub.ledger import AllocationRecord, Ledger, Posting, UnknownAccount
from gpupool_hub.ledger.schema import intervals
from tests.fixtures.hub import free_port, wait_for
from tests.fixtures.slurm import NodeSpec, SlurmCluster, running_cluster

pytestmark = pytest.mark.integration

MODELS = {"rtx2080": "NVIDIA GeForce RTX 2080", "rtx3090": "NVIDIA GeForce RTX 3090", "a6000": "NVIDIA RTX A6000"}
R2080, R3090, A6000 = MODELS["rtx2080"], MODELS["rtx3090"], MODELS["a6000"]
PRICES = {"RTX 2080": 0.5, "RTX 3090": 1, "RTX A6000": 4}
NODES = (
    NodeSpec("n2080", cpus=8, memory_mib=8000, gpus=(("rtx2080", 8),)),
    NodeSpec("n3090", cpus=4, memory_mib=8000, gpus=(("rtx3090", 4),)),
    NodeSpec("na6000", cpus=4, memory_mib=8000, gpus=(("a6000", 4),)),
)
INTERVAL = 1200  # twenty-minute debit intervals: the 10-hour job spans 31 of them
M, H = 60, 3600


@pytest.fixture(scope="module")
def cluster():
    yield from running_cluster(NODES, {"gpu": [n.name for n in NODES]}, require_accounting=True)


def epoch(dt: datetime) -> int:
    return int(dt.timestamp())


def run_jobs(cluster: SlurmCluster, specs: list[dict]) -> list[int]:
    """Jobs that really run (all at once, briefly) and are then recorded in slurmdbd as having
    held their GPUs from ``start`` to ``end``."""
    ids = [cluster.submit(gres=s["gres"], node=s["node"], seconds=0.2, user=s.get("user"),
                          name=s.get("name", "job"), comment=s.get("comment"), wait_running=False)
           for s in specs]
    for job, spec in zip(ids, specs):
        cluster.wait_job_done(job)
        cluster.wait_accounted(job)
        cluster.rewrite_job_times(job, spec["start"], spec["end"])
    return ids


@pytest.fixture(scope="module")
def history(cluster):
    """The seed's worked example run by alice as three hub servers, plus two jobs the hub did not start."""
    base = datetime.now(timezone.utc).replace(minute=0, second=0, microsecond=0) - timedelta(hours=14)
    b = epoch(base)
    alloc = {k: f"test-{k}-{uuid.uuid4().hex[:8]}" for k in ("2080", "3090", "a6000")}
    server = {"name": "gpupool-server"}
    jobs = {  # start times off the twenty-minute grid, so every job is split inside intervals at both ends
        "2080": dict(gres="gpu:rtx2080:8", node="n2080", start=b + H + 33 * M + 20, end=b + 6 * H + 33 * M + 20,
                     comment="gpupool-allocation=" + alloc["2080"], **server),          # 8 × 5 h × 0.5 = 20
        "3090": dict(gres="gpu:rtx3090:4", node="n3090", start=b + 2 * H + 15 * M, end=b + 12 * H + 15 * M,
                     comment="gpupool-allocation=" + alloc["3090"], **server),          # 4 × 10 h × 1 = 40
        "a6000": dict(gres="gpu:a6000:2", node="na6000", start=b + 20 * M + 7, end=b + 3 * H + 20 * M + 7,
                      comment="gpupool-allocation=" + alloc["a6000"], **server),        # 2 × 3 h × 4 = 24
        # a plain sbatch job of hub user "daemon": 1 × 1 h × 4 = 4 tokens, with charge_batch_jobs only
        "batch": dict(gres="gpu:a6000:1", node="na6000", start=b + 4 * H + 5 * M, end=b + 5 * H + 5 * M,
                      user="daemon"),
        # "nobody" (no hub user) copies alice's allocation into its comment: never on alice's bill
        "forged": dict(gres="gpu:a6000:1", node="na6000", start=b + 4 * H, end=b + 6 * H, user="nobody",
                       name="gpupool-server", comment="gpupool-allocation=" + alloc["a6000"]),
    }
    run_jobs(cluster, list(jobs.values()))
    return base, alloc, jobs


def make_ledger(path: Path, base: datetime, alloc: dict[str, str], jobs: dict) -> Ledger:
    """alice: 100 tokens to start + 30 of credits, her three allocations (released); daemon: a hub user."""
    ledger = Ledger(f"sqlite:///{path}")
    ledger.epoch(base)
    ledger.post(Posting("alice", "grant", Decimal(100), "grant:alice:start", reason="start"))
    ledger.post(Posting("alice", "grant", Decimal(30), "grant:alice:credits", reason="credits"))
    ledger.open_account("daemon")
    for kind, alloc_id in alloc.items():
        spec = jobs[kind]
        ledger.allocations.add(AllocationRecord(
            id=alloc_id, user="alice", server="", node=spec["node"], gpus=(), request={},
            price_per_hour=Decimal(0), borrowed=False,
            created_at=datetime.fromtimestamp(spec["start"] - 5, timezone.utc)))
        ledger.allocations.release(alloc_id, at=datetime.fromtimestamp(spec["end"], timezone.utc), reason="test")
    return ledger


class Service:
    """``python -m gpupool_hub.service`` on its own config file; killed by PID."""

    def __init__(self, workdir: Path, cluster: SlurmCluster, db: Path, extra: str = "") -> None:
        self.config = workdir / "jupyterhub_config.py"
        self.config.write_text(textwrap.dedent(f"""
            c = get_config()  # noqa
            c.GPUPool.prices = {PRICES!r}
            c.GPUPool.inventory = "slurm"
            c.GPUPool.slurm_gpu_models = {MODELS!r}
            c.GPUPool.slurm_conf = {str(cluster.conf)!r}
            c.GPUPool.slurm_refresh_interval = 3600
            # the test cluster has no cgroups (task/none): ConstrainDevices cannot run in this container
            c.GPUPool.slurm_allow_env_only_gpu_hiding = True
            c.GPUPool.db_url = "sqlite:///{db}"
            c.GPUPoolService.usage_preset = "slurm"
            c.GPUPoolService.debit_interval = {INTERVAL}
            c.GPUPoolService.debit_check_interval = 0.2
            c.GPUPoolService.replenish_interval = 3600
            c.GPUPoolService.reconcile_interval = 3600
        """) + textwrap.dedent(extra))
        self.log = workdir / "service.log"
        self.env = {**cluster.env, "JUPYTERHUB_API_URL": f"http://127.0.0.1:{free_port()}/hub/api",
                    "JUPYTERHUB_API_TOKEN": "x", "JUPYTERHUB_SERVICE_URL": f"http://127.0.0.1:{free_port()}"}
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        with open(self.log, "ab") as out:
            self.proc = subprocess.Popen([sys.executable, "-m", "gpupool_hub.service", "--config", str(self.config)],
                                         env=self.env, stdout=out, stderr=subprocess.STDOUT)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.running():
            assert self.proc is not None
            os.kill(self.proc.pid, sig)
            self.proc.wait(20)

    def log_tail(self) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-30:])


def charged(ledger: Ledger) -> list[datetime]:
    with ledger.db.engine.connect() as conn:
        return sorted(r.start for r in conn.execute(intervals.select().where(intervals.c.job == "debit")))


def debits(ledger: Ledger) -> list:
    return [e for e in ledger.iter_entries() if e.kind == "debit"]


def interval_of(t: int) -> datetime:
    return datetime.fromtimestamp(t - t % INTERVAL, timezone.utc).replace(tzinfo=None)


def wait_charged_through(ledger: Ledger, service: Service, t: int, timeout: float) -> None:
    """Until the interval holding epoch second ``t`` is charged (the service still running)."""
    last = interval_of(t)

    def done() -> bool:
        assert service.running(), f"the service exited:\n{service.log_tail()}"
        got = charged(ledger)
        return bool(got) and got[-1] >= last
    wait_for(done, timeout, f"intervals through {last} to be charged", interval=0.1)


def test_worked_example_charged_exactly_once_across_a_kill_9(cluster, history, tmp_path):
    base, alloc, jobs = history
    db = tmp_path / "ledger.sqlite"
    ledger = make_ledger(db, base, alloc, jobs)
    service = Service(tmp_path, cluster, db)
    service.start()
    try:
        # kill -9 in the middle of the catch-up (about 40 intervals, one sacct each)
        wait_for(lambda: not service.running() or len(charged(ledger)) >= 8, 60,
                 "the service to charge a few intervals", interval=0.02)
        assert service.running(), f"the service exited:\n{service.log_tail()}"
        service.kill()
        at_kill = {e.key: (e.id, e.amount, e.gpu_seconds) for e in debits(ledger)}
        intervals_at_kill = charged(ledger)
        last_end = max(spec["end"] for spec in jobs.values())
        assert intervals_at_kill and intervals_at_kill[-1] < interval_of(last_end), \
            "the kill came too late to test anything"
        service.start()
        wait_charged_through(ledger, service, last_end, 90)
    finally:
        service.kill(signal.SIGTERM)

    assert ledger.balance("alice") == Decimal("46.000")  # 100 + 30 − 84
    by_model: dict[str, Decimal] = Counter()
    seconds: dict[str, Decimal] = Counter()
    for e in debits(ledger):
        assert e.account == "alice", e  # neither daemon's plain job nor nobody's forged one
        by_model[e.model] -= e.amount
        seconds[e.model] += e.gpu_seconds
    assert by_model == {R2080: 20, R3090: 40, A6000: 24}
    assert seconds == {R2080: 8 * 5 * H, R3090: 4 * 10 * H, A6000: 2 * 3 * H}
    # each job was split over the intervals it spans, once per interval
    per_model = Counter(e.model for e in debits(ledger))
    assert per_model[R3090] == 31 and per_model[R2080] == 16 and per_model[A6000] == 10
    # what was charged before the kill is there unchanged, and nothing twice
    now = {e.key: (e.id, e.amount, e.gpu_seconds) for e in debits(ledger)}
    assert {k: now[k] for k in at_kill} == at_kill
    assert len(now) == len(debits(ledger))
    starts = charged(ledger)
    assert len(starts) == len(set(starts)) and len(starts) > len(intervals_at_kill)
    assert ledger.balance("daemon") == 0
    with pytest.raises(UnknownAccount):
        ledger.balance("nobody")
    assert ledger.verify().ok


def test_plain_sbatch_jobs_of_hub_users_are_charged_with_charge_batch_jobs(cluster, history, tmp_path):
    base, alloc, jobs = history
    window = datetime.fromtimestamp(jobs["batch"]["start"] - jobs["batch"]["start"] % INTERVAL, timezone.utc)
    db = tmp_path / "ledger.sqlite"
    ledger = make_ledger(db, window, alloc, jobs)
    service = Service(tmp_path, cluster, db, "c.GPUPoolService.charge_batch_jobs = True\n")
    service.start()
    try:
        wait_charged_through(ledger, service, jobs["forged"]["end"], 60)
    finally:
        service.kill(signal.SIGTERM)
    assert ledger.balance("daemon") == Decimal(-4)  # 1 × RTX A6000 × 1 h × 4
    assert sum(e.gpu_seconds for e in debits(ledger) if e.account == "daemon") == H
    # nobody is no hub user: its job is nobody's to pay, and it did not land on alice's bill either
    with pytest.raises(UnknownAccount):
        ledger.balance("nobody")
    alice: dict[str, Decimal] = Counter()
    until = jobs["forged"]["end"]  # the end of nobody's job, on the interval grid: two hours after `window`
    for e in debits(ledger):
        if e.account == "alice" and epoch(e.interval_end) <= until:
            alice[e.model] += e.gpu_seconds
    # alice's servers in the same two hours: still charged, once; no A6000 (hers ended before)
    assert alice == {R2080: 8 * 2 * H, R3090: 4 * 2 * H}
    assert ledger.verify().ok


def test_slurm_conf_unfit_for_charging_stops_the_service_at_start_up(cluster, tmp_path):
    from tests.slurm.test_usage_config import start

    with pytest.raises(SystemExit) as e:  # the map names a type slurm.conf does not account for
        start(tmp_path, f"""
            c.GPUPoolService.usage_preset = "slurm"
            c.GPUPool.slurm_conf = {str(cluster.conf)!r}
            c.GPUPool.slurm_gpu_models = {{**{MODELS!r}, "h100": "NVIDIA H100"}}
        """)
    assert "AccountingStorageTRES lacks gres/gpu:h100" in str(e.value)
