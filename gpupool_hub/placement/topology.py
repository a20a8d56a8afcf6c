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
from typing import Dict, Iterable, List, Optional, Sequence, Tuple


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

    __slots__ = ("n", "score", "flat", "_cache", "_nv", "_pairs")

    # Nodes of up to this many GPUs enumerate every completion (at most C(8,4) = 70 sets);
    # bigger ones enumerate only completions by one or two GPUs and grow the rest greedily.
    SMALL_NODE = 8
    # Only this many of the best-connected candidates are checked for what they leave behind.
    SHORTLIST = 8
    CACHE_SIZE = 4096

    def __init__(self, n: int, score: Sequence[Sequence[int]], nvlinks: Sequence[Sequence[int]]) -> None:
        self.n = n
        self.score = [list(row) for row in score]
        self._nv = [list(row) for row in nvlinks]
        self.flat = all(self.score[i][j] == self.score[0][1] for i in range(n) for j in range(n) if i != j) if n > 1 else True
        self._cache: Dict[Tuple[int, int, int], Tuple[int, ...]] = {}
        self._pairs: Optional[List[Tuple[int, int]]] = None

    @classmethod
    def flat_topology(cls, n: int) -> "Topology":
        return cls(n, [[0] * n for _ in range(n)], [[0] * n for _ in range(n)])

    def nvlinks(self, a: int, b: int) -> int:
        return self._nv[a][b]

    def set_score(self, gpus: Sequence[int]) -> int:
        s = self.score
        return sum(s[a][b] for a, b in combinations(gpus, 2))

    # -- choosing ---------------------------------------------------------
    def choose(self, free: Sequence[int], k: int, required: Iterable[int] = (),
               preferred: Iterable[int] = ()) -> Tuple[int, ...]:
        """Pick ``k`` of the ``free`` GPU positions, including all of ``required``.

        The chosen set is well connected *and* leaves the rest partitionable
        into well-connected sets of the same size, so the next request of this
        size is not stuck with a scattered remainder (go-gpuallocator's insight,
        without its exponential partition search). ``required`` GPUs are always
        in the set (go-gpuallocator's required devices: restoring or pinning a
        placement); as many ``preferred`` GPUs as fit come next, the best
        connected ones if there are too many; the rest is chosen as usual.
        Raises ``ValueError`` when ``required`` is not free or larger than ``k``.
        """
        free = tuple(sorted(free))
        fixed = tuple(sorted(set(required)))
        if len(fixed) > k:
            raise ValueError(f"{len(fixed)} required GPUs do not fit a set of {k}")
        free_set = set(free)
        if not free_set.issuperset(fixed):
            raise ValueError(f"required GPUs {sorted(set(fixed) - free_set)} are not free")
        if k >= len(free):
            return free
        pref = sorted((set(preferred) & free_set) - set(fixed))
        if pref and len(fixed) < k:
            room = k - len(fixed)
            pick = pref if len(pref) <= room else self.choose(tuple(fixed) + tuple(pref), k, fixed)
            fixed = tuple(sorted(set(fixed) | set(pick)))
        if len(fixed) == k:
            return fixed
        if self.flat or k == 0:
            return tuple(sorted(fixed + tuple(g for g in free if g not in fixed)[: k - len(fixed)]))
        mask = fmask = 0
        for g in free:
            mask |= 1 << g
        for g in fixed:
            fmask |= 1 << g
        key = (mask, k, fmask)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        if k == 1:
            # Give away the GPU the remaining GPUs need least.
            s = self.score
            best = min(free, key=lambda g: (sum(s[g][h] for h in free), g))
            result: Tuple[int, ...] = (best,)
        else:
            cands = self._candidates(free, k, fixed)
            cands.sort(key=lambda c: (-c[0], c[1]))
            best_val = None
            result = cands[0][1]
            for own, cand in cands[: self.SHORTLIST]:
                chosen = set(cand)
                val = own + self._greedy_packing(tuple(g for g in free if g not in chosen), k)
                if best_val is None or val > best_val:
                    best_val, result = val, cand
        if len(self._cache) >= self.CACHE_SIZE:
            self._cache.clear()
        self._cache[key] = result
        return result

    def _candidates(self, free: Tuple[int, ...], k: int, fixed: Tuple[int, ...]) -> List[Tuple[int, Tuple[int, ...]]]:
        """(own score, sorted set) of promising k-sets that contain ``fixed``."""
        s = self.score
        rest = tuple(g for g in free if g not in fixed)
        r = k - len(fixed)
        base = self.set_score(fixed)
        if self.n <= self.SMALL_NODE or r <= 2:
            tie = [sum(s[g][f] for f in fixed) for g in range(self.n)] if fixed else None
            out = []
            for c in combinations(rest, r):
                v = base + sum(s[a][b] for a, b in combinations(c, 2))
                if tie:
                    v += sum(tie[g] for g in c)
                out.append((v, tuple(sorted(fixed + c))))
            return out
        seen: Dict[Tuple[int, ...], int] = {}
        covered: set = set()
        for seed in rest:
            if seed in covered:  # growing from a member of a set found already mostly finds it again
                continue
            own, cand = self._grow(fixed + (seed,), free, k)
            covered.update(cand)
            if cand not in seen:
                seen[cand] = own
        out = []
        done = set()
        for cand, own in sorted(seen.items(), key=lambda kv: (-kv[1], kv[0]))[: self.SHORTLIST]:
            own, cand = self._improve(cand, own, free, fixed)
            if cand not in done:
                done.add(cand)
                out.append((own, cand))
        return out

    def _grow(self, start: Sequence[int], pool: Sequence[int], k: int) -> Tuple[int, Tuple[int, ...]]:
        """Grow ``start`` to ``k`` GPUs, each time adding the GPU best connected to the set so far.

        Affinities to the set are kept incrementally: O(k · |pool|), no set rescoring.
        """
        s = self.score
        chosen = list(start)
        inside = set(chosen)
        cand = [g for g in pool if g not in inside]
        row = s[chosen[0]]
        aff = [row[g] for g in cand]
        for c in chosen[1:]:
            row = s[c]
            for j, g in enumerate(cand):
                aff[j] += row[g]
        own = self.set_score(chosen) if len(chosen) > 1 else 0
        while len(chosen) < k:
            i = max(range(len(aff)), key=aff.__getitem__)  # first maximum: lowest index on ties
            g = cand.pop(i)
            own += aff.pop(i)
            chosen.append(g)
            row = s[g]
            for j, h in enumerate(cand):
                aff[j] += row[h]
        return own, tuple(sorted(chosen))

    def _improve(self, cand: Tuple[int, ...], own: int, pool: Tuple[int, ...],
                 fixed: Tuple[int, ...]) -> Tuple[int, Tuple[int, ...]]:
        """Best single swaps (one GPU out, one in) while they raise the score; fixed GPUs stay."""
        s = self.score
        members = list(cand)
        outside = [g for g in pool if g not in cand]
        aff = dict.fromkeys(pool, 0)
        for c in members:
            row = s[c]
            for g in pool:
                aff[g] += row[g]
        movable = [g for g in members if g not in fixed]
        for _ in range(8):
            best = 0
            move = None
            for o in movable:
                ao = aff[o]
                row = s[o]
                for i in outside:
                    d = aff[i] - row[i] - ao
                    if d > best:
                        best, move = d, (o, i)
            if move is None:
                break
            o, i = move
            own += best
            movable.remove(o)
            movable.append(i)
            members.remove(o)
            members.append(i)
            outside.remove(i)
            outside.append(o)
            ro, ri = s[o], s[i]
            for g in pool:
                aff[g] += ri[g] - ro[g]
        return own, tuple(sorted(members))

    def _sorted_pairs(self) -> List[Tuple[int, int]]:
        """All GPU pairs, best connected first (computed once per node)."""
        if self._pairs is None:
            s = self.score
            self._pairs = sorted(combinations(range(self.n), 2), key=lambda p: (-s[p[0]][p[1]], p))
        return self._pairs

    def _greedy_packing(self, free: Tuple[int, ...], k: int) -> int:
        """Score of carving ``free`` greedily into sets of size ``k``.

        Nodes of up to 8 GPUs take the exact best set each time; bigger ones
        grow each set from the best-connected pair still available (one pass
        over the pre-sorted pairs for the whole carving).
        """
        if k < 2 or len(free) < k:
            return 0
        total = 0
        if k == 2:  # greedy matching: best available pair first, which is what carving pairs means
            s = self.score
            avail = set(free)
            for a, b in self._sorted_pairs():
                if a in avail and b in avail:
                    total += s[a][b]
                    avail.discard(a)
                    avail.discard(b)
                    if len(avail) < 2:
                        break
            return total
        rest = free
        pairs = None
        p = 0
        while len(rest) >= k:
            if len(rest) == k:
                sc, cand = self.set_score(rest), rest
            elif self.n <= self.SMALL_NODE:  # the exact best set at every carve (at most C(7,3) = 35)
                sc, cand = max(((self.set_score(c), c) for c in combinations(rest, k)), key=lambda x: (x[0], [-g for g in x[1]]))
            else:
                if pairs is None:
                    pairs = self._sorted_pairs()
                avail = set(rest)
                while not (pairs[p][0] in avail and pairs[p][1] in avail):
                    p += 1
                sc, cand = self._grow(pairs[p], rest, k)
            total += sc
            taken = set(cand)
            rest = tuple(g for g in rest if g not in taken)
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
