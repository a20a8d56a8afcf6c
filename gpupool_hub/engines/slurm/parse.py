"""Slurm's printed text as plain values: ``Key=Value`` records, hostlists, index lists,
GRES strings, ``scontrol show job`` and ``squeue`` lines. Pure: no process is started
here (that is :mod:`gpupool_hub.engines.slurm.commands`). The nodes are read in
:mod:`gpupool_hub.engines.slurm.scontrol_nodes`.
"""

from __future__ import annotations

import re
from datetime import datetime, timezone
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from .commands import SlurmOutputError

__all__ = [
    "GresItem",
    "QueueEntry",
    "SQUEUE_FORMAT",
    "SlurmJob",
    "expand_hostlist",
    "parse_gres",
    "parse_index_list",
    "parse_job",
    "parse_record",
    "parse_squeue",
]


# ---------------------------------------------------------------------------
# Generic pieces: "Key=Value Key=Value" records, hostlists, index lists, GRES
# ---------------------------------------------------------------------------

_KEY = re.compile(r"(?:^|(?<=\s))([A-Za-z][A-Za-z0-9_]*(?:[:/][A-Za-z0-9_*]+)*)=")

#: Keys of ``scontrol show node`` (22.05 to 24.x). Inside a free-text value
#: (Reason, Comment, ...) only one of these ends the value, so a reason such
#: as "bad fan x=3" stays whole.
NODE_KEYS = frozenset("""
NodeName Arch CoresPerSocket CPUAlloc CPUEfctv CPUTot CPULoad AvailableFeatures ActiveFeatures Gres
GresDrain GresUsed NodeAddr NodeHostName Port Version OS RealMemory AllocMem FreeMem Sockets Boards
State ThreadsPerCore TmpDisk Weight Owner MCS_label Partitions BootTime SlurmdStartTime LastBusyTime
ResumeAfterTime CfgTRES AllocTRES CapWatts CurrentWatts AveWatts ExtSensorsJoules ExtSensorsWatts
ExtSensorsTemp Reason Comment Extra CoreSpecCount CPUSpecList MemSpecLimit InstanceId InstanceType
NextState Topology LastBusyTime Features Cluster CPUs ResvCores
""".split())
NODE_FREE_TEXT = frozenset({"Reason", "Comment", "Extra", "OS"})

#: Keys of ``scontrol -d show job -o``; free text: names, comments, paths.
JOB_KEYS = frozenset("""
JobId ArrayJobId ArrayTaskId ArrayTaskThrottle HetJobId HetJobOffset HetJobIdSet JobName UserId GroupId
MCS_label Priority Nice Account QOS JobState Reason Dependency Requeue Restarts BatchFlag Reboot ExitCode
DerivedExitCode RunTime TimeLimit TimeMin SubmitTime EligibleTime AccrueTime StartTime EndTime Deadline
SuspendTime SecsPreSuspend LastSchedEval Scheduler Partition AllocNode:Sid ReqNodeList ExcNodeList
NodeList BatchHost NumNodes NumCPUs NumTasks CPUs/Task ReqB:S:C:T TRES Socks/Node NtasksPerN:B:S:C
CoreSpec JOB_GRES Nodes CPU_IDs Mem GRES MinCPUsNode MinMemoryNode MinMemoryCPU MinTmpDiskNode Features
DelayBoot OverSubscribe Contiguous Licenses Network Command WorkDir Comment AdminComment SystemComment
StdErr StdIn StdOut Power TresPerNode TresPerJob TresPerTask TresPerSocket TresBind TresFreq
MemPerTres CpusPerTres Reservation Partition ReqFeatures ClusterFeatures NtasksPerTRES
MailUser MailType CronJob CrontabSpec Prefer Container ContainerID SelinuxContext ResvPort
""".split())
JOB_FREE_TEXT = frozenset({"JobName", "Comment", "AdminComment", "SystemComment", "Command", "WorkDir",
                           "StdErr", "StdIn", "StdOut", "Reason", "Dependency"})


def parse_record(line: str, *, free_text: frozenset[str] = frozenset(),
                 known: frozenset[str] = frozenset()) -> list[tuple[str, str]]:
    """``Key=Value Key=Value`` (one ``scontrol ... -o`` line) as ordered pairs.

    Values may hold spaces (``OS=Linux 6.1 #1 SMP``) and ``=`` (``TRES=cpu=1``);
    a new key starts at whitespace followed by ``Name=``. After a key listed in
    ``free_text`` only a key in ``known`` starts the next pair. Keys may repeat
    (the per-node ``Nodes=``/``GRES=`` groups of a job), hence a list.
    """
    matches = list(_KEY.finditer(line))
    if not matches or line[: matches[0].start()].strip():
        raise SlurmOutputError(f"expected 'Key=Value ...', got {line[:200]!r}")
    pairs: list[tuple[str, str]] = []
    key, start = matches[0].group(1), matches[0].end()
    for m in matches[1:]:
        if key in free_text and m.group(1) not in known:
            continue
        pairs.append((key, line[start:m.start()].strip()))
        key, start = m.group(1), m.end()
    pairs.append((key, line[start:].strip()))
    return pairs


