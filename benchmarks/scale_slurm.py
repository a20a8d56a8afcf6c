"""The scale pool's GPU time in Slurm accounting, for benchmarks/scale.py (issue #26).

With ``usage_preset = 'slurm'`` the service charges what ``sacct`` says each hub
server's job held. The issue asks for that cycle on a recorded answer for 1,000
nodes: :class:`RecordedSlurm` is what a healthy Slurm with slurmdbd would answer
for the pool, one running job per running server on its node, as the
``gpupool-slurm`` spawner submits it (``--comment=gpupool-allocation=<id>``, its
GPUs as ``gres/gpu:<type>`` in AllocTRES). It is made in memory from the ledger's
active allocations (5,000 lines at 100k users take milliseconds), so nothing is
cached, and it answers through the usage source's runner seam: no command runs.

MIG instances and fractions of a GPU have no job: the ``gpupool-slurm`` spawner
refuses them (Slurm cannot share a GPU between jobs) and the Slurm source knows
no MIG profile, so a Slurm-run pool holds none. Their servers are left out of
the answer and of the check.
"""

from __future__ import annotations

import asyncio
import math
import statistics
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from gpupool_hub.ledger import AllocationRecord, Ledger
    from gpupool_hub.engines.slurm.accounting import SlurmUsageSource

#: the first job id; the pool's jobs are numbered from it in the order the servers started
FIRST_JOB = 100_000
#: the job name of every server (``JOB_NAME`` of gpupool_hub/engines/slurm/spawner.py, which imports JupyterHub)
JOB_NAME = "gpupool-server"


def whole_gpus(record: AllocationRecord, gres_types: Mapping[str, str]) -> dict[str, int] | None:
    """GRES type -> whole GPUs the server's job holds, or None for a share (a MIG instance, a
    fraction), which a Slurm-run pool cannot hold. ``gres_types``: model -> GRES type."""
    if any(g["milli"] != 1000 or g.get("mig_uuid") for g in record.gpus):
        return None
    counts: dict[str, int] = {}
    for g in record.gpus:
        counts[gres_types[g["model"]]] = counts.get(gres_types[g["model"]], 0) + 1
    return counts


class RecordedSlurm:
    """A :data:`~gpupool_hub.engines.slurm.commands.Runner` answering the Slurm source's commands from
    recorded text: ``sacct`` for the given windows, ``squeue`` for the running jobs it names,
    ``sdiag`` with nothing queued for slurmdbd, ``scontrol show config`` with accounting as the
    source needs it. Anything else is a benchmark bug, raised as such (not as a Slurm error,
    which the debit cycle would take for an outage and wait out)."""

    def __init__(self, records: Iterable[AllocationRecord], models: Mapping[str, str],
                 windows: Iterable[tuple[datetime, datetime]]) -> None:
        from gpupool_hub.engines.slurm.accounting import DELIMITER, SACCT_FIELDS, sacct_argv
        from gpupool_hub.engines.slurm.owners import ALLOCATION_COMMENT

        gres_types = {model: t for t, model in models.items()}
        lines = [DELIMITER.join(SACCT_FIELDS)]
        self.squeue: dict[str, str] = {}
        self.jobs: list[AllocationRecord] = []
        for r in sorted(records, key=lambda r: (r.created_at, r.id)):
            held = whole_gpus(r, gres_types)
            if held is None:
                continue
            job = str(FIRST_JOB + len(self.jobs))
            self.jobs.append(r)
            n = sum(held.values())
            tres = ",".join([f"billing={n}", f"cpu={8 * n}", *(f"gres/gpu:{t}={c}" for t, c in sorted(held.items())),
                             f"gres/gpu={n}", f"mem={65536 * n}M", "node=1"])
            # running: no End, and slurmdbd has no comment until the job ends (squeue has it)
            lines.append(DELIMITER.join([job, job, r.user, str(job_start(r)), "Unknown", "RUNNING", tres, r.node,
                                         JOB_NAME, ""]))
            self.squeue[job] = f"{job}|RUNNING|{ALLOCATION_COMMENT}{r.id}"
        sacct = "\n".join(lines) + "\n"  # every job runs through every window
        self.answers = {tuple(sacct_argv(start, end)): sacct for start, end in windows}
        self.answers[("sdiag",)] = "Server thread count:  3\nAgent queue size:     0\nDBD Agent queue size: 0\n"
        tres_types = ",".join(f"gres/gpu:{t}" for t in sorted(models))
        self.answers[("scontrol", "show", "config")] = (
            "AccountingStorageType   = accounting_storage/slurmdbd\n"
            "AccountingStoreFlags    = job_comment\n"
            f"AccountingStorageTRES   = cpu,mem,energy,node,billing,gres/gpu,{tres_types}\n")

    def __call__(self, argv: Sequence[str]) -> str:
        if argv and argv[0] == "squeue":  # the jobs it names, as squeue --jobs= filters them
            asked = next(a for a in argv if a.startswith("--jobs=")).removeprefix("--jobs=").split(",")
            return "".join(self.squeue[j] + "\n" for j in asked if j in self.squeue)
        answer = self.answers.get(tuple(argv))
        if answer is None:
            raise RuntimeError(f"no recorded Slurm answer for {' '.join(argv)[:300]}")
        return answer


