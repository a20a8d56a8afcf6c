"""MIG profile names: what ``"3g.40gb"`` means, in one place.

A MIG profile names a fixed slice of a GPU: ``<N>g`` compute slices out of the
GPU's total (7 on A100/H100/H200, 4 on A30) and ``<M>gb`` of memory. Profiles,
prices and placement all read these names; keeping the parsing here means a
profile the admin writes, a price key and an instance the node agent reports
are compared the same way (lower case, ``+me`` media-extension suffix kept).
"""

from __future__ import annotations

import re
from fractions import Fraction

__all__ = ["MigProfileError", "compute_share", "nominal_milli", "parse_mig_profile", "slices", "total_slices"]

_PROFILE = re.compile(r"^([1-9])g\.(\d{1,4})gb(\+me)?$")
# compute slices of a whole GPU per model (matched as a word in the model name); 7 otherwise
_TOTAL_SLICES = {"a30": 4}


class MigProfileError(ValueError):
    """A string that is not a MIG profile name such as ``1g.10gb``."""


def parse_mig_profile(value: object) -> str:
    """The canonical form of a MIG profile name (``"1G.10GB"`` → ``"1g.10gb"``); else :class:`MigProfileError`."""
    if not isinstance(value, str):
        raise MigProfileError(f"a MIG profile is a name such as '1g.10gb' or '3g.40gb', got {value!r}")
    text = value.strip().lower()
    if not _PROFILE.match(text):
        shown = value if len(value) <= 40 else value[:37] + "..."
        raise MigProfileError(
            f"{shown!r} is not a MIG profile name; expected '<slices>g.<memory>gb' such as '1g.10gb' or '3g.40gb'")
    return text


def slices(profile: str) -> int:
    """Compute slices of a (canonical) profile: ``"3g.40gb"`` → 3."""
    return int(profile.split("g", 1)[0])


def total_slices(model: str) -> int:
    """Compute slices of the whole GPU: 4 on an A30, 7 on every other MIG-capable model."""
    words = re.findall(r"[a-z0-9]+", model.lower())
    return next((n for key, n in _TOTAL_SLICES.items() if key in words), 7)


def compute_share(profile: str, model: str) -> Fraction:
    """The instance's exact share of its GPU's compute (1g of an A100 = 1/7), at most 1."""
    return min(Fraction(slices(profile), total_slices(model)), Fraction(1))


def nominal_milli(profile: str) -> int:
    """Milli-GPU a request for ``profile`` stands for before it is placed (slices of 7).

    Only for sizes that need a number before the GPU is known (quotas, the
    queue's demand); placement and prices use the instance and its model.
    """
    return max(1, min(1000, slices(profile) * 1000 // 7))
