"""The Slurm usage source against real slurmdbd accounting (tests/fixtures/slurm.py).

Expected GPU-seconds are computed independently of sacct: start and end times
come from slurmctld (``scontrol show job``), GPU counts from what the test
asked for.
"""

from __future__ import annotations

import re
import time
from collections import defaultdict
from datetime import datetime, timezone
from decimal import Decimal

import pytest

from gpupool_hub.engines.slurm.accounting import SlurmUsageSource
from gpupool_hub.usage import UsageUnavailable
from tests.fixtures.slurm import MODELS, SlurmCluster, poll, stdout_of

pytestmark = pytest.mark.integration

A6000, RTX3090 = MODELS["a6000"], MODELS["rtx3090"]


def ctld_times(slurm: SlurmCluster, job_id: int) -> tuple[int, int | None]:
    """(start, end) epoch seconds from slurmctld; end None while running.

    While a job runs, slurmctld's EndTime is its expected end (a year ahead
    for an unlimited job), so it is only read once the job has ended.
    """
    out = stdout_of(slurm, ["scontrol", "show", "job", "--oneliner", str(job_id)], SLURM_TIME_FORMAT="%s")
    start = re.search(r" StartTime=(\d+) ", out)
    end = re.search(r" EndTime=(\S+) ", out)
    state = re.search(r" JobState=(\S+) ", out)
    assert start and end and state, out
    if state.group(1) in ("RUNNING", "SUSPENDED", "CONFIGURING"):
        return int(start.group(1)), None
    return int(start.group(1)), int(end.group(1))


def utc(epoch: float) -> datetime:
    return datetime.fromtimestamp(epoch, timezone.utc)


def wait_until(epoch: float) -> None:
    """Poll the clock until ``epoch`` has passed (an interval may only be read once it is over)."""
    poll(lambda: time.time() >= epoch, max(5.0, epoch - time.time() + 5), f"the clock to pass {epoch}")


def table(usages) -> dict[tuple[str, str], Decimal]:
    return {(u.user, u.model): u.gpu_seconds for u in usages}


def own(src: SlurmUsageSource, job_ids, start: float, end: float) -> dict[tuple[str, str], Decimal]:
    """GPU-seconds per (user, model) of these jobs only.

    The session's cluster is shared by every Slurm test: a job another test
    cancelled a second before this one's window opened is in sacct's answer
    too, so exact figures are compared for the test's own jobs; that
    ``usage`` adds up ``charges`` is checked for every job in the window.
    """
    out: dict[tuple[str, str], Decimal] = defaultdict(Decimal)
    charges = src.charges(utc(start), utc(end))
    totals: dict[tuple[str, str], Decimal] = defaultdict(Decimal)
    for c in charges:
        totals[(c.user, c.model)] += c.gpu_seconds
        if int(c.job.job_id) in job_ids:
            out[(c.user, c.model)] += c.gpu_seconds
    assert table(src.usage(utc(start), utc(end))) == {k: v for k, v in totals.items() if v}
    return {k: v for k, v in out.items() if v}


def source(slurm: SlurmCluster, **kw) -> SlurmUsageSource:
    kw.setdefault("settle_seconds", 0)
    return SlurmUsageSource(MODELS, env=slurm.env, **kw)


def expected(jobs: dict[int, tuple[str, dict[str, int]]], times: dict[int, tuple[int, int | None]],
             t0: int | Decimal, t1: int | Decimal) -> dict[tuple[str, str], Decimal]:
    out: dict[tuple[str, str], Decimal] = defaultdict(Decimal)
    for job_id, (user, gpus) in jobs.items():
        start, end = times[job_id]
        held = Decimal(min(end if end is not None else t1, t1)) - Decimal(max(start, t0))
        if held > 0:
            for gtype, count in gpus.items():
                out[(user, MODELS[gtype])] += held * count
    return dict(out)


def test_finished_jobs_give_exact_gpu_seconds_split_at_boundaries(slurm_accounting: SlurmCluster) -> None:
    slurm = slurm_accounting
    jobs = {
        slurm.submit(gres="gpu:a6000:2", node="gpu-a", seconds=3, name="gpupool-alice"):
            ("root", {"a6000": 2}),
        slurm.submit(gres="gpu:rtx3090:1", node="gpu-b", seconds=2, user="daemon"):
            ("daemon", {"rtx3090": 1}),
        # one job holding both GPU types of the mixed node
        slurm.submit(gres="gpu:a6000:1,gpu:rtx3090:1", node="gpu-c", seconds=2, user="nobody"):
            ("nobody", {"a6000": 1, "rtx3090": 1}),
        # two nodes, one GPU each
        slurm.submit(gres="gpu:a6000:1", seconds=2, extra=["--nodes=2", "--nodelist=gpu-a,gpu-c"]):
            ("root", {"a6000": 2}),
    }
    times = {}
    for job_id in jobs:
        slurm.wait_job_done(job_id)
        times[job_id] = ctld_times(slurm, job_id)
        assert slurm.wait_accounted(job_id) == times[job_id]  # slurmdbd agrees with slurmctld
    t0 = min(s for s, _ in times.values()) - 2
    t1 = max(e for _, e in times.values() if e is not None) + 1
    wait_until(t1)

    src = source(slurm)
    whole = own(src, jobs, t0, t1)
    assert whole == expected(jobs, times, t0, t1)
    assert whole[("nobody", A6000)] == whole[("nobody", RTX3090)] > 0
    # the same interval again: the same answer
    assert own(src, jobs, t0, t1) == whole

    # a boundary inside the first job: both halves exact, and they add up
    first_job = next(iter(jobs))
    mid = times[first_job][0] + 1
    a = own(src, jobs, t0, mid)
    b = own(src, jobs, mid, t1)
    assert a == expected(jobs, times, t0, mid)
    assert b == expected(jobs, times, mid, t1)
    for key, total in whole.items():
        assert a.get(key, 0) + b.get(key, 0) == total

    # sub-second boundaries
    lo, hi = Decimal(mid) + Decimal("0.25"), Decimal(mid) + Decimal("1.5")
    ms = own(src, jobs, float(lo), float(hi))
    assert ms == expected(jobs, times, lo, hi)
    assert ms[("root", A6000)] % Decimal("0.25") == 0 and ms[("root", A6000)] != int(ms[("root", A6000)])

    # filters
    assert own(source(slurm, job_name_prefix="gpupool-"), jobs, t0, t1) == {
        ("root", A6000): expected({first_job: jobs[first_job]}, times, t0, t1)[("root", A6000)],
    }
    only_daemon = own(source(slurm, users=["daemon"]), jobs, t0, t1)
    assert only_daemon == {("daemon", RTX3090): whole[("daemon", RTX3090)]}
    assert {user for user, _ in table(source(slurm, users=["daemon"]).usage(utc(t0), utc(t1)))} <= {"daemon"}


