"""The pool's nodes, as a Slurm cluster describes them.

Pure parsing plus one I/O seam, :func:`run_slurm`, which runs a Slurm client
command from an argv list (never a shell string) and is the only place that
starts a process. Everything else turns the text Slurm prints into plain
values, so it is tested on captured real output (``tests/slurm/data``) as well
as against a live cluster.

What is read:

* ``scontrol -d show node -o``: CPUs, memory, partitions, features, state
  and, per GRES type, the GPUs configured (``Gres=gpu:a6000:4``) and in use
  (``GresUsed=gpu:a6000:2(IDX:0-1)``), so GPUs held by jobs the hub did not
  start can be subtracted. :meth:`SlurmNode.config` gives the node in the
  format of ``c.GPUPool.nodes`` (see ``gpupool_hub.placement.inventory``).
* ``scontrol -d show job -o <id>``: the GPU indices Slurm really bound on
  each node (``GRES=gpu:a6000:2(IDX:0,2)``).
* ``squeue``: job state and pending reason.

GRES types are mapped to GPU model names by an admin-given map such as
``{"a6000": "NVIDIA RTX A6000"}``; a type missing from it is an error that
names the type, never a guess.

GPU indices: Slurm numbers a node's GPUs across all its GPU types, grouped by
type in the order of the node's ``Gres=`` list (a node with
``Gres=gpu:rtx3090:2,gpu:a6000:2`` has rtx3090 = 0-1, a6000 = 2-3, whatever
the order of its ``gres.conf`` lines). The indices in ``GresUsed`` are checked
against that layout; a mismatch is an error rather than a wrong free list.

Every failure is a :class:`SlurmError` with a message meant for an admin:
a command that is missing, fails or hangs (:class:`SlurmCommandError`), output
that does not look as expected (:class:`SlurmOutputError`), or a GRES type
with no model (:class:`UnmappedGresType`).
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "QueueEntry",
    "Runner",
    "SlurmCommandError",
    "SlurmError",
    "SlurmGpu",
    "SlurmInventory",
    "SlurmJob",
    "SlurmNode",
    "SlurmOutputError",
    "UnmappedGresType",
    "expand_hostlist",
    "parse_gres",
    "parse_index_list",
    "parse_job",
    "parse_node_state",
    "parse_nodes",
    "parse_record",
    "parse_squeue",
    "run_slurm",
    "SQUEUE_FORMAT",
]


# ---------------------------------------------------------------------------
# Errors
# ---------------------------------------------------------------------------


class SlurmError(Exception):
    """Anything that went wrong talking to Slurm or reading what it said."""


class SlurmCommandError(SlurmError):
    """A Slurm command is missing, failed, or did not answer in time."""

    def __init__(self, message: str, *, argv: Sequence[str] = (), returncode: int | None = None,
                 stderr: str = "") -> None:
        super().__init__(message)
        self.argv = list(argv)
        self.returncode = returncode
        self.stderr = stderr


class SlurmOutputError(SlurmError, ValueError):
    """Slurm printed something this module does not understand; nothing is guessed."""


class UnmappedGresType(SlurmError, ValueError):
    """A GPU GRES type has no entry in the GRES-to-model map."""

    def __init__(self, gres_type: str, where: str, known: Iterable[str]) -> None:
        known_list = ", ".join(sorted(known)) or "none"
        super().__init__(
            f"GPU GRES type {gres_type!r} ({where}) is not in the GRES-to-model map "
            f"(it maps: {known_list}); add e.g. {{{gres_type!r}: \"<GPU model name>\"}}"
        )
        self.gres_type = gres_type


# ---------------------------------------------------------------------------
# The one I/O seam
# ---------------------------------------------------------------------------

#: What every Slurm command gets in its environment, whatever the caller's:
#: times in UTC as epoch seconds (sacct, scontrol), untranslated messages.
FORCED_ENV = {"TZ": "UTC", "SLURM_TIME_FORMAT": "%s", "LC_ALL": "C"}

Runner = Callable[[Sequence[str]], str]


def run_slurm(argv: Sequence[str], *, env: Mapping[str, str] | None = None, timeout: float = 30) -> str:
    """Run one Slurm client command and return its standard output.

    ``argv`` is a list (``["scontrol", "-d", "show", "node", "-o"]``), never a
    shell string; callers put only fixed options, job ids and names Slurm
    itself printed into it. ``env`` defaults to this process's environment
    (so ``SLURM_CONF`` is honoured); :data:`FORCED_ENV` is always applied.
    """
    if isinstance(argv, (str, bytes)) or not argv:
        raise TypeError("argv must be a non-empty list of strings, not a shell string")
    args = list(argv)
    for a in args:
        if not isinstance(a, str) or "\0" in a:
            raise TypeError(f"argv elements must be strings without NUL bytes, got {a!r}")
    full_env = dict(os.environ if env is None else env)
    full_env.update(FORCED_ENV)
    cmd = " ".join(args)
    try:
        proc = subprocess.run(
            args, env=full_env, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, check=False,
        )
    except FileNotFoundError:
        raise SlurmCommandError(
            f"{args[0]} not found on PATH; is the Slurm client (Debian: slurm-client) installed?", argv=args
        ) from None
    except PermissionError as e:
        raise SlurmCommandError(f"{args[0]} cannot be run: {e}", argv=args) from None
    except subprocess.TimeoutExpired:
        raise SlurmCommandError(f"{cmd!r} did not answer within {timeout:g}s", argv=args) from None
    stdout = proc.stdout.decode("utf-8", errors="replace")
    stderr = proc.stderr.decode("utf-8", errors="replace").strip()
    if proc.returncode != 0:
        detail = stderr[-1000:] or stdout.strip()[-1000:] or "no output"
        raise SlurmCommandError(
            f"{cmd!r} failed with exit status {proc.returncode}: {detail}",
            argv=args, returncode=proc.returncode, stderr=stderr,
        )
    return stdout


#: what Slurm's client commands print when slurmctld does not answer
_UNREACHABLE = ("unable to contact slurm controller", "socket timed out", "connection refused",
                "zero bytes were transmitted", "controller not responding", "communication connection failure",
                "did not answer within")


def controller_unreachable(message: str) -> bool:
    """Whether a command's error says slurmctld did not answer (a passing outage, not a bug)."""
    text = message.lower()
    return any(marker in text for marker in _UNREACHABLE)