def job_start(record: AllocationRecord) -> int:
    """The job's Start in slurmdbd: whole seconds, no earlier than the allocation."""
    return math.ceil(record.created_at.timestamp())


def usage_source(ledger: Ledger, models: Mapping[str, str], runner: RecordedSlurm,
                 clock: Callable[[], datetime]) -> SlurmUsageSource:
    """The source the service builds for ``usage_preset = 'slurm'`` without ``charge_batch_jobs``
    (gpupool_hub/service/usage.py): only jobs whose comment names an allocation, charged to its
    owner, and the start-up check of slurm.conf. Its runner and clock are the benchmark's, seams
    that service setting refuses (so make_usage_source cannot build this one)."""
    from gpupool_hub.engines.slurm.accounting import SlurmUsageSource
    from gpupool_hub.engines.slurm.owners import ALLOCATION_COMMENT, HubJobOwners

    source = SlurmUsageSource(models, user_of=HubJobOwners(ledger), comment_prefix=ALLOCATION_COMMENT,
                              runner=runner, clock=clock)
    source.check_accounting(need_comments=True)
    return source


async def time_debit(manager: Any, clock: Any, models: Mapping[str, str], hours: int) -> dict[str, float]:
    """``debit_cycle_slurm_s``: the median of ``hours`` debit runs, each charging the next hour
    from Slurm accounting, then checked (untimed) like the Prometheus cycle.

    A debit unit of its own on the manager's ledger and writer thread, as the service builds it
    with the Slurm preset. It starts where the manager's unit stopped, after every hour charged
    from Prometheus, so no hour is charged twice; the manager's unit must not charge after it
    (it would not know of these hours)."""
    from benchmarks.scale_prometheus import check_charged
    from gpupool_hub.service.core.debits import Debits

    m = manager
    first = m.debits.next_interval_start()
    step = timedelta(seconds=m.debits.interval)
    runner = RecordedSlurm(m.ledger.allocations.active(), models,
                           [(first + step * k, first + step * (k + 1)) for k in range(hours)])
    debits = Debits(m.ledger, m.inventory.prices, usage_source(m.ledger, models, runner, clock),
                    interval=m.debits.interval, delay_tolerance=m.debits.delay_tolerance, clock=clock,
                    charged=m.cache, threads=m.threads)
    posted: list[Any] = []
    debits.report_to(posted.extend)
    loop = asyncio.get_running_loop()
    times = []
    for k in range(1, hours + 1):
        clock.now = first + step * k + timedelta(minutes=5)
        t = time.perf_counter()
        await loop.run_in_executor(None, debits.debit_due)  # as DebitJob runs it
        times.append(time.perf_counter() - t)
    # Slurm's Start is in whole seconds: a "history" with a step of one second
    check_charged(posted, runner.jobs, first, first + step * hours, debits.next_interval_start(), debits.interval, 1)
    return {"debit_cycle_slurm_s": round(statistics.median(times), 3)}
