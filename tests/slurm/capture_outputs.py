"""Regenerate tests/slurm/data/*.txt: real outputs of a real Slurm cluster.

    PYTHONPATH=. python -m tests.slurm.capture_outputs   # as root, ~1 min

Starts the test cluster of tests/fixtures/slurm.py, puts it through the
situations the table tests need (GPUs in use with gaps, a multi-node job,
drained/draining/down/reserved/not-responding nodes, requeued, array,
cancelled and failed jobs, odd job names) and saves what ``scontrol``,
``squeue``, ``sacct`` and ``sdiag`` print. The table tests' expectations were
checked by hand against these files; if they are regenerated the tests must be
re-checked (job ids, times and indices change).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from datetime import datetime, timezone
from pathlib import Path

from gpupool_hub.engines.slurm.parse import SQUEUE_FORMAT
from gpupool_hub.engines.slurm.accounting import sacct_argv
from tests.fixtures.slurm import SlurmCluster, poll

DATA = Path(__file__).resolve().parent / "data"


def main() -> None:
    DATA.mkdir(exist_ok=True)
    c = SlurmCluster.start(Path(tempfile.mkdtemp(prefix="gpupool-slurm-capture-")))
    print(f"cluster up in {c.startup_seconds:.1f}s", file=sys.stderr)
    env = dict(c.env, SLURM_TIME_FORMAT="%s", TZ="UTC")

    def out(argv: list[str]) -> str:
        r = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise RuntimeError(f"{argv}: {r.stderr}")
        return r.stdout

    def save(name: str, text: str) -> None:
        (DATA / name).write_text(text)
        print(f"wrote {name}", file=sys.stderr)

    def node(name: str | None = None) -> list[str]:
        return ["scontrol", "--details", "show", "node", "--oneliner", *([name] if name else [])]

    def job(job_id: int) -> list[str]:
        return ["scontrol", "--details", "show", "job", "--oneliner", str(job_id)]

    try:
        save("nodes_idle.txt", out(node()))
        first = c.run(["date", "+%s"]).stdout.strip()

        # GPUs in use with a gap: a6000 0, 1, 2 taken, 1 given back, then 2 more -> IDX 1,3
        a = c.submit(gres="gpu:a6000:1", node="gpu-a", name="gpupool-alice", comment="gpupool:alice", seconds=3)
        b = c.submit(gres="gpu:a6000:1", node="gpu-a", name="b", seconds=600)
        c3 = c.submit(gres="gpu:a6000:1", node="gpu-a", name="c", seconds=600, user="daemon")
        c.wait_job_done(a)
        a2 = c.submit(gres="gpu:a6000:1", node="gpu-a", name="a2", seconds=600)
        c.cancel(b)
        c.wait_job_done(b)
        d = c.submit(gres="gpu:a6000:2", node="gpu-a", name="two gpus with gap", seconds=600)
        multi = c.submit(gres="gpu:rtx3090:1", name="multi", seconds=600, extra=["--nodes=2", "--nodelist=gpu-b,gpu-c"])
        mixed = c.submit(gres="gpu:a6000:1", node="gpu-c", name="weird|name", user="daemon", seconds=600,
                         comment="line1\nline2")
        pend = c.submit(gres="gpu:rtx3090:2", node="gpu-b", name="waits", seconds=1, wait_running=False)
        poll(lambda: c.job_state(pend) == "PENDING" and "Reason=Resources" in out(job(pend)), 20, "pending")
        save("nodes_busy.txt", out(node()))
        save("job_gap.txt", out(job(d)))
        save("job_multinode.txt", out(job(multi)))
        save("job_mixed_node.txt", out(job(mixed)))
        save("job_a2.txt", out(job(a2)))
        save("job_pending.txt", out(job(pend)))
        save("squeue_all.txt", out(["squeue", "--noheader", "--states=all", f"--format={SQUEUE_FORMAT}"]))
        c.cancel(a2, c3, d, multi, pend, mixed)
        for j in (a2, c3, d, multi, pend, mixed):
            c.wait_job_done(j)
        save("job_completed.txt", out(job(mixed)))

        # node states
        c.run(["scontrol", "update", "NodeName=gpu-a", "State=DRAIN", "Reason=fan broken x=1 (ticket 42)"])
        busy = c.submit(gres="gpu:rtx3090:1", node="gpu-b", name="keeps gpu-b busy", seconds=600)
        c.run(["scontrol", "update", "NodeName=gpu-b", "State=DRAIN", "Reason=draining for maintenance"])
        c.run(["scontrol", "create", "Reservation=maint", "StartTime=now", "Duration=60", "Nodes=gpu-c",
               "Users=root"])
        poll(lambda: "RESERVED" in out(node("gpu-c")), 20, "gpu-c to show the reservation")
        save("nodes_drain_resv.txt", out(node()))
        c.cancel(busy)
        c.wait_job_done(busy)
        c.run(["scontrol", "delete", "ReservationName=maint"])
        c.run(["scontrol", "update", "NodeName=gpu-a,gpu-b", "State=RESUME"])
        c.wait_nodes_idle(["gpu-a", "gpu-b"])
        c.run(["scontrol", "update", "NodeName=gpu-c", "State=DOWN", "Reason=GPU fell off the bus"])
        save("nodes_down.txt", out(node()))
        c.run(["scontrol", "update", "NodeName=gpu-c", "State=RESUME"])
        c.wait_nodes_idle()

        # accounting: requeue, array, cancel, failure
        rq = c.submit(gres="gpu:rtx3090:1", node="gpu-b", name="gpupool-requeued", seconds=600)
        c.run(["scontrol", "requeue", str(rq)])
        c.wait_job_state(rq, {"PENDING"})
        c.run(["scontrol", "update", f"JobId={rq}", "StartTime=now"])  # requeued jobs wait ~2 min otherwise
        c.wait_job_state(rq, {"RUNNING"})
        arr = c.run(["sbatch", "--parsable", "--array=0-1", "--gres=gpu:a6000:1", "--nodelist=gpu-a",
                     "--job-name=array", "--output=/dev/null", "--chdir=/tmp", "--mem=100M",
                     "--wrap", "exec sleep 1"]).stdout.strip()
        bad = c.run(["sbatch", "--parsable", "--gres=gpu:rtx3090:9", "--output=/dev/null", "--wrap", "true"],
                    check=False)
        print(f"impossible job: {bad.stderr.strip()}", file=sys.stderr)
        running = c.submit(gres="gpu:a6000:1", node="gpu-c", name="gpupool-bob", comment="gpupool:bob",
                           user="nobody", seconds=600)
        print(f"array job {arr}", file=sys.stderr)
        poll(lambda: set(c.job_ids()) <= {rq, running}, 30, "the array job to finish")
        for j in c.job_ids():
            if j not in (rq, running):
                c.wait_job_done(j)
        save("sdiag.txt", out(["sdiag"]))
        last = int(c.run(["date", "+%s"]).stdout.strip()) + 1
        window = sacct_argv(datetime.fromtimestamp(int(first), timezone.utc),
                            datetime.fromtimestamp(last, timezone.utc))
        # slurmctld sends the start of array tasks to slurmdbd only every few
        # seconds; the second task gets the id after "running".
        want = {str(j) for j in range(1, running + 2)}
        poll(lambda: want <= {ln.split("\x1f")[0] for ln in out(window).splitlines()[1:]}, 60,
             "every job in the sacct window")
        save("sacct_mixed.txt", out(window))
        save("squeue_running.txt", out(["squeue", "--noheader", "--states=all", f"--jobs={rq},{running}",
                                        "--format=%A|%T|%k"]))
        c.cancel(rq, running)
        c.wait_job_done(rq)

        # not responding: takes ~SlurmdTimeout
        hold = c.submit(gres="gpu:rtx3090:2", node="gpu-b", name="held", seconds=600)
        c.stop_slurmd("gpu-b")
        poll(lambda: "NOT_RESPONDING" in out(node("gpu-b")), 90, "gpu-b not responding")
        save("nodes_not_responding.txt", out(node()))
        c.cancel(hold)
    finally:
        c.stop()


if __name__ == "__main__":
    main()