class OutageLog:
    """Say once that Slurm stopped answering, and once that it answers again.

    A refresh every few seconds, or a poll per server, would otherwise log an ERROR with a
    traceback each time slurmctld is down: one WARNING per outage, with the command's
    error, then one INFO with how long it lasted.
    """

    def __init__(self, log: logging.Logger, what: str = "slurmctld") -> None:
        self.log = log
        self.what = what
        self.since: float | None = None
        self.failures = 0

    @property
    def down(self) -> bool:
        return self.since is not None

    def failed(self, error: str) -> None:
        self.failures += 1
        if self.since is None:
            self.since = time.monotonic()
            self.log.warning("%s does not answer: %s (said once until it answers again)", self.what, error)
        else:
            self.log.debug("%s still does not answer: %s", self.what, error)

    def ok(self) -> None:
        if self.since is not None:
            self.log.info("%s answers again, after %.0f s and %d failed command(s)", self.what,
                          time.monotonic() - self.since, self.failures)
        self.since = None
        self.failures = 0


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
        if indices is not None and indices and count != len(indices):
            raise SlurmOutputError(
                f"{where}: {raw!r} counts {count} but lists {len(indices)} indices"
            )
        items.append(GresItem(name, gtype, count, indices, tuple(extra)))
    return items


# ---------------------------------------------------------------------------
# Nodes
# ---------------------------------------------------------------------------

#: Base states in which a node can run new jobs.
_RUNNABLE = {"IDLE", "MIXED", "ALLOCATED"}
#: Flags that do not stop a node from taking new jobs.
_HARMLESS_FLAGS = {"COMPLETING", "PLANNED", "CLOUD", "DYNAMIC_NORM"}
#: sinfo-style suffix characters -> flag names.
_SUFFIX_FLAGS = {"*": "NOT_RESPONDING", "~": "POWERED_DOWN", "#": "POWERING_UP", "!": "POWERING_DOWN",
                 "%": "POWERING_DOWN", "$": "MAINTENANCE", "@": "REBOOT_REQUESTED", "^": "REBOOT_ISSUED",
                 "-": "PLANNED"}
