"""Chart geometry for the server-rendered SVG charts: pure functions, no HTML.

The pages draw their charts on the server as inline SVG (see docs/pages.md for
why: no JavaScript library, no CDN, works offline, and a test reads a point's
value from its ``data-value`` attribute). This module only turns numbers into
coordinates; the Jinja macros in ``templates/charts.html`` turn those into
(escaped) SVG elements. Amounts stay ``Decimal`` for the labels and
``data-value`` attributes; floats are used for pixel positions only.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import date
from decimal import Decimal

from ...money.units import format_tokens

WIDTH = 720
HEIGHT = 240
PAD_LEFT = 56
PAD_RIGHT = 12
PAD_TOP = 12
PAD_BOTTOM = 28
#: Series colours are CSS classes (``series-0`` …), so dark mode can restyle them.
PALETTE_SIZE = 8


@dataclass(frozen=True)
class DayPoint:
    """One day of a balance chart: the balance at its end and what moved it."""

    day: date
    balance: Decimal
    credits: Decimal = Decimal(0)
    debits: Decimal = Decimal(0)  # zero or negative


@dataclass(frozen=True)
class Tick:
    pos: float
    label: str


@dataclass(frozen=True)
class Point:
    x: float
    y: float
    day: date
    value: str
    credits: str | None  # set where the day has credits: a marker is drawn
    debits: str | None
    iso: str = ""  # the day, for data-date
    label: str = ""  # the day as people read it ("Tue 3 Mar"), formatted once, not per use in the page


@dataclass(frozen=True)
class LineChart:
    points: list[Point]
    path: str
    y_ticks: list[Tick]
    x_ticks: list[Tick]
    floor_y: float | None
    zero_y: float
    width: int = WIDTH
    height: int = HEIGHT
    left: int = PAD_LEFT
    right: int = WIDTH - PAD_RIGHT
    top: int = PAD_TOP
    bottom: int = HEIGHT - PAD_BOTTOM


@dataclass(frozen=True)
class Segment:
    y: float
    height: float
    model: str
    value: str
    series: int


@dataclass(frozen=True)
class Bar:
    x: float
    width: float
    day: date
    total: str
    segments: list[Segment]
    iso: str = ""
    label: str = ""


@dataclass(frozen=True)
class BarChart:
    bars: list[Bar]
    legend: list[tuple[str, int]]  # (model, series index)
    y_ticks: list[Tick]
    x_ticks: list[Tick]
    empty: bool
    width: int = WIDTH
    height: int = HEIGHT
    left: int = PAD_LEFT
    right: int = WIDTH - PAD_RIGHT
    top: int = PAD_TOP
    bottom: int = HEIGHT - PAD_BOTTOM


def day_label(day: date) -> str:
    """A day as the charts' tooltips name it: "Tue 3 Mar"."""
    return day.strftime("%a %-d %b")


def nice_ticks(low: Decimal, high: Decimal, count: int = 6) -> list[Decimal]:
    """Round tick values (1, 2, 2.5 or 5 × 10ⁿ apart) that cover [low, high]."""
    if high <= low:
        high = low + 1
    raw = (high - low) / max(1, count - 1)
    magnitude = Decimal(10) ** (raw.adjusted())
    step = next(m * magnitude for m in (1, 2, Decimal("2.5"), 5, 10) if m * magnitude >= raw)
    start = (low / step).to_integral_value(rounding="ROUND_FLOOR") * step
    ticks = []
    value = start
    while value < high + step:
        ticks.append(value)
        value += step
        if len(ticks) > 3 * count:  # cannot happen with the steps above; never loop forever
            break
    return ticks


def _label(value: Decimal) -> str:
    text = f"{value.normalize():f}"
    return text.replace("-", "\u2212")


