"""The time replay's workloads: the pod lists of a trace folder, and variants made from them.

A workload is a file ``openb_pod_list_<name>.csv`` in the trace folder (found by its
name, so that a folder of another cluster's trace converted to the openb format
replays the same way). One without ``creation_time``/``deletion_time`` columns
cannot be replayed in time: it is reported as skipped, with the reason.

Variants (``--derive``) are made from each replayable workload, to choose the
estimator's rules and constants by cross-validation rather than on one workload:

- ``share``: a share-heavy subset, 80 % of its GPU pods asking for a share of one GPU
- ``multi``: a multi-GPU subset, 50 % of its GPU pods asking for two GPUs or more
- ``gpuspec``: a third of its GPU pods name the GPU model(s) they accept in
  ``gpu_spec``, one or two models of nodes they fit on (as the trace's own gpuspec
  workloads and every profile of this project do)

Loads and seeds are the replay's ``--load`` and ``--seed`` lists.
"""

from __future__ import annotations

import csv
import random
import zlib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence, Tuple

from gpupool_hub.queue.history import profile_key
from gpupool_hub.placement import Request

USERS = 64
TEAMS = 4
POD_LIST = "openb_pod_list_"
DERIVED = ("share", "multi", "gpuspec")
#: the share of GPU pods of each variant's kind
SHARE_HEAVY = 0.8
MULTI_GPU = 0.5
NAMED_MODEL = 1 / 3


@dataclass
class Pod:
    name: str
    request: Request
    arrive: float
    hold: float
    user: str
    team: int


class NoTimes(Exception):
    """The workload's pod list has no creation/deletion times (multigpu50)."""


def find_workloads(trace: Path) -> List[str]:
    """The workloads of a trace folder, by file name, sorted."""
    return sorted(p.name[len(POD_LIST):-len(".csv")] for p in trace.glob(f"{POD_LIST}*.csv"))


def load_timed_pods(trace: Path, workload: str) -> List[Pod]:
    """GPU pods with their arrival (trace seconds) and hold time."""
    out = []
    path = trace / f"{POD_LIST}{workload}.csv"
    with open(path, newline="") as fh:
        reader = csv.DictReader(fh)
        missing = [c for c in ("creation_time", "deletion_time") if c not in (reader.fieldnames or ())]
        if missing:
            raise NoTimes(f"{path.name} has no {' or '.join(missing)} column: it cannot be replayed in time")
        for row in reader:
            n = int(row["num_gpu"] or 0)
            if n == 0:
                continue
            milli = int(row.get("gpu_milli") or 0) or 1000
            spec = (row.get("gpu_spec") or "").strip()
            models = frozenset(s.casefold() for s in spec.split("|") if s) or None
            kw: Dict[str, Any] = dict(cpu_milli=int(row["cpu_milli"]), memory_mib=int(row["memory_mib"]), models=models)
            req = Request(gpu_milli=milli, **kw) if n == 1 and milli < 1000 else Request(gpus=n, **kw)
            user = zlib.crc32(row["name"].encode()) % USERS
            out.append(Pod(row["name"], req, float(row["creation_time"]),
                           max(1.0, float(row["deletion_time"]) - float(row["creation_time"])),
                           f"u{user:02d}", user % TEAMS))
    if not out:
        raise NoTimes(f"{path.name} has no GPU pod")
    return out


def _mix(pods: List[Pod], kind: Any, share: float, rng: random.Random) -> List[Pod]:
    """A subset where ``share`` of the pods are of ``kind`` (all of them, and as many others as
    that allows; or all the others and as many of them as that allows)."""
    mine = [p for p in pods if kind(p.request)]
    rest = [p for p in pods if not kind(p.request)]
    if not mine:
        return []
    others = min(len(rest), round(len(mine) * (1 - share) / share))
    if others < len(rest):
        picked = mine + rng.sample(rest, others)
    else:
        picked = rest + rng.sample(mine, min(len(mine), round(len(rest) * share / (1 - share))))
    return sorted(picked, key=lambda p: p.arrive)