_STATE_WORDS = {
    "DRAIN": "drained", "NOT_RESPONDING": "not responding", "RESERVED": "reserved (advance reservation)",
    "MAINTENANCE": "in maintenance", "FAIL": "failing", "POWERED_DOWN": "powered down",
    "POWERING_DOWN": "powering down", "POWER_DOWN": "powering down", "POWERING_UP": "powering up",
    "REBOOT_REQUESTED": "reboot requested", "REBOOT_ISSUED": "rebooting", "INVALID_REG": "invalid registration",
    "DOWN": "down", "FUTURE": "not yet in service (FUTURE)", "UNKNOWN": "state unknown",
    "ERROR": "in error", "DRAINED": "drained", "DRAINING": "draining",
}


@dataclass(frozen=True)
class NodeState:
    raw: str
    base: str
    flags: frozenset[str]

    @property
    def takes_placements(self) -> bool:
        return self.base in _RUNNABLE and self.flags <= _HARMLESS_FLAGS

    @property
    def why_not(self) -> str | None:
        """Why the node takes no placements (None when it does), e.g. ``"draining"``."""
        if self.takes_placements:
            return None
        words = []
        if self.base not in _RUNNABLE:
            words.append(_STATE_WORDS.get(self.base, f"state {self.base}"))
        for flag in sorted(self.flags - _HARMLESS_FLAGS):
            if flag == "DRAIN" and self.base in ("MIXED", "ALLOCATED"):
                words.append("draining")
            else:
                words.append(_STATE_WORDS.get(flag, flag.lower().replace("_", " ")))
        return ", ".join(dict.fromkeys(words))


def parse_node_state(raw: str) -> NodeState:
    """``MIXED+DRAIN`` / ``IDLE*`` / ``DOWN+NOT_RESPONDING`` -> base state and flags."""
    text = raw.strip().upper()
    if not text or not re.fullmatch(r"[A-Z_]+[*~#!%$@^-]*(\+[A-Z_]+[*~#!%$@^-]*)*", text):
        raise SlurmOutputError(f"cannot read node state {raw!r}")
    words = text.split("+")
    flags: set[str] = set()
    cleaned = []
    for w in words:
        core = w.rstrip("*~#!%$@^-")
        flags.update(_SUFFIX_FLAGS[c] for c in w[len(core):])
        cleaned.append(core)
    base, rest = cleaned[0], cleaned[1:]
    flags.update(rest)
    # sinfo's long names
    if base == "DRAINED":
        base, flags = "IDLE", flags | {"DRAIN"}
    elif base == "DRAINING":
        base, flags = "MIXED", flags | {"DRAIN"}
    elif base in ("MIX",):
        base = "MIXED"
    elif base in ("ALLOC",):
        base = "ALLOCATED"
    return NodeState(raw=raw.strip(), base=base, flags=frozenset(flags))


@dataclass(frozen=True)
class SlurmGpu:
    index: int  # Slurm's GPU index on the node (the IDX in GresUsed / a job's GRES)
    gres_type: str
    model: str
    in_use: bool