def _x_ticks(days: Sequence[date], xs: Sequence[float]) -> list[Tick]:
    """About five date labels, always including the last day."""
    if not days:
        return []
    every = max(1, len(days) // 5)
    picked = list(range(len(days) - 1, -1, -every))[::-1]
    return [Tick(xs[i], f"{days[i]:%b} {days[i].day}") for i in picked]


def balance_chart(points: Sequence[DayPoint], floor: Decimal | None,
                  days: Sequence[date] | None = None) -> LineChart:
    """A line of end-of-day balances with markers on days with credits or debits. ``days``:
    the days of the x axis, when the line covers only the last of them (an account opened
    within the range starts its line on that day)."""
    values = [p.balance for p in points] or [Decimal(0)]
    low = min([*values, Decimal(0), *([floor] if floor is not None else [])])
    high = max([*values, Decimal(0)])
    ticks = nice_ticks(low, high)
    y_low, y_high = ticks[0], ticks[-1]
    span = float(y_high - y_low) or 1.0
    top, bottom = PAD_TOP, HEIGHT - PAD_BOTTOM
    left, right = PAD_LEFT, WIDTH - PAD_RIGHT

    def y(value: Decimal) -> float:
        return round(bottom - (float(value - y_low) / span) * (bottom - top), 2)

    axis = list(days) if days is not None else [p.day for p in points]
    n = len(axis)
    xs = [round(left + (right - left) * (i / (n - 1) if n > 1 else 1.0), 2) for i in range(n)]
    x_of = dict(zip(axis, xs))
    out = [
        Point(x_of[p.day], y(p.balance), p.day, format_tokens(p.balance),
              format_tokens(p.credits) if p.credits else None,
              format_tokens(p.debits) if p.debits else None, p.day.isoformat(), day_label(p.day))
        for p in points
    ]
    path = " ".join(f"{'M' if i == 0 else 'L'}{p.x},{p.y}" for i, p in enumerate(out))
    return LineChart(
        points=out, path=path,
        y_ticks=[Tick(y(t), _label(t)) for t in ticks],
        x_ticks=_x_ticks(axis, xs),
        floor_y=y(floor) if floor is not None else None, zero_y=y(Decimal(0)),
    )


def stacked_bars(days: Sequence[date], spend: Mapping[date, Mapping[str, Decimal]]) -> BarChart:
    """One bar per day, stacked by GPU model; ``spend`` holds positive amounts."""
    models = sorted({m for per in spend.values() for m in per})
    series = {m: i % PALETTE_SIZE for i, m in enumerate(models)}
    totals = {d: sum(spend.get(d, {}).values(), Decimal(0)) for d in days}
    high = max([*totals.values(), Decimal(0)])
    ticks = nice_ticks(Decimal(0), high if high > 0 else Decimal(1))
    top, bottom = PAD_TOP, HEIGHT - PAD_BOTTOM
    left, right = PAD_LEFT, WIDTH - PAD_RIGHT
    scale = (bottom - top) / float(ticks[-1])
    slot = (right - left) / max(1, len(days))
    width = max(1.0, round(slot * 0.7, 2))
    bars = []
    for i, d in enumerate(days):
        x = round(left + slot * i + (slot - width) / 2, 2)
        base = float(bottom)
        segments = []
        for model in models:
            amount = spend.get(d, {}).get(model)
            if not amount:
                continue
            h = round(float(amount) * scale, 2)
            base -= h
            segments.append(Segment(round(base, 2), h, model, format_tokens(amount), series[model]))
        bars.append(Bar(x, width, d, format_tokens(totals[d]), segments, d.isoformat(), day_label(d)))
    xs = [b.x + width / 2 for b in bars]
    return BarChart(
        bars=bars, legend=[(m, series[m]) for m in models],
        y_ticks=[Tick(round(bottom - float(t) * scale, 2), _label(t)) for t in ticks],
        x_ticks=_x_ticks(list(days), xs), empty=high == 0,
    )


# ------------------------------------------------------------------ pool map


@dataclass(frozen=True)
class CellPart:
    """A holder's share of one GPU cell (``x``/``width`` in cell units of 100)."""

    x: float
    width: float
    user: str
    fraction: str
    allocation: str
    server: str
    borrowed: bool
    colour: str
    reserved: bool = False  # held for a reclaim in progress, not by an allocation yet
    utilization: float | None = None  # how busy the holder's server kept it (its own figure); None: unknown


@dataclass(frozen=True)
class MigCell:
    """One MIG instance drawn inside its GPU's cell, as wide as its compute share."""

    uuid: str
    profile: str
    x: float
    width: float
    part: CellPart | None  # its holder; None while free


@dataclass
class GpuCell:
    index: int
    uuid: str
    model: str
    state: str  # "free" | "held" | "shared"
    parts: list[CellPart] = field(default_factory=list)
    free_fraction: str = "1.000"
    instances: list[MigCell] = field(default_factory=list)  # a MIG-mode GPU's instances, in order
    cannot_attribute: str | None = None  # why the node's agent cannot tell whose use this GPU's is


#: The holder shown for GPUs reserved by a reclaim in progress (not yet an allocation).
RESERVED = "(reserved)"
#: Twelve well-separated hues; a user keeps theirs unless two holders on a page would share one.
HOLDER_HUES = (210, 25, 135, 285, 0, 175, 50, 320, 95, 240, 195, 345)


def _hue_slot(user: str) -> int:
    return int.from_bytes(hashlib.sha256(user.encode("utf-8")).digest()[:4], "big") % len(HOLDER_HUES)


def holder_colours(users: Iterable[str]) -> dict[str, str]:
    """A colour per holder: each user's own slot (from a hash of the name, so it is the
    same every day), moved to the next free slot when another holder on the page has it."""
    taken: set[int] = set()
    out = {}
    for user in sorted(set(users)):
        slot = _hue_slot(user)
        for step in range(len(HOLDER_HUES)):
            if (slot + step) % len(HOLDER_HUES) not in taken:
                slot = (slot + step) % len(HOLDER_HUES)
                break
        taken.add(slot)
        lightness = 45 if user != RESERVED else 60
        out[user] = f"hsl({HOLDER_HUES[slot]}, {0 if user == RESERVED else 65}%, {lightness}%)"
    return out


def gpu_cell(gpu: Mapping[str, object], who: Mapping[str, tuple[str, str, bool]],
             colours: Mapping[str, str]) -> GpuCell:
    """A snapshot GPU (``Pool.snapshot()``) as a cell; ``who`` maps allocation id →
    (user, server, borrowed). Unknown ids are reservations (a reclaim in progress)."""
    if gpu.get("mig"):
        return _mig_gpu_cell(gpu, who, colours)
    holders: Mapping[str, int] = gpu["holders"]  # type: ignore[assignment]
    parts = []
    x = 0.0
    for alloc, milli in sorted(holders.items(), key=lambda kv: (who.get(kv[0], ("~",))[0], kv[0])):
        user, server, borrowed = who.get(alloc, (RESERVED, "", False))
        width = milli / 10
        parts.append(CellPart(round(x, 2), round(width, 2), user, format_tokens(Decimal(milli) / 1000),
                              alloc, server, borrowed, colours.get(user, "gray"), alloc not in who))
        x += width
    used = sum(holders.values())
    state = "free" if used == 0 else ("held" if used >= 1000 and len(holders) == 1 else "shared")
    return GpuCell(int(gpu["index"]), str(gpu["uuid"]), str(gpu["model"]), state, parts,  # type: ignore[call-overload]
                   format_tokens(Decimal(1000 - used) / 1000))


def _mig_gpu_cell(gpu: Mapping[str, object], who: Mapping[str, tuple[str, str, bool]],
                  colours: Mapping[str, str]) -> GpuCell:
    """A MIG-mode GPU: each instance a box as wide as its share, filled with its holder's colour.

    Instances are handed out whole, one holder each, so a box is either one
    holder's or free; the GPU is "held" when every instance is taken.
    """
    instances, parts = [], []
    x = 0.0
    free_milli = 0
    for m in gpu["mig"]:  # type: ignore[attr-defined]
        width = int(m["milli"]) / 10
        part = None
        for alloc in sorted(m["holders"]):
            user, server, borrowed = who.get(alloc, (RESERVED, "", False))
            part = CellPart(round(x, 2), round(width, 2), user, format_tokens(Decimal(int(m["milli"])) / 1000),
                            alloc, server, borrowed, colours.get(user, "gray"), alloc not in who)
            parts.append(part)
        if not m["holders"]:
            free_milli += int(m["milli"])
        instances.append(MigCell(str(m["uuid"]), str(m["profile"]), round(x, 2), round(width, 2), part))
        x += width
    held = sum(1 for i in instances if i.part is not None)
    state = "free" if held == 0 else ("held" if held == len(instances) else "shared")
    return GpuCell(int(gpu["index"]), str(gpu["uuid"]), str(gpu["model"]), state, parts,  # type: ignore[call-overload]
                   format_tokens(Decimal(free_milli) / 1000), instances)