def test_running_job_counts_up_to_the_interval_end(slurm_accounting: SlurmCluster) -> None:
    slurm = slurm_accounting
    job = slurm.submit(gres="gpu:rtx3090:2", node="gpu-b", name="gpupool-bob", comment="gpupool:bob",
                       user="nobody", seconds=600)
    start, end = ctld_times(slurm, job)
    assert end is None
    assert slurm.wait_accounted(job, running=True) == (start, None)
    t0, t1 = start - 1, start + 2
    wait_until(start + 4)
    src = source(slurm)
    assert own(src, {job}, t0, t1) == {("nobody", RTX3090): Decimal(2 * 2)}
    # an interval that begins after the job started
    assert own(src, {job}, start + 1, start + 4) == {("nobody", RTX3090): Decimal(2 * 3)}
    # the comment of a running job comes from slurmctld
    assert own(source(slurm, comment_prefix="gpupool:"), {job}, t0, t1) == {
        ("nobody", RTX3090): Decimal(4)}
    assert source(slurm, comment_prefix="other:").usage(utc(t0), utc(t1)) == []
    (charge,) = [c for c in src.charges(utc(t0), utc(t1)) if int(c.job.job_id) == job]
    assert charge.job.end is None and charge.job.comment == "gpupool:bob"

    # after the job ended, the interval still gives the same answer
    slurm.cancel(job)
    slurm.wait_job_done(job)
    slurm.wait_accounted(job)
    assert own(src, {job}, t0, t1) == {("nobody", RTX3090): Decimal(4)}
    assert own(source(slurm, comment_prefix="gpupool:"), {job}, t0, t1) == {
        ("nobody", RTX3090): Decimal(4)}


def test_interval_not_over_yet_is_refused(slurm_accounting: SlurmCluster) -> None:
    now = time.time()
    with pytest.raises(UsageUnavailable, match="not settled yet"):
        source(slurm_accounting, settle_seconds=60).usage(utc(now - 30), utc(now - 10))
    with pytest.raises(UsageUnavailable, match="not settled yet"):
        source(slurm_accounting).usage(utc(now - 30), utc(now + 60))


def test_unreachable_slurm_is_unavailable(slurm_accounting: SlurmCluster) -> None:
    broken = SlurmUsageSource(MODELS, env={**slurm_accounting.env, "SLURM_CONF": "/nonexistent/slurm.conf"},
                              settle_seconds=0, timeout=3)
    now = time.time()
    with pytest.raises(UsageUnavailable, match="slurm: 'sdiag' (failed|did not answer)"):
        broken.usage(utc(now - 60), utc(now - 30))


def test_records_queued_while_slurmdbd_is_down(slurm_accounting: SlurmCluster) -> None:
    """While slurmdbd is away slurmctld queues job records; the interval is unavailable until they arrive."""
    slurm = slurm_accounting
    slurm.stop_slurmdbd()
    try:
        job = slurm.submit(gres="gpu:a6000:1", node="gpu-a", seconds=1, name="while-dbd-down")
        slurm.wait_job_done(job)
        start, end = ctld_times(slurm, job)
        t0, t1 = start - 1, end + 1
        wait_until(t1)
        with pytest.raises(UsageUnavailable) as e:
            source(slurm).usage(utc(t0), utc(t1))
        print("slurmdbd down:", e.value)
        assert re.search(r"accounting record\(s\) queued|sacct", str(e.value))
        with pytest.raises(UsageUnavailable, match="sacct"):
            source(slurm, check_dbd_queue=False).usage(utc(t0), utc(t1))
    finally:
        slurm.start_slurmdbd()
    src = source(slurm)

    def answer():
        try:
            return table(src.usage(utc(t0), utc(t1)))
        except UsageUnavailable:
            return None
    got = poll(answer, 60, "the queued records to reach slurmdbd")
    assert got == {("root", A6000): Decimal(end - start)}