def _first(pairs: Sequence[tuple[str, str]], key: str) -> str | None:
    for k, v in pairs:
        if k == key:
            return v
    return None


_NULL = {"", "(null)", "N/A", "None", "none"}


def _int_field(value: str | None, key: str, where: str) -> int:
    if value is None:
        raise SlurmOutputError(f"{where}: {key}= is missing")
    if not re.fullmatch(r"\d+", value):
        raise SlurmOutputError(f"{where}: {key}={value!r} is not a whole number")
    return int(value)


def _split_top(text: str, sep: str = ",") -> list[str]:
    """Split at ``sep`` outside brackets/parentheses (``a[1-2],b`` -> ``a[1-2]``, ``b``)."""
    parts: list[str] = []
    depth = 0
    cur: list[str] = []
    for ch in text:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
            if depth < 0:
                raise SlurmOutputError(f"unbalanced brackets in {text!r}")
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    if depth:
        raise SlurmOutputError(f"unbalanced brackets in {text!r}")
    parts.append("".join(cur))
    return parts


def expand_hostlist(text: str) -> list[str]:
    """Slurm hostlist to names: ``gpu-[01-03,7],login`` -> gpu-01, gpu-02, gpu-03, gpu-7, login."""
    text = text.strip()
    if text in _NULL or text == "None assigned":
        return []
    out: list[str] = []
    for part in _split_top(text):
        if not part:
            raise SlurmOutputError(f"empty host name in hostlist {text!r}")
        out.extend(_expand_one(part, text))
    return out


def _expand_one(part: str, whole: str) -> list[str]:
    m = re.search(r"\[([^\[\]]*)\]", part)
    if not m:
        if "[" in part or "]" in part:
            raise SlurmOutputError(f"bad hostlist {whole!r}")
        return [part]
    prefix, suffix = part[: m.start()], part[m.end():]
    names = []
    for rng in m.group(1).split(","):
        lo, dash, hi = rng.partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise SlurmOutputError(f"bad range {rng!r} in hostlist {whole!r}")
        width = len(lo)
        a, b = int(lo), int(hi) if dash else int(lo)
        if b < a or b - a > 100_000:
            raise SlurmOutputError(f"bad range {rng!r} in hostlist {whole!r}")
        names.extend(f"{prefix}{i:0{width}d}" for i in range(a, b + 1))
    return [n for name in names for n in _expand_one(name + suffix, whole)] if "[" in suffix else \
        [name + suffix for name in names]


def parse_index_list(text: str) -> tuple[int, ...]:
    """``0-1,3`` -> (0, 1, 3); ``N/A`` or empty -> ()."""
    text = text.strip()
    if text in _NULL:
        return ()
    out: list[int] = []
    for rng in text.split(","):
        lo, dash, hi = rng.strip().partition("-")
        if not lo.isdigit() or (dash and not hi.isdigit()):
            raise SlurmOutputError(f"bad GPU index list {text!r}")
        a, b = int(lo), int(hi) if dash else int(lo)
        if b < a:
            raise SlurmOutputError(f"bad GPU index range {rng!r} in {text!r}")
        out.extend(range(a, b + 1))
    if len(set(out)) != len(out):
        raise SlurmOutputError(f"GPU index list {text!r} names an index twice")
    return tuple(out)


@dataclass(frozen=True)
class GresItem:
    """One entry of a GRES string: ``gpu:a6000:2(IDX:0-1)``."""

    name: str
    type: str | None
    count: int
    indices: tuple[int, ...] | None  # from (IDX:...), None when not given
    extra: tuple[tuple[str, str], ...] = ()  # other (KEY:value) groups, e.g. ("S", "0-1")


_GRES_ITEM = re.compile(r"^(?P<spec>[^()]+)(?P<groups>(?:\([^()]*\))*)$")
_SUFFIX = {"": 1, "K": 1024, "M": 1024**2, "G": 1024**3, "T": 1024**4, "P": 1024**5}