@dataclass(frozen=True)
class SlurmNode:
    name: str
    cpus: int
    memory_mib: int
    partitions: tuple[str, ...]
    features: tuple[str, ...]
    state: NodeState
    reason: str | None
    gpus: tuple[SlurmGpu, ...]
    #: GRES type -> GPU count of the types missing from the model map (left out; ``skip_unmapped``)
    unmapped: Mapping[str, int] = field(default_factory=dict)

    @property
    def takes_placements(self) -> bool:
        return self.state.takes_placements

    @property
    def problem(self) -> str | None:
        """What an admin must fix about this node, e.g. an unmapped GRES type (None: nothing)."""
        if not self.unmapped:
            return None
        types = ", ".join(f"{t!r} ({n} GPU{'s' if n != 1 else ''})" for t, n in sorted(self.unmapped.items()))
        return (f"GRES type {types} is not in c.GPUPool.slurm_gpu_models, so these GPUs are left out of the "
                "pool and nobody can be given them; add the type with its GPU model")

    @property
    def why_not(self) -> str | None:
        why = self.state.why_not
        if why and self.reason:
            return f"{why}: {self.reason}"
        return why

    @property
    def gpus_in_use(self) -> frozenset[int]:
        """Indices of GPUs Slurm has allocated to some job (the hub's or anyone's)."""
        return frozenset(g.index for g in self.gpus if g.in_use)

    @property
    def free_gpus(self) -> tuple[int, ...]:
        return tuple(g.index for g in self.gpus if not g.in_use)

    def used_by_type(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for g in self.gpus:
            out.setdefault(g.gres_type, 0)
            if g.in_use:
                out[g.gres_type] += 1
        return out

    def labels(self) -> dict[str, str]:
        labels = {"slurm.partitions": ",".join(self.partitions)}
        for p in self.partitions:
            labels[f"slurm.partition.{p}"] = "true"
        for f in self.features:
            labels[f"slurm.feature.{f}"] = "true"
        return labels

    def config(self) -> dict[str, Any]:
        """The node in ``c.GPUPool.nodes`` format (``load_node`` accepts it)."""
        return {
            "name": self.name,
            "cpu_milli": self.cpus * 1000,
            "memory_mib": self.memory_mib,
            "gpus": [{"index": g.index, "uuid": f"{self.name}/gpu{g.index}", "model": g.model} for g in self.gpus],
            "labels": self.labels(),
        }


def _words(value: str | None) -> tuple[str, ...]:
    if value is None or value.strip() in _NULL:
        return ()
    return tuple(w for w in value.split(",") if w)


def _node_gpus(name: str, gres: str, used: str | None, models: Mapping[str, str],
               unmapped: dict[str, int] | None = None) -> tuple[SlurmGpu, ...]:
    """The node's GPUs of mapped types; with ``unmapped`` (a dict to fill) GPUs of a type missing
    from ``models`` are counted there and left out, else the type raises UnmappedGresType."""
    where = f"node {name}"
    layout: dict[str, list[int]] = {}
    skipped: set[str] = set()
    next_index = 0
    for item in parse_gres(gres, f"{where} Gres="):
        if item.name != "gpu":
            continue
        if item.type is None:
            raise SlurmOutputError(
                f"{where} has GPUs without a GRES type (Gres={gres}); give them a Type= in gres.conf "
                "and slurm.conf so that they map to a GPU model"
            )
        if item.type not in models:
            if unmapped is None:
                raise UnmappedGresType(item.type, where, models)
            unmapped[item.type] = unmapped.get(item.type, 0) + item.count
            skipped.add(item.type)
            next_index += item.count  # Slurm numbers GPUs across all types
            continue
        layout.setdefault(item.type, []).extend(range(next_index, next_index + item.count))
        next_index += item.count
    in_use: set[int] = set()
    if used is not None:
        for item in parse_gres(used, f"{where} GresUsed="):
            if item.name != "gpu" or item.count == 0 or item.type in skipped:
                continue
            if item.type is None or item.type not in layout:
                raise SlurmOutputError(
                    f"{where}: GresUsed={used} names GPU type {item.type!r}, which Gres={gres} does not list"
                )
            if item.indices is None:
                raise SlurmOutputError(
                    f"{where}: GresUsed={used} gives no GPU indices (IDX) although --details was asked for "
                    "(seen while slurmctld restarts); read again at the next refresh"
                )
            bad = set(item.indices) - set(layout[item.type])
            if bad:
                raise SlurmOutputError(
                    f"{where}: GresUsed={used} says {item.type} GPU(s) {sorted(bad)} are in use, but by "
                    f"Gres={gres} the {item.type} GPUs are {layout[item.type]}; cannot tell which GPUs are free"
                )
            in_use.update(item.indices)
    gpus = [SlurmGpu(i, t, models[t], i in in_use) for t, idx in layout.items() for i in idx]
    return tuple(sorted(gpus, key=lambda g: g.index))


def parse_node(line: str, models: Mapping[str, str], skip_unmapped: bool = False) -> SlurmNode:
    pairs = parse_record(line, free_text=NODE_FREE_TEXT, known=NODE_KEYS)
    name = _first(pairs, "NodeName")
    if not name:
        raise SlurmOutputError(f"node record without NodeName=: {line[:200]!r}")
    where = f"node {name}"
    cpus_raw = _first(pairs, "CPUEfctv") or _first(pairs, "CPUTot")
    cpus = _int_field(cpus_raw, "CPUTot", where)
    memory = _int_field(_first(pairs, "RealMemory"), "RealMemory", where)
    state_raw = _first(pairs, "State")
    if not state_raw:
        raise SlurmOutputError(f"{where}: State= is missing")
    try:
        state = parse_node_state(state_raw)
    except SlurmOutputError as e:
        raise SlurmOutputError(f"{where}: {e}") from None
    reason = _first(pairs, "Reason")
    unmapped: dict[str, int] | None = {} if skip_unmapped else None
    gpus = _node_gpus(name, _first(pairs, "Gres") or "(null)", _first(pairs, "GresUsed"), models, unmapped)
    return SlurmNode(
        name=name,
        cpus=cpus,
        memory_mib=memory,
        partitions=_words(_first(pairs, "Partitions")),
        features=_words(_first(pairs, "AvailableFeatures")),
        state=state,
        reason=reason if reason and reason not in _NULL else None,
        gpus=gpus,
        unmapped=unmapped or {},
    )


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


def parse_nodes(text: str, models: Mapping[str, str], skip_unmapped: bool = False) -> list[SlurmNode]:
    """Every node of ``scontrol -d show node -o`` output (one line per node). An unmapped GRES
    type raises UnmappedGresType, or with ``skip_unmapped`` leaves that type's GPUs out
    (``SlurmNode.unmapped``, ``problem``): the rest of the cluster keeps working."""
    _check_models(models)
    lines = _records(text, "NodeName", "node")
    if not lines:
        raise SlurmOutputError("scontrol show node printed no nodes")
    nodes = [parse_node(ln, models, skip_unmapped) for ln in lines]
    seen: set[str] = set()
    for n in nodes:
        if n.name in seen:
            raise SlurmOutputError(f"node {n.name} is listed twice")
        seen.add(n.name)
    return nodes


def _check_models(models: Mapping[str, str]) -> None:
    if not isinstance(models, Mapping):
        raise TypeError("the GRES-to-model map must be a mapping such as {'a6000': 'NVIDIA RTX A6000'}")
    for k, v in models.items():
        if not isinstance(k, str) or not isinstance(v, str) or not k or not v.strip():
            raise ValueError(f"GRES-to-model map: {k!r}: {v!r} must map a GRES type to a model name (strings)")


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

    def gpu_indices(self, node: str) -> tuple[int, ...]:
        return tuple(sorted(i for idx in self.gpus.get(node, {}).values() for i in idx))


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
    current: list[str] = []
    seen_nodes = False
    for key, value in pairs:
        if key == "Nodes":
            current = expand_hostlist(value)
            seen_nodes = True
        elif key == "GRES" and seen_nodes:
            for item in parse_gres(value, f"{where} GRES="):
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
    )


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


