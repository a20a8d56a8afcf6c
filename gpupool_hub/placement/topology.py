"""GPU interconnect inside a node, and choosing well-connected GPU sets.

Links are described the way NVML reports them: a number of NVLinks between two
GPUs, and the PCIe relation as NVML's topology level (nvmlGpuTopologyLevel_t).
Scores follow the spirit of NVIDIA's go-gpuallocator: every NVLink counts far
more than any PCIe relation, and a closer PCIe relation counts more than a
farther one.
"""

from __future__ import annotations

from enum import IntEnum
from itertools import combinations
from math import comb
from typing import Dict, FrozenSet, Iterable, List, Mapping, Optional, Sequence, Tuple


class PcieLevel(IntEnum):
    """NVML topology levels; the value is NVML's own constant."""

    INTERNAL = 0     # same board (multi-GPU card)
    SINGLE = 10      # one PCIe switch between them
    MULTIPLE = 20    # several PCIe switches, no host bridge
    HOSTBRIDGE = 30  # through a host bridge
    NODE = 40        # same NUMA node / CPU socket, through its interconnect
    SYSTEM = 50      # across CPU sockets (SMP interconnect)


# Aliases an admin may write (nvidia-smi topo -m spells them PIX/PXB/PHB/NODE/SYS).
_PCIE_ALIASES = {
    "internal": PcieLevel.INTERNAL, "board": PcieLevel.INTERNAL, "same_board": PcieLevel.INTERNAL,
    "single": PcieLevel.SINGLE, "pix": PcieLevel.SINGLE, "single_switch": PcieLevel.SINGLE,
    "multiple": PcieLevel.MULTIPLE, "pxb": PcieLevel.MULTIPLE, "multiple_switches": PcieLevel.MULTIPLE,
    "hostbridge": PcieLevel.HOSTBRIDGE, "phb": PcieLevel.HOSTBRIDGE, "host_bridge": PcieLevel.HOSTBRIDGE,
    "node": PcieLevel.NODE, "same_cpu": PcieLevel.NODE, "socket": PcieLevel.NODE,
    "system": PcieLevel.SYSTEM, "sys": PcieLevel.SYSTEM, "cross_cpu": PcieLevel.SYSTEM,
}

_PCIE_POINTS = {
    PcieLevel.INTERNAL: 60, PcieLevel.SINGLE: 50, PcieLevel.MULTIPLE: 40,
    PcieLevel.HOSTBRIDGE: 30, PcieLevel.NODE: 20, PcieLevel.SYSTEM: 10,
}
NVLINK_POINTS = 100


def parse_pcie_level(value: object) -> PcieLevel:
    """Accept NVML numbers, enum names and nvidia-smi abbreviations."""
    if isinstance(value, PcieLevel):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return PcieLevel(value)
    if isinstance(value, str):
        key = value.strip().lower().replace("-", "_").replace(" ", "_")
        if key.startswith("topology_"):
            key = key[len("topology_"):]
        if key in _PCIE_ALIASES:
            return _PCIE_ALIASES[key]
    raise ValueError(
        f"unknown PCIe relation {value!r}; use one of INTERNAL, SINGLE, MULTIPLE, HOSTBRIDGE, NODE, SYSTEM"
    )


def link_score(nvlinks: int, pcie: Optional[PcieLevel]) -> int:
    """Closeness of two GPUs: higher is closer."""
    return nvlinks * NVLINK_POINTS + (_PCIE_POINTS[pcie] if pcie is not None else 0)


