"""GPU usage from Slurm accounting (``sacct``, backed by slurmdbd).

What is charged is what Slurm *allocated*: a job holding two GPUs from its
start to its end pays for two GPUs for that time, busy or not, exactly as the
allocation-records source does for the hub's own servers. Per job and GRES
type the GPU count comes from ``AllocTRES`` (``gres/gpu:a6000=2``); the
time from the job's ``Start``/``End`` (whole seconds, as slurmdbd stores them)
cut to the interval ``[start, end)``. A job still running is counted up to
the interval's end. Sums are integers times :class:`~decimal.Decimal`
seconds, so re-running an interval gives the same answer to the digit.

When is an interval final? Slurm records job starts and ends in slurmdbd
through slurmctld's agent queue, so a record can arrive late (array tasks
only every few seconds, and a just-started job is left out of sacct's time
window until its eligible time is stored). The source therefore refuses (:class:`~gpupool_hub.usage.base.UsageUnavailable`) when

* the interval ended less than ``settle_seconds`` ago;
* ``check_dbd_queue`` and slurmctld's "DBD Agent queue size" (``sdiag``) is
  not zero, i.e. records are still on their way to slurmdbd;
* slurmdbd and slurmctld (``squeue``) disagree about a job without an End:
  slurmdbd has it running and slurmctld not, or slurmdbd still has it
  PENDING (as it briefly does with a job that has just started, start time
  already set) and slurmctld has it running: accounting is behind. A job
  both have as pending is not charged;
* anything is unreadable, or a GPU type has no model in the map.

Selecting jobs: ``job_name_prefix`` and/or ``comment_prefix`` limit the
charge to the hub's own servers, ``users`` to jobs of the given Slurm users;
every filter given must match. User names are compared in Python, never put
into the command line. The comment of a finished job comes from slurmdbd
(it needs ``AccountingStoreFlags=job_comment``), that of a running job from
slurmctld, because slurmdbd only stores the comment when a job ends.
"""

from __future__ import annotations

import logging
import os
import re
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from datetime import datetime, timedelta, timezone
from decimal import Decimal

from gpupool_hub.engines.slurm.commands import Runner, SlurmCommandError, SlurmError, run_slurm
from gpupool_hub.usage.base import Usage, UsageNotSettled, UsageUnavailable

__all__ = ["CLIENT_COMMANDS", "SACCT_FIELDS", "SacctJob", "JobCharge", "JobOwners", "SlurmUsageSource", "accounting_problems",
           "parse_sacct", "sacct_argv"]

log = logging.getLogger(__name__)

#: the Slurm client commands this source runs (the service checks they are on PATH at start-up)
CLIENT_COMMANDS = ("sacct", "sdiag", "squeue")

#: Columns asked from sacct, in this order; the free-text ones last.
SACCT_FIELDS = ("JobIDRaw", "JobID", "User", "Start", "End", "State", "AllocTRES", "NodeList", "JobName", "Comment")
#: ASCII unit separator: cannot be typed into a job name or comment by accident, unlike "|".
DELIMITER = "\x1f"

#: Live (slurmctld) states in which a job holds its allocation.
_HOLDING = {"RUNNING", "SUSPENDED", "CONFIGURING", "STOPPED"}
#: slurmdbd states of a job that holds its allocation (End is unknown).
_DBD_HOLDING = {"RUNNING", "SUSPENDED"}


@dataclass(frozen=True)
class SacctJob:
    """One allocation record (``sacct -X --duplicates``: a requeued job has one per run)."""

    job_id: str  # JobIDRaw: unique per allocation (array tasks, het components)
    display_id: str  # JobID: 1234_5 for an array task
    user: str
    start: int | None  # epoch seconds; None: never started
    end: int | None  # None: still running (as far as slurmdbd knows)
    state: str  # first word: "CANCELLED by 0" -> "CANCELLED"
    gpus: Mapping[str, int]  # GRES type -> count, from AllocTRES
    nodes: str
    name: str
    comment: str

    @property
    def gpu_total(self) -> int:
        return sum(self.gpus.values())


@dataclass(frozen=True)
class JobCharge:
    """The part of one job inside the interval: what a debit is built from (for audits)."""

    job: SacctJob
    user: str  # the hub user it is charged to
    gres_type: str
    model: str
    gpus: int
    seconds: Decimal  # inside [start, end)

    @property
    def gpu_seconds(self) -> Decimal:
        return self.seconds * self.gpus