def _gres_count(text: str, where: str) -> int:
    m = re.fullmatch(r"(\d+)([KMGTP]?)", text)
    if not m:
        raise SlurmOutputError(f"{where}: bad GRES count {text!r}")
    return int(m.group(1)) * _SUFFIX[m.group(2)]


def parse_gres(text: str, where: str = "GRES") -> list[GresItem]:
    """A GRES list (``Gres=``, ``GresUsed=``, a job's ``GRES=``) as items; ``(null)`` is empty."""
    text = text.strip()
    if text in _NULL:
        return []
    items = []
    for raw in _split_top(text):
        raw = raw.strip()
        m = _GRES_ITEM.match(raw)
        if not m:
            raise SlurmOutputError(f"{where}: cannot read GRES entry {raw!r} in {text!r}")
        parts = m.group("spec").split(":")
        name = parts[0]
        if not re.fullmatch(r"[A-Za-z0-9_./-]+", name):
            raise SlurmOutputError(f"{where}: bad GRES name in {raw!r}")
        gtype: str | None = None
        count: int | None = None
        if len(parts) == 2:
            if re.fullmatch(r"\d+[KMGTP]?", parts[1]):
                count = _gres_count(parts[1], where)
            else:
                gtype = parts[1]
        elif len(parts) == 3:
            gtype = parts[1]
            count = _gres_count(parts[2], where)
        elif len(parts) > 3:
            raise SlurmOutputError(f"{where}: cannot read GRES entry {raw!r}")
        if gtype is not None and not re.fullmatch(r"[^\s:,()]+", gtype):
            raise SlurmOutputError(f"{where}: bad GRES type in {raw!r}")
        indices: tuple[int, ...] | None = None
        extra: list[tuple[str, str]] = []
        for group in re.findall(r"\(([^()]*)\)", m.group("groups")):
            key, colon, value = group.partition(":")
            if not colon:  # e.g. a shard's per-GPU use "(0/4,0/4)"
                key, value = "", group
            if key == "IDX":
                indices = parse_index_list(value)
            elif key == "CNT" and count is None:
                count = _gres_count(value, where)
            else:
                extra.append((key, value))
        if count is None:
            count = len(indices) if indices is not None else 1
        # a shard's count is shards, its IDX the GPUs they are on: "shard:a6000:8(IDX:1)"
        if indices is not None and indices and count != len(indices) and name not in ("shard", "mps"):
            raise SlurmOutputError(
                f"{where}: {raw!r} counts {count} but lists {len(indices)} indices"
            )
        items.append(GresItem(name, gtype, count, indices, tuple(extra)))
    return items


def _records(text: str, first_key: str, what: str) -> list[str]:
    """``scontrol -o`` output as records: one per line, except that a newline inside a
    free-text value (a job comment) continues the record on the next line."""
    records: list[str] = []
    for line in text.split("\n"):
        if line.startswith(first_key + "="):
            records.append(line)
        elif records:
            if line.strip():
                records[-1] += "\n" + line
        elif line.strip():
            raise SlurmOutputError(f"expected {what} records starting with {first_key}=, got {line[:200]!r}")
    return records


# ---------------------------------------------------------------------------
# Jobs and the queue
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SlurmJob:
    job_id: int
    name: str
    user: str
    state: str
    reason: str | None
    nodes: tuple[str, ...]
    #: node -> GRES type -> GPU indices Slurm bound there
    gpus: Mapping[str, Mapping[str, tuple[int, ...]]] = field(default_factory=dict)
    exit_code: str | None = None  # "127:0" (status:signal) once the job ended
    stdout: str | None = None  # the batch script's output file, as slurmctld resolved it
    #: node -> GRES type -> (GPU indices whose shards it holds, shard count): ``GRES=shard:a6000:8(IDX:1)``
    shards: Mapping[str, Mapping[str, tuple[tuple[int, ...], int]]] = field(default_factory=dict)
    #: when it started running (``StartTime``, epoch seconds with ``SLURM_TIME_FORMAT=%s``); None while pending
    start_time: datetime | None = None
    comment: str = ""  # ``--comment``: the hub's servers carry their allocation (``gpupool-allocation=<id>``)

    def gpu_indices(self, node: str) -> tuple[int, ...]:
        return tuple(sorted(i for idx in self.gpus.get(node, {}).values() for i in idx))

    def shard_indices(self, node: str) -> tuple[int, ...]:
        """The GPUs whose shards (``gres/shard``) the job holds on ``node``."""
        return tuple(sorted({i for idx, _ in self.shards.get(node, {}).values() for i in idx}))


#: the comment the gpupool-slurm spawner gives every server's job, before the allocation id
ALLOCATION_COMMENT = "gpupool-allocation="

_ALLOCATION_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