# ---------------------------------------------------------------------------
# Facade
# ---------------------------------------------------------------------------


def _key_values(text: str, sep: str) -> dict[str, str]:
    """``Key<sep>Value`` lines (``scontrol show config``: ``=``; cgroup.conf: ``=``, ``#`` comments),
    keys lower-cased (Slurm reads its config keys case-insensitively)."""
    out: dict[str, str] = {}
    for line in text.splitlines():
        key, eq, value = line.split("#", 1)[0].partition(sep)
        if eq and key.strip():
            out[key.strip().lower()] = value.strip()
    return out


def device_confinement_problems(show_config: str, cgroup_conf: str | None, cgroup_path: str) -> list[str]:
    """What keeps Slurm from confining a job to the GPUs it was given (a device cgroup).

    Without it a job's GPUs are hidden only by ``CUDA_VISIBLE_DEVICES``, which the
    job's own code may change: a server could use GPUs the pool charged to someone
    else. Slurm confines devices with ``ConstrainDevices=yes`` in ``cgroup.conf``
    (next to slurm.conf), enforced by the ``task/cgroup`` plugin."""
    conf = _key_values(show_config, "=")
    problems = []
    task = conf.get("taskplugin", "")
    if "task/cgroup" not in task:
        problems.append(f"slurm.conf TaskPlugin is {task or 'not set'!r}: devices are confined by task/cgroup "
                        "(e.g. TaskPlugin=task/cgroup,task/affinity)")
    if cgroup_conf is None:
        problems.append(f"cannot read {cgroup_path}")
    elif _key_values(cgroup_conf, "=").get("constraindevices", "").lower() != "yes":
        problems.append(f"{cgroup_path} does not set ConstrainDevices=yes")
    return problems