class JobOwners:
    """A ``user_of`` that answers for a whole interval's jobs at once.

    :class:`SlurmUsageSource` calls :meth:`for_jobs` once per interval with
    every job it may charge and asks the callable it returns about each job,
    so owners kept in a database cost a few queries an interval rather than
    one per job (an hour of 5,000 jobs). ``__call__`` answers for one job;
    both must give the same answers.
    """

    def __call__(self, job: SacctJob) -> str | None:
        raise NotImplementedError("Subclass must provide implementation")

    def for_jobs(self, jobs: Sequence[SacctJob]) -> Callable[[SacctJob], str | None]:
        """Without a bulk read to make: one job at a time."""
        return self


def _utc_epoch(dt: datetime, what: str) -> Decimal:
    if dt.tzinfo is None or dt.utcoffset() is None:
        raise ValueError(f"{what} must be timezone-aware, got {dt!r}")
    delta = dt - datetime(1970, 1, 1, tzinfo=timezone.utc)
    return Decimal(delta.days * 86400 + delta.seconds) + Decimal(delta.microseconds) / 1_000_000


def _sacct_time(dt: datetime, *, ceil: bool) -> str:
    """An sacct --starttime/--endtime value in UTC (the command runs with TZ=UTC)."""
    dt = dt.astimezone(timezone.utc)
    if ceil and dt.microsecond:
        dt = dt + timedelta(seconds=1)
    return dt.replace(microsecond=0, tzinfo=None).isoformat(timespec="seconds")


def sacct_argv(start: datetime, end: datetime) -> list[str]:
    """The sacct command for the interval: every user's allocations, each run of a requeued job."""
    argv = [
        "sacct", "--allusers", "--allocations", "--duplicates", "--parsable2", f"--delimiter={DELIMITER}",
        "--noconvert", f"--format={','.join(SACCT_FIELDS)}",
        f"--starttime={_sacct_time(start, ceil=False)}", f"--endtime={_sacct_time(end, ceil=True)}",
    ]
    return argv


_RECORD_START = re.compile(r"^\d+" + DELIMITER)
_ISO = re.compile(r"\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}")


def _parse_time(value: str, what: str, job: str) -> int | None:
    value = value.strip()
    if value in ("", "Unknown", "None", "N/A"):
        return None
    if value.isdigit():
        return int(value)
    if _ISO.fullmatch(value):  # SLURM_TIME_FORMAT not honoured: the command ran with TZ=UTC
        return int(datetime.fromisoformat(value).replace(tzinfo=timezone.utc).timestamp())
    raise SlurmError(f"job {job}: cannot read {what} time {value!r}")


def _parse_alloc_tres(text: str, job: str) -> dict[str, int]:
    """``gres/gpu:a6000=2,gres/gpu=2,...`` -> {"a6000": 2}; checks typed counts add up to gres/gpu."""
    typed: dict[str, int] = {}
    total: int | None = None
    for item in filter(None, text.split(",")):
        key, eq, value = item.partition("=")
        if not eq:
            raise SlurmError(f"job {job}: cannot read AllocTRES entry {item!r} in {text!r}")
        if key == "gres/gpu" or key.startswith("gres/gpu:"):
            if not value.isdigit():
                raise SlurmError(f"job {job}: AllocTRES {key}={value!r} is not a whole number")
            if key == "gres/gpu":
                total = int(value)
            else:
                typed[key[len("gres/gpu:"):]] = typed.get(key[len("gres/gpu:"):], 0) + int(value)
    typed = {t: n for t, n in typed.items() if n}
    if total is not None and total != sum(typed.values()):
        if not typed:
            raise SlurmError(
                f"job {job} was allocated {total} GPU(s) but AllocTRES ({text}) does not say of which type; "
                "add every type to slurm.conf AccountingStorageTRES, e.g. gres/gpu,gres/gpu:a6000"
            )
        raise SlurmError(
            f"job {job}: AllocTRES ({text}) counts {total} GPUs but its typed entries add up to "
            f"{sum(typed.values())}; a GPU type is missing from AccountingStorageTRES"
        )
    return typed


