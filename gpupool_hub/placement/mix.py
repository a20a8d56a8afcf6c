"""The request mix a fragmentation-aware policy plans for.

FGD scores a placement by how much it spoils the *typical* requests, so what
counts as typical decides everything. History alone is a poor guide in a
small hub: after a week of 5-GPU jobs, a configured 8-GPU profile has never
been seen, so nothing keeps a whole node for it. The mix therefore has two
sources: request shapes observed (the most common ones that together make up
``coverage`` of the requests), and shapes the caller *declares* may come
(configured profiles, shapes a team is owed under its quota), each with a
floor weight it keeps however rarely it has been seen.
"""

from __future__ import annotations

from collections import Counter
from typing import Dict, Iterable, List, Mapping, Optional, Tuple, Union

from .errors import InvalidRequest
from .request import MILLI, Request

# (cpu milli, memory MiB, GPU count, milli per GPU, allowed models); a fraction is (…, 1, share, …)
TypeKey = Tuple[int, int, int, int, Optional[frozenset]]
# (cpu milli, memory MiB, GPU count, milli per GPU, weight, allowed models); weights sum to 1
TypicalType = Tuple[int, int, int, int, float, Optional[frozenset]]

DEFAULT_FLOOR_WEIGHT = 0.001  # enters the typical set, barely reweights it (docs/placement.md: measured)
DEFAULT_RESERVE = 1  # nodes kept able to host each declared whole-GPU shape, while others fit


def check_reserve(reserve: int) -> None:
    if isinstance(reserve, bool) or not isinstance(reserve, int) or reserve < 0:
        raise InvalidRequest(f"reserve must be a whole number ≥ 0, got {reserve!r}")
Expected = Union[Iterable[Request], Mapping[Request, float]]


def type_key(r: Request) -> TypeKey:
    """The shape of a request as the fragmentation model sees it."""
    return (r.cpu_milli, r.memory_mib, r.gpus if r.gpus else (1 if r.gpu_milli else 0),
            r.gpu_milli if r.gpu_milli else (MILLI if r.gpus else 0), r.models)


class RequestMix:
    """Counts of observed request shapes plus declared shapes with floor weights."""

    def __init__(self, coverage: float = 0.95) -> None:
        if not 0 < coverage <= 1:
            raise ValueError(f"coverage must be in (0, 1], got {coverage}")
        self.coverage = coverage
        self.counts: Counter = Counter()
        self.expected: Dict[TypeKey, float] = {}

    def add(self, req: Request, n: int = 1) -> None:
        self.counts[type_key(req)] += n

    def expect(self, shapes: Expected, floor_weight: float = DEFAULT_FLOOR_WEIGHT) -> None:
        """Declare the shapes that may come; replaces any earlier declaration.

        ``shapes`` is an iterable of requests that all get ``floor_weight``, or
        a mapping from request to its own floor. A floor is the least share of
        the mix the shape keeps (0 ≤ floor < 1; 0: only what history gives it);
        together the floors must leave room for history (sum < 1). An empty
        iterable clears them.
        """
        items = shapes.items() if isinstance(shapes, Mapping) else ((s, floor_weight) for s in shapes)
        expected: Dict[TypeKey, float] = {}
        for shape, floor in items:
            if not isinstance(shape, Request):
                raise InvalidRequest(f"expected shapes must be Request objects, got {shape!r}")
            if isinstance(floor, bool) or not isinstance(floor, (int, float)) or not 0 <= floor < 1:
                raise InvalidRequest(f"floor weight of {shape.describe()} must be at least 0 and below 1, "
                                     f"got {floor!r}")
            key = type_key(shape)
            expected[key] = max(floor, expected.get(key, 0.0))
        total = sum(expected.values())
        if total >= 1:
            raise InvalidRequest(f"floor weights of the expected shapes add up to {total:g}; they must stay "
                                 "below 1 so that observed requests still count")
        self.expected = expected

    def typical(self) -> List[TypicalType]:
        """The typical types with weights summing to 1.

        Observed shapes: the most common ones covering ``coverage`` of all
        requests, weighted by count. Each declared shape gets at least its
        floor; the observed ones share what is left in proportion.
        """
        total = sum(self.counts.values())
        chosen: List[Tuple[TypeKey, float]] = []
        if total:
            ranked = sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0][:4]))
            cum = 0
            for key, n in ranked:
                chosen.append((key, n))
                cum += n
                if cum >= self.coverage * total:
                    break
            chosen = [(key, n / cum) for key, n in chosen]
        if self.expected:
            chosen = self._with_floors(dict(chosen))
        return [(c, mem, k, m, w, models) for (c, mem, k, m, models), w in chosen]

    def _with_floors(self, hist: Dict[TypeKey, float]) -> List[Tuple[TypeKey, float]]:
        """Raise declared shapes to their floors, scaling the others down in proportion.

        A declared shape seen often keeps its (scaled) observed share; raising
        one to its floor shrinks the rest, which may push another declared
        shape under its floor, hence the loop (at most one round per shape).
        """
        floors = self.expected
        weights = dict(hist)
        for key in floors:
            weights.setdefault(key, 0.0)
        floored: set = set()
        scale = 1.0
        while True:
            free_mass = sum(w for key, w in weights.items() if key not in floored)
            if free_mass <= 0:  # only declared shapes carry weight
                floored = set(floors)
                break
            scale = (1.0 - sum(floors[key] for key in floored)) / free_mass
            under = {key for key in floors if key not in floored and weights[key] * scale < floors[key]}
            if not under:
                break
            floored |= under
        if len(floored) == len(weights):  # nothing else observed: the declared shapes are the whole mix
            norm = sum(floors.values())
            out = {key: (floors[key] / norm if norm else 1.0 / len(floors)) for key in floored}
        else:
            out = {key: (floors[key] if key in floored else w * scale) for key, w in weights.items()}
        return sorted(((key, w) for key, w in out.items() if w > 0), key=lambda kv: (-kv[1], kv[0][:4]))