class Topology:
    """Pairwise link scores of one node's GPUs, plus cached set choices.

    Nodes without configured links get ``Topology.flat(n)``; then every set is
    equally good and the choice degenerates to the lowest free indices, which
    costs nothing.
    """

    __slots__ = ("n", "score", "flat", "_cache", "_nv")

    # Beyond this many subsets we stop enumerating and build sets greedily.
    ENUM_LIMIT = 600
    SHORTLIST = 8

    def __init__(self, n: int, score: Sequence[Sequence[int]], nvlinks: Sequence[Sequence[int]]) -> None:
        self.n = n
        self.score = [list(row) for row in score]
        self._nv = [list(row) for row in nvlinks]
        self.flat = all(self.score[i][j] == self.score[0][1] for i in range(n) for j in range(n) if i != j) if n > 1 else True
        self._cache: Dict[Tuple[int, int], Tuple[int, ...]] = {}

    @classmethod
    def flat_topology(cls, n: int) -> "Topology":
        return cls(n, [[0] * n for _ in range(n)], [[0] * n for _ in range(n)])

    def nvlinks(self, a: int, b: int) -> int:
        return self._nv[a][b]

    def set_score(self, gpus: Sequence[int]) -> int:
        s = self.score
        return sum(s[a][b] for a, b in combinations(gpus, 2))

    # -- choosing ---------------------------------------------------------
    def choose(self, free: Sequence[int], k: int) -> Tuple[int, ...]:
        """Pick ``k`` of the ``free`` GPU positions.

        The chosen set is well connected *and* leaves the rest partitionable
        into well-connected sets of the same size, so the next request of this
        size is not stuck with a scattered remainder (go-gpuallocator's insight,
        without its exponential partition search).
        """
        free = tuple(sorted(free))
        if k >= len(free):
            return free
        if self.flat or k == 0:
            return free[:k]
        mask = 0
        for g in free:
            mask |= 1 << g
        key = (mask, k)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        if k == 1:
            # Give away the GPU the remaining GPUs need least.
            s = self.score
            best = min(free, key=lambda g: (sum(s[g][h] for h in free if h != g), g))
            result: Tuple[int, ...] = (best,)
        else:
            cands = self._candidates(free, k)
            cands.sort(key=lambda c: (-c[0], c[1]))
            best_val = None
            result = cands[0][1]
            for own, cand in cands[: self.SHORTLIST]:
                rest = tuple(g for g in free if g not in cand)
                val = own + self._greedy_packing(rest, k)
                if best_val is None or val > best_val:
                    best_val, result = val, cand
        if len(self._cache) > 4096:
            self._cache.clear()
        self._cache[key] = result
        return result

    def _candidates(self, free: Tuple[int, ...], k: int) -> List[Tuple[int, Tuple[int, ...]]]:
        if comb(len(free), k) <= self.ENUM_LIMIT:
            return [(self.set_score(c), c) for c in combinations(free, k)]
        seen = {}
        for seed in free:
            cand = self._grow(seed, free, k)
            cand = self._improve(cand, free)
            seen[cand] = self.set_score(cand)
        return [(v, c) for c, v in seen.items()]

    def _grow(self, seed: int, free: Tuple[int, ...], k: int) -> Tuple[int, ...]:
        s = self.score
        chosen = [seed]
        pool = [g for g in free if g != seed]
        while len(chosen) < k:
            g = max(pool, key=lambda h: (sum(s[h][c] for c in chosen), -h))
            chosen.append(g)
            pool.remove(g)
        return tuple(sorted(chosen))

    def _improve(self, cand: Tuple[int, ...], free: Tuple[int, ...]) -> Tuple[int, ...]:
        """One-swap hill climbing: bounded, polynomial, good enough for 16 GPUs."""
        best = cand
        best_score = self.set_score(cand)
        improved = True
        rounds = 0
        while improved and rounds < 4:
            improved = False
            rounds += 1
            for out in best:
                for inn in free:
                    if inn in best:
                        continue
                    trial = tuple(sorted([g for g in best if g != out] + [inn]))
                    sc = self.set_score(trial)
                    if sc > best_score:
                        best, best_score, improved = trial, sc, True
                        break
                if improved:
                    break
        return best

    def _greedy_packing(self, free: Tuple[int, ...], k: int) -> int:
        """Score of carving ``free`` greedily into sets of size ``k``."""
        total = 0
        rest = free
        while len(rest) >= k:
            if comb(len(rest), k) <= 64:
                sc, cand = max(((self.set_score(c), c) for c in combinations(rest, k)), key=lambda x: (x[0], [-g for g in x[1]]))
            else:
                cand = max((self._grow(g, rest, k) for g in rest), key=self.set_score)
                sc = self.set_score(cand)
            total += sc
            rest = tuple(g for g in rest if g not in cand)
        return total

    def describe_set(self, gpus: Sequence[int]) -> str:
        """Human words for how a set of GPUs is joined."""
        if len(gpus) < 2:
            return ""
        pairs = list(combinations(gpus, 2))
        linked = sum(1 for a, b in pairs if self._nv[a][b] > 0)
        if linked == len(pairs):
            return "joined by NVLink"
        if linked:
            return f"partly joined by NVLink ({linked} of {len(pairs)} pairs)"
        return "joined by PCIe"


def build_topology(n: int, links: Iterable[Tuple[int, int, int, Optional[PcieLevel]]]) -> Topology:
    """Topology from (a, b, nvlinks, pcie) tuples; missing pairs score zero."""
    score = [[0] * n for _ in range(n)]
    nv = [[0] * n for _ in range(n)]
    any_link = False
    for a, b, nvlinks, pcie in links:
        any_link = True
        sc = link_score(nvlinks, pcie)
        score[a][b] = score[b][a] = sc
        nv[a][b] = nv[b][a] = nvlinks
    if not any_link:
        return Topology.flat_topology(n)
    return Topology(n, score, nv)
