"""GPU shares on Slurm: a ``gpu_fraction`` profile is asked of Slurm as ``gres/shard``.

Slurm (22.05 and later) splits each GPU into the ``Count=`` shards its ``gres.conf``
line gives; a job asking ``--gres=shard:a6000:8`` gets 8 shards of *one* GPU, which
Slurm picks (first with room: a job cannot name the GPU). So the pool picks the node
and books the share, Slurm picks the GPU, and the spawner moves the pool's share to
the GPU Slurm gave (``PATCH allocations/{id}``, ``rebind``): the pool map and the
charge are of the share really held.

:func:`share_problems` is the start check: with the ``gpupool-slurm`` spawner, every
fractional profile must be a whole number of shards on every node with GPUs of its
models; otherwise the service does not start, and the message names the profile
and the lines to add.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from decimal import Decimal
from math import gcd

from ...money.pricing import model_matches
from ...profiles import Profile, format_decimal
from .scontrol_nodes import SlurmNode

__all__ = ["share_problems", "shards_needed"]


def shards_needed(milli: int) -> int:
    """The fewest shards per GPU that make ``milli``/1000 a whole number of them (0.5 -> 2, 0.25 -> 4)."""
    return 1000 // gcd(milli, 1000)


def _lcm(values: Iterable[int]) -> int:
    out = 1
    for v in values:
        out = out * v // gcd(out, v)
    return out


def share_problems(profiles: Iterable[Profile], nodes: Iterable[SlurmNode], models: Mapping[str, str]) -> list[str]:
    """What keeps Slurm from giving each ``gpu_fraction`` profile its share as shards (empty: nothing)."""
    fractional = [p for p in profiles if p.gpu_milli]
    if not fractional:
        return []
    nodes = list(nodes)
    per = _lcm(shards_needed(p.gpu_milli) for p in fractional)
    problems = []
    for p in fractional:
        types = {t for t, model in models.items() if not p.models or any(model_matches(m, model) for m in p.models)}
        missing: dict[str, dict[str, int]] = {}  # node -> type -> GPUs, of the types without shards
        all_gpus: dict[str, dict[str, int]] = {}  # node -> type -> GPUs (its whole Gres= list)
        uneven: list[str] = []
        for n in nodes:
            for g in n.gpus:
                all_gpus.setdefault(n.name, {}).setdefault(g.gres_type, 0)
                all_gpus[n.name][g.gres_type] += 1
            for t in sorted(types):
                count = sum(1 for g in n.gpus if g.gres_type == t)
                if not count:
                    continue
                have = n.shards_per_gpu.get(t, 0)
                if not have:
                    missing.setdefault(n.name, {})[t] = count
                elif p.gpu_milli * have % 1000:
                    uneven.append(f"{n.name} has {have} {t} shards per GPU")
        share = format_decimal(Decimal(p.gpu_milli) / 1000)
        if missing:
            gres = "; ".join(f"NodeName={name} ... Gres=" + ",".join(
                [f"gpu:{t}:{c}" for t, c in all_gpus[name].items()]
                + [f"shard:{t}:{c * per}" for t, c in by_type.items()]) for name, by_type in sorted(missing.items()))
            conf = "; ".join(f"NodeName={name} Name=shard Type={t} Count={per} File=<the GPU's device file>"
                             for name, by_type in sorted(missing.items()) for t in by_type)
            problems.append(
                f"profile {p.slug!r} asks for {share} of a GPU, which gpupool-slurm asks of Slurm as shards "
                f"(gres/shard), but {', '.join(sorted(missing))} "
                f"{'has' if len(missing) == 1 else 'have'} none. Add to slurm.conf GresTypes=gpu,shard and "
                f"shards to each node's Gres= ({gres}), and to gres.conf one line per GPU, next to its "
                f"Name=gpu line ({conf}); or take the profile out (docs/slurm.md, 'GPU shares')")
        if uneven:
            problems.append(f"profile {p.slug!r} asks for {share} of a GPU, not a whole number of shards: "
                            f"{'; '.join(uneven)} (give each GPU a multiple of {shards_needed(p.gpu_milli)})")
    return problems
