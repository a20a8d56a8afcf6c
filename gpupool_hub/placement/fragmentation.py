"""FGD's fragmentation model: how much free GPU the typical requests could use on a node.

Kept apart from the policy because it is a pure function of (typical types,
node state), cached: the policy rebuilds it when the request mix moves and
asks it to score node states; everything in it is a cache of that function.
"""

from __future__ import annotations

from bisect import bisect_right
from typing import Dict, List, Sequence, Tuple

from .request import MILLI, Request

REACH = ("tight", "largest", "off")


class FragmentationModel:
    """Useful GPU of node states for fixed typical types; see :class:`FGD` for the measure.

    ``types``: (cpu milli, memory MiB, GPU count, milli per GPU, weight, models)
    with weights summing to 1. ``fraction_reach`` and ``whole_sets`` select the
    refinements described in docs/placement.md; ``max_slots`` is the most
    devices any node of the pool has.
    """

    def __init__(self, types: Sequence[tuple], *, fraction_reach: str = "tight", whole_sets: bool = True,
                 max_slots: int = 0) -> None:
        if fraction_reach not in REACH:
            raise ValueError(f"fraction_reach must be one of {', '.join(REACH)}, got {fraction_reach!r}")
        self.types: List[tuple] = list(types)
        self.fraction_reach = fraction_reach
        self.whole_sets = whole_sets
        self.max_slots = max_slots
        self._tables: Dict[str, tuple] = {}
        self._useful: Dict[tuple, float] = {}
        self._profiles: Dict[tuple, tuple] = {}
        self._profile_ids: Dict[tuple, int] = {}

    def table(self, model_key: str) -> tuple:
        """Per model: CPU and memory thresholds, per (count, share) group the
        weight of the types that fit at each (CPU level, memory level), and the
        fractional types (share, CPU, memory, weight) when their reach is limited."""
        tab = self._tables.get(model_key)
        if tab is None:
            types = [t for t in self.types if t[2] > 0 and (t[5] is None or model_key in t[5])]
            cpu_thr = sorted({t[0] for t in types})
            mem_thr = sorted({t[1] for t in types})
            width = len(mem_thr) + 1
            size = (len(cpu_thr) + 1) * width
            limited = self.fraction_reach != "off"
            fractions = tuple(sorted(((m, c, mem, w) for c, mem, k, m, w, _ in types if limited and m < MILLI),
                                     reverse=True))
            groups: Dict[Tuple[int, int], List[float]] = {}
            for c, mem, k, m, w, _ in types:
                if limited and m < MILLI:
                    continue
                table = groups.setdefault((k, m), [0.0] * size)
                lc = bisect_right(cpu_thr, c)  # first CPU level at which t fits
                lm = bisect_right(mem_thr, mem)
                for i in range(lc, len(cpu_thr) + 1):
                    row = i * width
                    for j in range(lm, width):
                        table[row + j] += w
            # sort groups by share, descending, so one pass over sorted free values serves all
            glist = tuple(sorted(((m, k, tuple(t)) for (k, m), t in groups.items()), reverse=True))
            # CPU and memory for 1..n copies of each fractional type: which of these a node
            # state has decides every type's reach, so they key the reach profiles
            n = self.max_slots
            cpu_fine = tuple(sorted({c * j for _, c, _, _ in fractions for j in range(1, n + 1)}))
            mem_fine = tuple(sorted({r * j for _, _, r, _ in fractions for j in range(1, n + 1)}))
            tab = (cpu_thr, mem_thr, width, glist, fractions, cpu_fine, mem_fine)
            self._tables[model_key] = tab
        return tab

    def useful(self, model_key: str, level: int, cpu: int, mem: int, free_desc: tuple) -> float:
        """Useful (see :class:`FGD`) of a node state; cached.

        Whole-GPU types are summed per (count, share) group from the level
        table. Fractional types with a limited reach depend on how many more
        copies of each fit the CPU and memory left: the *reach profile*,
        interned so that states differing only in CPU or memory that changes
        no reach share one cache entry.
        """
        tab = self.table(model_key)
        if tab[4]:
            pid, reach = self._reach_profile(model_key, tab, cpu, mem, len(free_desc))
            key = (model_key, level, pid, free_desc)
        else:
            reach = ()
            key = (model_key, level, free_desc)
        u = self._useful.get(key)
        if u is None:
            u = 0.0
            n = len(free_desc)
            i = 0
            cnt = 0
            acc = 0
            sets = self.whole_sets
            for m, k, weights in tab[3]:  # m descending
                while i < n and free_desc[i] >= m:
                    acc += free_desc[i]
                    cnt += 1
                    i += 1
                if cnt >= k and acc:
                    if sets and k > 1:  # only whole k-sets of GPUs serve a k-GPU type
                        u += weights[level] * (cnt // k) * k * MILLI
                    else:
                        u += weights[level] * acc
            if reach:
                u += self._fraction_useful(reach, free_desc)
            u = round(u, 6)
            if len(self._useful) > 400_000:
                self._useful.clear()
            self._useful[key] = u
        return u

    def _reach_profile(self, model_key: str, tab: tuple, cpu: int, mem: int, n: int) -> tuple:
        """(profile id, ((share, reach, weight), …) by share descending) for the CPU and memory left.

        A fractional type t fits at most r = min(cpu // t.cpu, mem // t.memory)
        more times, so it can reach at most min(r, n) devices. Types with the
        same share and reach are merged. The profile is keyed by how many of
        the "CPU (memory) for j copies of t" thresholds the node meets, which
        determines every reach, so most node states share a few profiles.
        """
        if n <= self.max_slots:
            key = (model_key, bisect_right(tab[5], cpu), bisect_right(tab[6], mem), n)
        else:  # a node bigger than the thresholds were built for: key by the exact amounts
            key = (model_key, -1 - cpu, -1 - mem, n)
        hit = self._profiles.get(key)
        if hit is None:
            merged: Dict[Tuple[int, int], float] = {}
            for m, c, r, w in tab[4]:
                if c > cpu or r > mem:
                    continue
                reach = min(n, cpu // c if c else n, mem // r if r else n)
                merged[(m, reach)] = merged.get((m, reach), 0.0) + w
            profile = tuple(sorted(((m, reach, w) for (m, reach), w in merged.items()), reverse=True))
            if len(self._profiles) > 200_000:
                self._profiles.clear()
            hit = self._profiles[key] = (self._profile_ids.setdefault(profile, len(self._profile_ids)), profile)
        return hit

    def _fraction_useful(self, profile: tuple, free_desc: tuple) -> float:
        """Σ over fractional types of weight · (free milli on the devices the type can still reach).

        A type fits the d devices with free ≥ its share but reaches only
        min(d, reach) of them: the tightest ones (where best-fit puts it) or,
        with ``fraction_reach="largest"``, the largest.
        """
        n = len(free_desc)
        pre = [0] * (n + 1)
        for j, v in enumerate(free_desc):
            pre[j + 1] = pre[j] + v
        tight = self.fraction_reach == "tight"
        u = 0.0
        d = 0
        for m, reach, w in profile:  # share descending: d only grows
            while d < n and free_desc[d] >= m:
                d += 1
            if not d:
                continue
            if reach >= d:
                u += w * pre[d]
            elif tight:
                u += w * (pre[d] - pre[d - reach])
            else:
                u += w * pre[reach]
        return u

    def evaluate(self, sig: tuple, req: Request) -> Tuple[float, int]:
        """(change of Useful, free share of the device to take from) if ``req`` goes on a node in state ``sig``.

        For a fraction, every distinct device value is tried and the one that
        keeps Useful highest wins, ties to the tighter device.
        """
        model_key, cpu, mem, free_desc = sig
        cpu_thr, mem_thr, width = self.table(model_key)[:3]
        lvl0 = bisect_right(cpu_thr, cpu) * width + bisect_right(mem_thr, mem)
        before = self.useful(model_key, lvl0, cpu, mem, free_desc)
        cpu1 = cpu - req.cpu_milli
        mem1 = mem - req.memory_mib
        lvl1 = bisect_right(cpu_thr, cpu1) * width + bisect_right(mem_thr, mem1)
        if req.gpu_milli:
            f = req.gpu_milli
            best = None
            best_v = 0
            last = -1
            for j, v in enumerate(free_desc):
                if v < f:
                    break
                if v == last:
                    continue
                last = v
                after = free_desc[:j] + free_desc[j + 1:]
                nv = v - f
                p = j  # re-insert nv keeping descending order
                while p < len(after) and after[p] > nv:
                    p += 1
                after = after[:p] + (nv,) + after[p:]
                u = self.useful(model_key, lvl1, cpu1, mem1, after)
                if best is None or u >= best:  # ties: tighter device (smaller v)
                    best, best_v = u, v
            return (round(best - before, 6), best_v)
        if req.gpus:
            k = req.gpus
            after = free_desc[k:] + (0,) * k
            return (round(self.useful(model_key, lvl1, cpu1, mem1, after) - before, 6), MILLI)
        return (round(self.useful(model_key, lvl1, cpu1, mem1, free_desc) - before, 6), 0)