class SlurmInventory:
    """Reads nodes, jobs and the queue from a Slurm cluster through one runner.

    ``models`` maps GRES types to model names. ``partitions`` limits the nodes
    to those in any of the given partitions (the ones the hub submits to).
    ``runner`` replaces :func:`run_slurm` (tests); ``env`` is passed to it
    (e.g. ``{"SLURM_CONF": ...}`` merged into this process's environment).
    """

    def __init__(self, models: Mapping[str, str], *, partitions: Iterable[str] | None = None,
                 runner: Runner | None = None, env: Mapping[str, str] | None = None,
                 timeout: float = 30, skip_unmapped: bool = False) -> None:
        _check_models(models)
        self.models = dict(models)
        self.skip_unmapped = skip_unmapped
        self.partitions = frozenset(partitions) if partitions is not None else None
        if runner is None:
            full_env = {**os.environ, **env} if env is not None else None

            def runner(argv: Sequence[str]) -> str:
                return run_slurm(argv, env=full_env, timeout=timeout)
        self._run = runner

    def check_device_confinement(self) -> None:
        """Start-up check (:func:`device_confinement_problems`); SlurmError naming every problem.
        cgroup.conf is read next to the slurm.conf that ``scontrol show config`` names."""
        show = self._run(["scontrol", "show", "config"])
        slurm_conf = _key_values(show, "=").get("slurm_conf") or "/etc/slurm/slurm.conf"
        path = os.path.join(os.path.dirname(slurm_conf), "cgroup.conf")
        try:
            with open(path, encoding="utf-8", errors="replace") as f:
                cgroup_conf: str | None = f.read()
        except OSError:
            cgroup_conf = None
        problems = device_confinement_problems(show, cgroup_conf, path)
        if problems:
            raise SlurmError("Slurm jobs are kept from other GPUs only by CUDA_VISIBLE_DEVICES, which a user can "
                             "change: " + "; ".join(problems) + ". Set ConstrainDevices=yes, or accept hiding by "
                             "environment only with c.GPUPool.slurm_allow_env_only_gpu_hiding = True")

    def nodes(self) -> list[SlurmNode]:
        nodes = parse_nodes(self._run(["scontrol", "--details", "show", "node", "--oneliner"]), self.models,
                            self.skip_unmapped)
        if self.partitions is not None:
            nodes = [n for n in nodes if self.partitions & set(n.partitions)]
        return nodes

    def node_configs(self) -> list[dict[str, Any]]:
        """All nodes as ``c.GPUPool.nodes`` entries (state and GPUs in use are not part of it)."""
        return [n.config() for n in self.nodes()]

    def job(self, job_id: int) -> SlurmJob | None:
        """One job with the GPUs bound to it; None when slurmctld no longer knows it."""
        if isinstance(job_id, bool) or not isinstance(job_id, int) or job_id <= 0:
            raise ValueError(f"job id must be a positive integer, got {job_id!r}")
        try:
            text = self._run(["scontrol", "--details", "show", "job", "--oneliner", str(job_id)])
        except SlurmCommandError as e:
            if "Invalid job id" in str(e):
                return None
            raise
        return parse_job(text)

    def queue(self, job_ids: Iterable[int] | None = None) -> list[QueueEntry]:
        """Jobs slurmctld knows (all states), optionally only the given ids."""
        argv = ["squeue", "--noheader", "--states=all", f"--format={SQUEUE_FORMAT}"]
        if job_ids is not None:
            ids = sorted(set(job_ids))
            for j in ids:
                if isinstance(j, bool) or not isinstance(j, int) or j <= 0:
                    raise ValueError(f"job id must be a positive integer, got {j!r}")
            if not ids:
                return []
            argv.append("--jobs=" + ",".join(map(str, ids)))
        try:
            return parse_squeue(self._run(argv))
        except SlurmCommandError as e:
            if job_ids is not None and "Invalid job id" in str(e):
                return []
            raise