def parse_sacct(text: str) -> list[SacctJob]:
    """Output of :func:`sacct_argv` (with its header line) as records; SlurmError if anything is off."""
    lines = text.split("\n")
    header = lines[0] if lines else ""
    if header != DELIMITER.join(SACCT_FIELDS):
        raise SlurmError(
            f"sacct header is {header[:300]!r}, expected the fields {', '.join(SACCT_FIELDS)} separated by \\x1f"
        )
    n = len(SACCT_FIELDS)
    # A newline inside a job name or comment (the last two fields) continues a
    # record on the next line: a new record starts only with "<digits>\x1f"
    # once the current one has all its fields.
    raw: list[str] = []
    for line in lines[1:]:
        if raw and (raw[-1].count(DELIMITER) < n - 1 or not _RECORD_START.match(line)):
            raw[-1] += "\n" + line
        else:
            raw.append(line)
    if raw and raw[-1] == "":
        raw.pop()  # the final newline
    elif raw and raw[-1].endswith("\n"):
        raw[-1] = raw[-1][:-1]
    records: list[list[str]] = []
    for text_rec in raw:
        fields = text_rec.split(DELIMITER)
        if len(fields) != n:
            what = "incomplete record" if len(fields) < n else f"record with {len(fields)} fields, expected {n}"
            raise SlurmError(f"sacct output has an {what}: {text_rec[:300]!r}")
        records.append(fields)
    jobs = []
    for rec in records:
        f = dict(zip(SACCT_FIELDS, rec))
        job = f["JobIDRaw"]
        if not re.fullmatch(r"\d+", job):
            raise SlurmError(f"sacct record has JobIDRaw {job!r}, expected a number: {rec!r}")
        jobs.append(SacctJob(
            job_id=job,
            display_id=f["JobID"],
            user=f["User"],
            start=_parse_time(f["Start"], "Start", job),
            end=_parse_time(f["End"], "End", job),
            state=f["State"].split(" ", 1)[0],
            gpus=_parse_alloc_tres(f["AllocTRES"], job),
            nodes=f["NodeList"],
            name=f["JobName"],
            comment=f["Comment"],
        ))
    return jobs


def accounting_problems(show_config: str, models: Mapping[str, str], *, need_comments: bool) -> list[str]:
    """What in ``scontrol show config`` keeps sacct from answering for the given GRES types.

    Checked once at start-up, because each of these would otherwise show up
    only as jobs nobody is charged for (comments) or as an interval that never
    settles (types): slurmdbd accounting at all, the comment of finished jobs
    (``need_comments``: how the hub's servers are recognised), and a typed
    ``gres/gpu:<type>`` TRES per mapped type, without which sacct cannot say
    which model a job used.
    """
    conf: dict[str, str] = {}
    for line in show_config.splitlines():
        key, eq, value = line.partition("=")
        if eq:
            conf[key.strip()] = value.strip()
    problems = []
    if conf.get("AccountingStorageType") != "accounting_storage/slurmdbd":
        problems.append(f"AccountingStorageType is {conf.get('AccountingStorageType', 'not set')!r}; "
                        "GPU time is read from slurmdbd: set accounting_storage/slurmdbd")
    flags = {f.strip() for f in conf.get("AccountingStoreFlags", "").split(",")}
    if need_comments and "job_comment" not in flags:
        problems.append("AccountingStoreFlags lacks job_comment: slurmdbd would forget the comment that names a "
                        "hub server's allocation, and no finished server would be charged")
    tres = {t.strip() for t in conf.get("AccountingStorageTRES", "").split(",")}
    missing = sorted(f"gres/gpu:{t}" for t in models if f"gres/gpu:{t}" not in tres)
    if missing:
        problems.append(f"AccountingStorageTRES lacks {', '.join(missing)}: sacct could not say which GPU model "
                        "a job used; add gres/gpu and one gres/gpu:<type> per GPU type")
    return problems


_SQUEUE_LINE = re.compile(r"^(\d+)\|([A-Z_]+)\|(.*)$")
_SDIAG_QUEUE = re.compile(r"^DBD Agent queue size:\s*(\d+)\s*$", re.MULTILINE)