def _named(pods: List[Pod], nodes: Sequence[dict], rng: random.Random) -> List[Pod]:
    """A third of the pods name one or two models: those of GPUs they fit on, drawn in proportion
    to how many such GPUs there are (people ask for the models a pool has many of)."""
    out = []
    for p in pods:
        r = p.request
        if r.models is None and rng.random() < NAMED_MODEL:
            fits = [n for n in nodes if n["cpu_milli"] >= r.cpu_milli and n["memory_mib"] >= r.memory_mib
                    and n["gpus"]["count"] >= max(r.gpus, 1)]
            if fits:
                weights = [n["gpus"]["count"] for n in fits]
                picked = {n["gpus"]["model"].casefold() for n in rng.choices(fits, weights, k=rng.choice((1, 1, 2)))}
                p = replace(p, request=replace(r, models=frozenset(picked)))
        out.append(p)
    return out


def derive(name: str, pods: List[Pod], nodes: Sequence[dict], kinds: Sequence[str],
           seed: int) -> List[Tuple[str, List[Pod], Optional[str]]]:
    """``(name+kind, pods, why skipped)`` for each variant asked for."""
    out: List[Tuple[str, List[Pod], Optional[str]]] = []
    for kind in kinds:
        rng = random.Random(f"{seed}:{name}:{kind}")
        if kind == "share":
            got = _mix(pods, lambda r: not r.gpus, SHARE_HEAVY, rng)
        elif kind == "multi":
            got = _mix(pods, lambda r: r.gpus > 1, MULTI_GPU, rng)
        elif kind == "gpuspec":
            got = _named(pods, nodes, rng)
        else:
            raise ValueError(f"unknown variant {kind!r}: choose from {', '.join(DERIVED)}")
        out.append((f"{name}+{kind}", got, None if got else f"{name} has no pod of that kind"))
    return out


def resize(pods: List[Pod], n: Optional[int], rng: random.Random) -> List[Pod]:
    """``n`` pods: a random subset, or the trace plus copies of random pods arriving at other pods' times."""
    if n is None or n == len(pods):
        return list(pods)
    if n < len(pods):
        return sorted(rng.sample(pods, n), key=lambda p: p.arrive)
    out = list(pods)
    for i in range(n - len(pods)):
        p, at = rng.choice(pods), rng.choice(pods).arrive
        out.append(Pod(f"{p.name}-copy{i}", p.request, at, p.hold, p.user, p.team))
    return out


def compress(pods: List[Pod], capacity_milli: int, load: float) -> List[Pod]:
    """Arrivals squeezed (holds kept) so that offered GPU time / capacity over the arrival span is ``load``."""
    t0 = min(p.arrive for p in pods)
    span0 = max(p.arrive for p in pods) - t0

    def offered(span: float) -> float:
        return sum(p.request.total_gpu_milli * min(p.hold, span) for p in pods) / (capacity_milli * span)

    if offered(1.0) < load:
        raise ValueError(f"{len(pods)} pods cannot offer {load:.0%} of {capacity_milli // 1000} GPUs even all at "
                         f"once (at most {offered(1.0):.0%}): use more --pods or fewer --nodes")
    lo, hi = 1.0, span0
    for _ in range(60):  # offered() falls as the span grows
        mid = (lo * hi) ** 0.5
        lo, hi = (mid, hi) if offered(mid) > load else (lo, mid)
    scale = hi / span0
    return sorted((Pod(p.name, p.request, (p.arrive - t0) * scale, p.hold, p.user, p.team) for p in pods),
                  key=lambda p: p.arrive)


def split_past(pods: Sequence[Pod], share: float) -> Tuple[List[Pod], List[Pod]]:
    """The workload's first ``share`` of arrivals (by creation time), the hub's closed sessions,
    and the rest, the pods replayed: the estimator never learns from what it is scored on (a
    hub's 90 days of history are earlier sessions, not the ones it is about to serve)."""
    if not 0.0 <= share < 1.0:
        raise ValueError(f"the past's share must be at least 0 and below 1, not {share:g}")
    ordered = sorted(pods, key=lambda p: (p.arrive, p.name))
    k = int(round(share * len(ordered)))
    return ordered[:k], ordered[k:]


def past_sessions(pods: Sequence[Pod], apart: bool = False) -> List[Tuple[str, str, float]]:
    """The closed sessions of ``pods`` as a hub's history: each pod's shape, user and hold.

    ``apart``: under a user drawn apart from the replay's, for the optimistic past made of the
    replayed pods themselves (``--past-leaky``), where a pod's own hold must at least not be
    among its own user's sessions."""
    return [(profile_key(p.request.gpus, p.request.gpu_milli),
             f"u{zlib.crc32(f'past:{p.name}'.encode()) % USERS:02d}" if apart else p.user, p.hold) for p in pods]