def allocation_of(comment: str) -> str | None:
    """The allocation id in a job comment written by the spawner, or None."""
    if not comment.startswith(ALLOCATION_COMMENT):
        return None
    alloc_id = comment[len(ALLOCATION_COMMENT):].strip()
    return alloc_id if _ALLOCATION_ID.fullmatch(alloc_id) else None


def job_records(text: str) -> list[str]:
    """``scontrol -d show job -o`` of several jobs: one record each (a comment may span lines)."""
    return _records(text, "JobId", "job")


def parse_job(text: str) -> SlurmJob:
    """``scontrol -d show job -o <id>`` for one job (not an array: one line expected)."""
    lines = _records(text, "JobId", "job")
    if len(lines) != 1:
        raise SlurmOutputError(f"expected one job record, got {len(lines)}")
    pairs = parse_record(lines[0], free_text=JOB_FREE_TEXT, known=JOB_KEYS)
    job_id = _int_field(_first(pairs, "JobId"), "JobId", "job record")
    where = f"job {job_id}"
    user_raw = _first(pairs, "UserId") or ""
    user = re.sub(r"\(\d+\)$", "", user_raw)
    state = _first(pairs, "JobState")
    if not state:
        raise SlurmOutputError(f"{where}: JobState= is missing")
    reason = _first(pairs, "Reason")
    gpus: dict[str, dict[str, tuple[int, ...]]] = {}
    shards: dict[str, dict[str, tuple[tuple[int, ...], int]]] = {}
    current: list[str] = []
    seen_nodes = False
    for key, value in pairs:
        if key == "Nodes":
            current = expand_hostlist(value)
            seen_nodes = True
        elif key == "GRES" and seen_nodes:
            for item in parse_gres(value, f"{where} GRES="):
                if item.name == "shard" and item.count and item.indices:
                    for node in current:  # shard:a6000:8(IDX:1): 8 shards of GPU 1
                        idx, n = shards.setdefault(node, {}).get(item.type or "", ((), 0))
                        shards[node][item.type or ""] = (tuple(sorted(set(idx) | set(item.indices))),
                                                         n + item.count)
                    continue
                if item.name != "gpu" or item.count == 0:
                    continue
                if item.indices is None:
                    raise SlurmOutputError(f"{where}: GRES={value} gives no GPU indices (IDX); use scontrol -d")
                for node in current:
                    per = gpus.setdefault(node, {})
                    key_type = item.type or ""
                    per[key_type] = tuple(sorted(set(per.get(key_type, ())) | set(item.indices)))
    return SlurmJob(
        job_id=job_id,
        name=_first(pairs, "JobName") or "",
        user=user,
        state=state,
        reason=reason if reason and reason not in _NULL else None,
        nodes=tuple(expand_hostlist(_first(pairs, "NodeList") or "")),
        gpus=gpus,
        exit_code=_first(pairs, "ExitCode"),
        stdout=_first(pairs, "StdOut") or None,
        shards=shards,
        start_time=_epoch(_first(pairs, "StartTime")) if state not in ("PENDING", "CONFIGURING") else None,
        comment=_first(pairs, "Comment") or "",
    )


def _epoch(value: str | None) -> datetime | None:
    """An ``scontrol`` time printed as epoch seconds (the runner sets ``SLURM_TIME_FORMAT=%s``), else None
    (``Unknown``, ``None``, or a runner that did not set it)."""
    if value is None or not value.isdigit() or int(value) == 0:
        return None
    return datetime.fromtimestamp(int(value), tz=timezone.utc)


#: squeue --format for :func:`parse_squeue`: job id, state, reason, user, nodes, name (last: free text).
SQUEUE_FORMAT = "%A|%T|%r|%u|%N|%j"


@dataclass(frozen=True)
class QueueEntry:
    job_id: int
    state: str
    reason: str | None  # why it is pending ("Resources", "Priority", ...); None when running
    user: str
    nodes: tuple[str, ...]
    name: str


def parse_squeue(text: str) -> list[QueueEntry]:
    """``squeue --noheader --format=%A|%T|%r|%u|%N|%j`` lines."""
    out = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split("|", 5)
        if len(parts) != 6 or not parts[0].isdigit() or not re.fullmatch(r"[A-Z_]+", parts[1]):
            raise SlurmOutputError(f"cannot read squeue line {line[:200]!r} (expected {SQUEUE_FORMAT})")
        job_id, state, reason, user, nodes, name = parts
        out.append(QueueEntry(
            job_id=int(job_id), state=state, reason=None if reason in _NULL else reason,
            user=user, nodes=tuple(expand_hostlist(nodes)), name=name,
        ))
    return out