class SlurmUsageSource:
    """A :class:`~gpupool_hub.usage.base.UsageSource` reading Slurm accounting.

    ``models``
        GRES type -> GPU model name, e.g. ``{"a6000": "NVIDIA RTX A6000"}``
        (the same map the Slurm inventory uses).
    ``job_name_prefix`` / ``comment_prefix`` / ``users``
        Which jobs count; every filter given must match. None of them: all jobs.
    ``user_of``
        Maps a job to the hub user it is charged to (default: its Slurm user);
        returning None skips the job. A :class:`JobOwners` is asked about
        the whole interval's jobs first.
    ``settle_seconds``
        How long after an interval's end it may still change (default 60).
    ``check_dbd_queue``
        Ask slurmctld (``sdiag``) that no accounting records are still queued.
    """

    def __init__(
        self,
        models: Mapping[str, str],
        *,
        job_name_prefix: str | None = None,
        comment_prefix: str | None = None,
        users: Iterable[str] | None = None,
        user_of: Callable[[SacctJob], str | None] | None = None,
        settle_seconds: int = 60,
        check_dbd_queue: bool = True,
        env: Mapping[str, str] | None = None,
        timeout: float = 60,
        runner: Runner | None = None,
        clock: Callable[[], datetime] | None = None,
        name: str = "slurm",
    ) -> None:
        if not isinstance(models, Mapping) or not models:
            raise ValueError("models must map GRES types to GPU model names, e.g. {'a6000': 'NVIDIA RTX A6000'}")
        for k, v in models.items():
            if not isinstance(k, str) or not k or not isinstance(v, str) or not v.strip():
                raise ValueError(f"models: {k!r}: {v!r} must map a GRES type to a model name (strings)")
        if isinstance(users, str):
            raise TypeError("users must be a collection of user names, not one string")
        if settle_seconds < 0:
            raise ValueError("settle_seconds must be >= 0")
        self.models = dict(models)
        self.job_name_prefix = job_name_prefix
        self.comment_prefix = comment_prefix
        self.users = frozenset(users) if users is not None else None
        self.user_of = user_of or (lambda job: job.user)
        self.settle_seconds = settle_seconds
        self.check_dbd_queue = check_dbd_queue
        self.name = name
        if runner is None:
            full_env = {**os.environ, **env} if env is not None else None

            def runner(argv: Sequence[str]) -> str:
                return run_slurm(argv, env=full_env, timeout=timeout)
        self._run = runner
        self._clock = clock or (lambda: datetime.now(timezone.utc))

    def __repr__(self) -> str:
        return f"SlurmUsageSource(models={sorted(self.models)}, name_prefix={self.job_name_prefix!r})"

    # -- public ----------------------------------------------------------------

    def usage(self, start: datetime, end: datetime) -> list[Usage]:
        """GPU-seconds per (user, model) in ``[start, end)``, or UsageUnavailable."""
        totals: dict[tuple[str, str], Decimal] = defaultdict(Decimal)
        for c in self.charges(start, end):
            totals[(c.user, c.model)] += c.gpu_seconds
        return [Usage(user, model, secs) for (user, model), secs in sorted(totals.items()) if secs]

    def charges(self, start: datetime, end: datetime) -> list[JobCharge]:
        """Per job and GPU type, what :meth:`usage` adds up (sorted by job id, type)."""
        t0, t1 = _utc_epoch(start, "start"), _utc_epoch(end, "end")
        if t1 <= t0:
            raise ValueError(f"empty interval: start {start.isoformat()} >= end {end.isoformat()}")
        UsageNotSettled.unless_settled(end, self._clock(), self.settle_seconds, "Slurm may still record jobs in it")
        try:
            if self.check_dbd_queue:
                self._check_dbd_queue()
            jobs = parse_sacct(self._run(sacct_argv(start, end)))
            candidates = [j for j in jobs if self._overlaps(j, t0, t1) and self._prefilter(j)]
            open_jobs = [j for j in candidates if j.end is None]
            live = self._check_open_jobs(open_jobs) if open_jobs else {}
        except SlurmError as e:
            raise UsageUnavailable(f"{self.name}: {e}") from None
        selected: list[SacctJob] = []
        for job in candidates:
            if job.end is None:
                comment = live[job.job_id]
                if comment is None:
                    continue  # not started after all
                job = replace(job, comment=comment)
            if self.comment_prefix is None or job.comment.startswith(self.comment_prefix):
                selected.append(job)
        user_of = self.user_of.for_jobs(selected) if isinstance(self.user_of, JobOwners) else self.user_of
        out: list[JobCharge] = []
        for job in selected:
            user = user_of(job)
            if user is None:
                continue
            assert job.start is not None
            held_from = max(Decimal(job.start), t0)
            held_to = min(Decimal(job.end), t1) if job.end is not None else t1
            seconds = held_to - held_from
            for gres_type, count in sorted(job.gpus.items()):
                model = self.models.get(gres_type)
                if model is None:
                    raise UsageUnavailable(
                        f"{self.name}: job {job.display_id} used GPU GRES type {gres_type!r}, which is not in the "
                        f"GRES-to-model map (it maps: {', '.join(sorted(self.models))}); nothing is charged "
                        "until the map names it"
                    )
                out.append(JobCharge(job, user, gres_type, model, count, seconds))
        out.sort(key=lambda c: (int(c.job.job_id), c.job.start or 0, c.gres_type))
        return out

    def jobs(self, start: datetime, end: datetime) -> list[SacctJob]:
        """The raw allocation records sacct returns for the window (no filters, no checks)."""
        try:
            return parse_sacct(self._run(sacct_argv(start, end)))
        except SlurmError as e:
            raise UsageUnavailable(f"{self.name}: {e}") from None

    def check_accounting(self, *, need_comments: bool) -> None:
        """Start-up check of slurm.conf (:func:`accounting_problems`); SlurmError naming every problem.

        A SlurmCommandError (slurmctld not answering) is left to the caller: charging
        waits for Slurm anyway, so it need not stop a service."""
        problems = accounting_problems(self._run(["scontrol", "show", "config"]), self.models,
                                       need_comments=need_comments)
        if problems:
            raise SlurmError("slurm.conf: " + "; ".join(problems))

    # -- internals -------------------------------------------------------------

    @staticmethod
    def _overlaps(job: SacctJob, t0: Decimal, t1: Decimal) -> bool:
        if job.start is None or not job.gpus:
            return False
        if job.end is not None and job.end < job.start:
            raise SlurmError(f"job {job.display_id} ends ({job.end}) before it starts ({job.start})")
        held_to = Decimal(job.end) if job.end is not None else None
        return Decimal(job.start) < t1 and (held_to is None or held_to > t0)

    def _prefilter(self, job: SacctJob) -> bool:
        if self.users is not None and job.user not in self.users:
            return False
        if self.job_name_prefix is not None and not job.name.startswith(self.job_name_prefix):
            return False
        return True

    def _check_dbd_queue(self) -> None:
        out = self._run(["sdiag"])
        m = _SDIAG_QUEUE.search(out)
        if not m:
            raise SlurmError("sdiag did not report the 'DBD Agent queue size'; is accounting_storage/slurmdbd on?")
        if int(m.group(1)):
            raise SlurmError(
                f"slurmctld still has {m.group(1)} accounting record(s) queued for slurmdbd "
                "(sdiag: DBD Agent queue size); the interval may still change"
            )

    def _check_open_jobs(self, open_jobs: Sequence[SacctJob]) -> dict[str, str | None]:
        """slurmctld's view of the jobs slurmdbd has without an end.

        A job slurmdbd has as RUNNING/SUSPENDED must still hold its allocation
        in slurmctld; one it has as PENDING (slurmdbd briefly keeps a job that
        has just started as PENDING, with a start time) must still be pending,
        and is not charged. Anything else means accounting is behind.

        Returns job id -> comment (slurmdbd has none for running jobs), or
        None for a job that has not started.
        """
        ids = sorted({int(j.job_id) for j in open_jobs})
        argv = ["squeue", "--noheader", "--states=all", "--jobs=" + ",".join(map(str, ids)), "--format=%A|%T|%k"]
        try:
            text = self._run(argv)
        except SlurmCommandError as e:
            if "Invalid job id" not in str(e):
                raise
            text = ""
        live: dict[str, tuple[str, str]] = {}
        last: str | None = None
        for line in text.splitlines():
            m = _SQUEUE_LINE.match(line)
            if m:
                last = m.group(1)
                live[last] = (m.group(2), m.group(3))
            elif last is not None:  # a newline inside the previous job's comment
                live[last] = (live[last][0], live[last][1] + "\n" + line)
            elif line.strip():
                raise SlurmError(f"cannot read squeue line {line[:200]!r}")
        out: dict[str, str | None] = {}
        for job in open_jobs:
            state, comment = live.get(job.job_id, (None, ""))
            if job.state in _DBD_HOLDING and state in _HOLDING:
                out[job.job_id] = "" if comment == "(null)" else comment
            elif job.state not in _DBD_HOLDING and state == "PENDING":
                out[job.job_id] = None
            else:
                raise SlurmError(
                    f"slurmdbd has job {job.display_id} as {job.state} without an end, but slurmctld says "
                    f"{state or 'it no longer exists'}: accounting is behind"
                )
        return out
