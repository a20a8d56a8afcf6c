"""The Slurm usage source on sacct output captured from the real test cluster.

``data/sacct_mixed.txt`` (see tests/slurm/capture_outputs.py), times as
offsets from T = 1795386676 (epoch seconds), GPU types a6000 / rtx3090:

======  ========  ===========  =========  ===========================  ============================
job     user      start..end   GPUs       name                         note
======  ========  ===========  =========  ===========================  ============================
1       root      0..3         a6000 x1   gpupool-alice                comment "gpupool:alice"
2       root      3..10        a6000 x1   b                            cancelled
3       daemon    6..22        a6000 x1   c
4       root      9..22        a6000 x1   a2
5       root      12..22       a6000 x2   two gpus with gap
6       root      15..22       rtx3090x2  multi                        two nodes, one GPU each
7       daemon    18..22       a6000 x1   weird|name                   comment "line1\\nline2"
8       root      never..22    -          waits                        cancelled while pending
9       root      24..27       rtx3090x1  keeps gpu-b busy
10      root      30..30       rtx3090x1  gpupool-requeued             REQUEUED (first run)
10      root      33..running  rtx3090x1  gpupool-requeued             second run
12      root      34..34       -          wrap                         FAILED, never ran
13      nobody    36..running  a6000 x1   gpupool-bob                  comment "gpupool:bob" (live)
14, 11  root      36..37       a6000 x1   array (11_0, 11_1)
======  ========  ===========  =========  ===========================  ============================
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path

import pytest

from gpupool_hub.engines.slurm.commands import SlurmCommandError
from gpupool_hub.engines.slurm.accounting import SlurmUsageSource
from gpupool_hub.usage import Usage, UsageSource, UsageUnavailable
from gpupool_hub.engines.slurm.accounting import SACCT_FIELDS, parse_sacct, sacct_argv

DATA = Path(__file__).resolve().parent / "data"
MODELS = {"a6000": "NVIDIA RTX A6000", "rtx3090": "NVIDIA GeForce RTX 3090"}
A6000, RTX3090 = MODELS["a6000"], MODELS["rtx3090"]
T = 1795386676


def at(offset: float) -> datetime:
    return datetime.fromtimestamp(T, timezone.utc) + timedelta(seconds=offset)


class FakeSlurm:
    """Answers sdiag, sacct and squeue from the captured files (or overrides)."""

    def __init__(self, **override: str) -> None:
        self.answers = {
            "sdiag": (DATA / "sdiag.txt").read_text(),
            "sacct": (DATA / "sacct_mixed.txt").read_text(),
            "squeue": (DATA / "squeue_running.txt").read_text(),
            **override,
        }
        self.calls: list[list[str]] = []

    def __call__(self, argv):
        self.calls.append(list(argv))
        answer = self.answers[argv[0]]
        if isinstance(answer, Exception):
            raise answer
        return answer


def source(fake: FakeSlurm | None = None, *, now: datetime | None = None, **kw) -> SlurmUsageSource:
    return SlurmUsageSource(MODELS, runner=fake or FakeSlurm(), clock=lambda: now or at(3600), **kw)


def table(usages: list[Usage]) -> dict[tuple[str, str], Decimal]:
    return {(u.user, u.model): u.gpu_seconds for u in usages}


def test_is_a_usage_source() -> None:
    assert isinstance(source(), UsageSource)


def test_parse_captured_sacct() -> None:
    jobs = parse_sacct((DATA / "sacct_mixed.txt").read_text())
    assert [j.job_id for j in jobs] == ["1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "10", "12", "13", "14",
                                        "11"]
    seven = jobs[6]
    assert seven.name == "weird|name" and seven.comment == "line1\nline2" and seven.user == "daemon"
    assert jobs[2].state == "CANCELLED" and jobs[0].state == "COMPLETED"
    assert jobs[4].gpus == {"a6000": 2} and jobs[5].gpus == {"rtx3090": 2}
    assert jobs[7].start is None and jobs[7].gpus == {}
    assert (jobs[9].state, jobs[9].start, jobs[9].end) == ("REQUEUED", T + 30, T + 30)
    assert (jobs[10].state, jobs[10].end) == ("RUNNING", None)
    assert jobs[13].display_id == "11_0"


def test_whole_window() -> None:
    got = table(source().usage(at(0), at(40)))
    assert got == {
        ("daemon", A6000): Decimal(16 + 4),
        ("nobody", A6000): Decimal(40 - 36),  # running: up to the interval's end
        ("root", A6000): Decimal(3 + 7 + 13 + 2 * 10 + 1 + 1),
        ("root", RTX3090): Decimal(2 * 7 + 3 + 0 + (40 - 33)),
    }
    usages = source().usage(at(0), at(40))
    assert [(u.user, u.model) for u in usages] == sorted((u.user, u.model) for u in usages)


def test_split_exactly_at_a_boundary() -> None:
    first = table(source().usage(at(0), at(14)))
    second = table(source().usage(at(14), at(40)))
    assert first == {("root", A6000): Decimal(3 + 7 + 5 + 2 * 2), ("daemon", A6000): Decimal(8)}
    assert second == {
        ("root", A6000): Decimal(8 + 2 * 8 + 1 + 1),
        ("root", RTX3090): Decimal(2 * 7 + 3 + 7),
        ("daemon", A6000): Decimal(8 + 4),
        ("nobody", A6000): Decimal(4),
    }
    whole = table(source().usage(at(0), at(40)))
    for key in whole:
        assert first.get(key, 0) + second.get(key, 0) == whole[key]


def test_fractional_second_boundaries_are_exact() -> None:
    got = table(source().usage(at(0.5), at(3.25)))
    assert got == {("root", A6000): Decimal("2.5") + Decimal("0.25")}
    fake = FakeSlurm()
    source(fake).usage(at(0.5), at(3.25))
    sacct = next(c for c in fake.calls if c[0] == "sacct")
    # the sacct window covers the interval: start rounded down, end rounded up
    assert "--starttime=2026-11-22T22:31:16" in sacct and "--endtime=2026-11-22T22:31:20" in sacct


def test_running_job_counts_up_to_the_interval_end_only() -> None:
    assert table(source().usage(at(33), at(35))) == {("root", RTX3090): Decimal(2)}
    assert table(source().usage(at(100), at(200))) == {("root", RTX3090): Decimal(100),
                                                       ("nobody", A6000): Decimal(100)}


def test_same_interval_same_answer() -> None:
    s = source()
    assert s.usage(at(0), at(40)) == s.usage(at(0), at(40))


def test_filters() -> None:
    assert table(source(job_name_prefix="gpupool-").usage(at(0), at(40))) == {
        ("root", A6000): Decimal(3), ("root", RTX3090): Decimal(7), ("nobody", A6000): Decimal(4),
    }
    # comments: job 1's from slurmdbd, running job 13's from slurmctld ("gpupool:bob"),
    # running job 10 has none ("(null)")
    assert table(source(comment_prefix="gpupool:").usage(at(0), at(40))) == {
        ("root", A6000): Decimal(3), ("nobody", A6000): Decimal(4),
    }
    assert table(source(users=["daemon", "nobody"]).usage(at(0), at(40))) == {
        ("daemon", A6000): Decimal(20), ("nobody", A6000): Decimal(4),
    }
    assert table(source(users=["daemon"], job_name_prefix="c").usage(at(0), at(40))) == {
        ("daemon", A6000): Decimal(16),
    }


def test_user_of_maps_jobs_to_hub_users() -> None:
    def hub_user(job):
        return job.comment.split(":", 1)[1] if job.comment.startswith("gpupool:") else None

    got = table(source(comment_prefix="gpupool:", user_of=hub_user).usage(at(0), at(40)))
    assert got == {("alice", A6000): Decimal(3), ("bob", A6000): Decimal(4)}


def test_charges_list_every_job_part() -> None:
    charges = source(job_name_prefix="gpupool-").charges(at(0), at(40))
    assert [(c.job.job_id, c.job.start - T, c.gres_type, c.gpus, c.seconds) for c in charges] == [
        ("1", 0, "a6000", 1, Decimal(3)),
        ("10", 30, "rtx3090", 1, Decimal(0)),
        ("10", 33, "rtx3090", 1, Decimal(7)),
        ("13", 36, "a6000", 1, Decimal(4)),
    ]


def test_user_names_stay_out_of_the_command_line() -> None:
    fake = FakeSlurm()
    source(fake, users=["--help; rm -rf /", "daemon"]).usage(at(0), at(40))
    assert all("daemon" not in arg and "rm -rf" not in arg for call in fake.calls for arg in call)
    sacct = next(c for c in fake.calls if c[0] == "sacct")
    assert sacct == sacct_argv(at(0), at(40))
    assert "--allusers" in sacct and "--allocations" in sacct and "--duplicates" in sacct
    assert f"--format={','.join(SACCT_FIELDS)}" in sacct


# ---------------------------------------------------------------------------
# refusals: nothing is charged
# ---------------------------------------------------------------------------


def test_unsettled_interval() -> None:
    with pytest.raises(UsageUnavailable, match="not settled yet"):
        source(now=at(40 + 59)).usage(at(0), at(40))
    assert source(now=at(40 + 60)).usage(at(0), at(40))
    assert source(now=at(40), settle_seconds=0).usage(at(0), at(40))


def test_records_still_queued_for_slurmdbd() -> None:
    sdiag = (DATA / "sdiag.txt").read_text().replace("DBD Agent queue size: 0", "DBD Agent queue size: 3")
    with pytest.raises(UsageUnavailable, match="3 accounting record"):
        source(FakeSlurm(sdiag=sdiag)).usage(at(0), at(40))
    assert source(FakeSlurm(sdiag=sdiag), check_dbd_queue=False).usage(at(0), at(40))
    with pytest.raises(UsageUnavailable, match="DBD Agent queue size"):
        source(FakeSlurm(sdiag="sdiag: no accounting\n")).usage(at(0), at(40))


@pytest.mark.parametrize(
    ("squeue", "message"),
    [
        ("10|RUNNING|(null)\n13|COMPLETED|gpupool:bob\n",
         "job 13 as RUNNING without an end, but slurmctld says COMPLETED: accounting is behind"),
        ("10|RUNNING|(null)\n", "job 13 as RUNNING without an end, but slurmctld says it no longer exists"),
        ("10|RUNNING|(null)\n13|PENDING|gpupool:bob\n", "job 13 as RUNNING without an end, but slurmctld says "
                                                        "PENDING"),
        (SlurmCommandError("'squeue ...' failed with exit status 1: slurm_load_jobs error: Invalid job id "
                           "specified"), "job 10 as RUNNING without an end, but slurmctld says it no longer exists"),
        (SlurmCommandError("'squeue ...' failed with exit status 1: Unable to contact slurm controller"),
         "Unable to contact slurm controller"),
    ],
)
def test_slurmdbd_behind_slurmctld(squeue, message: str) -> None:
    with pytest.raises(UsageUnavailable, match=message):
        source(FakeSlurm(squeue=squeue)).usage(at(0), at(40))
    # an interval without open jobs needs no slurmctld view
    assert source(FakeSlurm(squeue=squeue)).usage(at(0), at(30))


def test_just_started_job_still_pending_in_slurmdbd() -> None:
    """slurmdbd first stores a starting job as PENDING with a start time: charge it only once it runs."""
    sacct = (DATA / "sacct_mixed.txt").read_text().replace(
        "\x1fUnknown\x1fRUNNING\x1fbilling=1,cpu=1,gres/gpu:a6000=1",
        "\x1fUnknown\x1fPENDING\x1fbilling=1,cpu=1,gres/gpu:a6000=1")
    assert "PENDING\x1fbilling" in sacct  # job 13
    # slurmctld says it is still pending: not charged
    got = table(source(FakeSlurm(sacct=sacct, squeue="10|RUNNING|(null)\n13|PENDING|gpupool:bob\n"))
                .usage(at(0), at(40)))
    assert ("nobody", A6000) not in got and got[("root", RTX3090)] == Decimal(24)
    # slurmctld says it runs: slurmdbd is behind
    with pytest.raises(UsageUnavailable, match="job 13 as PENDING without an end, but slurmctld says RUNNING"):
        source(FakeSlurm(sacct=sacct)).usage(at(0), at(40))


def test_unmapped_gpu_type() -> None:
    s = SlurmUsageSource({"a6000": A6000}, runner=FakeSlurm(), clock=lambda: at(3600))
    with pytest.raises(UsageUnavailable, match="job 6 used GPU GRES type 'rtx3090'.*not in the GRES-to-model map"):
        s.usage(at(0), at(40))
    assert s.usage(at(0), at(3))  # only a6000 in there


def _sacct(*records: str) -> str:
    return "\n".join(["\x1f".join(SACCT_FIELDS), *records, ""])


def _rec(tres: str = "gres/gpu:a6000=1,gres/gpu=1", start: str = str(T), end: str = str(T + 10),
         job: str = "1") -> str:
    return "\x1f".join([job, job, "root", start, end, "COMPLETED", tres, "n1", "name", ""])


@pytest.mark.parametrize(
    ("sacct", "message"),
    [
        ("JobID|User\n1|root\n", "sacct header is"),
        (_sacct(_rec(tres="gres/gpu=2,cpu=1")), "does not say of which type; add every type to slurm.conf "
                                                "AccountingStorageTRES"),
        (_sacct(_rec(tres="gres/gpu:a6000=1,gres/gpu=2")), "counts 2 GPUs but its typed entries add up to 1"),
        (_sacct(_rec(tres="gres/gpu:a6000=x")), "is not a whole number"),
        (_sacct(_rec(start="yesterday")), "cannot read Start time 'yesterday'"),
        (_sacct(_rec(start=str(T + 20))), "ends .* before it starts"),
        (_sacct(_rec(job="1_2")), "JobIDRaw '1_2'"),
        (_sacct(_rec() + "\x1fextra"), "record with 11 fields, expected 10"),
        (_sacct("1\x1f1\x1froot"), "incomplete record"),
        (SlurmCommandError("'sacct ...' failed with exit status 1: sacct: error: Problem talking to the database"),
         "Problem talking to the database"),
    ],
)
def test_bad_sacct_output(sacct, message: str) -> None:
    with pytest.raises(UsageUnavailable, match=message):
        source(FakeSlurm(sacct=sacct)).usage(at(0), at(40))


def test_iso_times_are_read_as_utc() -> None:
    """If SLURM_TIME_FORMAT were ignored, times come as ISO in the command's TZ=UTC."""
    sacct = _sacct(_rec(start="2026-11-22T22:31:16", end="2026-11-22T22:31:26"))
    assert table(source(FakeSlurm(sacct=sacct)).usage(at(0), at(40))) == {("root", A6000): Decimal(10)}


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        source().usage(datetime(2026, 1, 1), datetime(2026, 1, 2))
    with pytest.raises(ValueError, match="empty interval"):
        source().usage(at(10), at(10))
    with pytest.raises(ValueError, match="models"):
        SlurmUsageSource({})
    with pytest.raises(TypeError, match="not one string"):
        SlurmUsageSource(MODELS, users="alice")
