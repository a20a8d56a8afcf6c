"""What the pool will free as its servers age (gpupool_hub.queue.forecast), and the waits it gives
a waiter after a burst, on small worked examples."""

from __future__ import annotations

from datetime import datetime, timezone

import pytest

from gpupool_hub.queue import estimates as eta
from gpupool_hub.queue.flow import Drain
from gpupool_hub.queue.forecast import Forecast
from gpupool_hub.placement.request import Request
from gpupool_hub.queue.order import Waiter
from gpupool_hub.queue.history import SessionHistory

NOW = datetime(2026, 3, 2, 9, 0, tzinfo=timezone.utc)
A100, L4 = "a100", "l4"


def waiter(wid: str, gpus: int = 1, models: frozenset[str] | None = None) -> Waiter:
    return Waiter(id=wid, user=f"user-{wid}", server="", request=Request(gpus=gpus, models=models), since=NOW)


def heavy_tailed(user: str = "ann") -> SessionHistory:
    """100 past sessions: 80 of 2 minutes, 20 of 2 hours (most end soon, most GPU time is long)."""
    return SessionHistory([("1x1000", user, 120.0)] * 80 + [("1x1000", user, 7200.0)] * 20)


def young(n: int, model: str = A100, age: float = 0.0) -> list[eta.Running]:
    return [eta.Running(model, 1000, "1x1000", "ann", age=age)] * n


def test_a_young_pool_frees_ever_slower_as_its_short_sessions_end() -> None:
    # 100 servers just started: 80 end within 2 minutes (and their replacements end again 2
    # minutes later, 80 % of them), the 20 long ones free nothing for hours
    f = Forecast(young(100), heavy_tailed())
    first = f.time_to(None, 40_000)  # 40 GPUs: within the first round of short sessions
    assert first is not None and first <= 120
    # 120 GPUs: the 80 short ones end, 64 of the 80 started on them end 2 minutes later
    later = f.time_to(None, 120_000)
    assert later is not None and 200 < later <= 240
    # a need that only the long sessions can meet waits for them (their renewals too)
    assert f.time_to(None, 400_000) > 1200  # type: ignore[operator]


def test_what_went_to_waiters_is_the_share_that_serves_them() -> None:
    f = Forecast(young(100), heavy_tailed())
    assert f.time_to(None, 40_000, used=0.5) == f.time_to(None, 80_000)
    assert f.time_to(None, 0) == 0.0
    assert f.time_to(None, 40_000, used=0.0) is None


def test_per_model_only_that_models_servers_free_for_its_waiter() -> None:
    history = SessionHistory([("1x1000", "ann", 120.0)] * 100)
    f = Forecast(young(10, A100) + young(2, L4), history)
    assert f.time_to(frozenset({L4}), 2000) <= 120  # type: ignore[operator]
    assert f.time_to(frozenset({L4}), 10_000) > 4 * 120  # type: ignore[operator]
    assert f.time_to(frozenset({A100}), 10_000) <= 120  # type: ignore[operator]
    assert f.time_to(frozenset({"h100"}), 1000) is None  # none held: no forecast, never a made-up one


def test_a_history_younger_than_the_held_servers_is_not_trusted() -> None:
    # the servers have run 10 minutes; no session of the history lasted that long: it cannot
    # say when they end (a hub days old, or the time replay before it kept a past)
    history = SessionHistory([("1x1000", "ann", 120.0)] * 100)
    assert not Forecast(young(10, age=600.0), history).known
    assert Forecast(young(10, age=60.0), history).known


def test_the_drain_records_what_freed_and_the_share_that_went_to_waiters() -> None:
    d = Drain()
    for i in range(10):
        d.add(100.0 + i, 1000, A100)
    d.released(50.0, 8000, A100)  # before anyone waited: not counted
    for i in range(4):
        d.released(100.0 + i, 1000, A100)
        d.released(100.0 + i, 1000, L4)  # freed where no waiter fitted
    rates = d.rates(110.0)
    assert rates is not None
    assert rates.used(frozenset({A100})) == 1.0  # more was started than freed: capped
    assert rates.used(None) == 1.0
    d2 = Drain()
    for i in range(10):
        d2.add(100.0 + i, 500, A100)
        d2.released(100.0 + i, 1000, A100)
    assert d2.rates(110.0).used(None) == 0.5  # type: ignore[union-attr]
    assert Drain().rates(0.0) is None


def test_after_a_burst_the_wait_follows_the_slowing_pool_not_the_rate_measured_in_it() -> None:
    # the queue was served 1 GPU a second during the burst (the short sessions ending); the
    # 50 old servers are long ones and free nothing soon; of the 30 young ones 80 % are short
    # (as of all sessions), and those started on them again: 24, then 19, 15, 12 GPUs two
    # minutes apart. 60 GPUs ahead wait about 7 minutes, not 60 s
    d = Drain()
    for i in range(60):
        d.add(float(i), 1000, A100)
        d.released(float(i), 1000, A100)
    ws = [waiter(f"w{i}") for i in range(60)]
    running = young(30, age=60.0) + young(50, age=600.0)
    history = heavy_tailed()
    measured = eta.estimate_ranges(ws, {}, running, history, NOW, drain=d.rates(60.0), only="w59")["w59"]
    assert measured.model_s == pytest.approx(60.0)
    forecast = Forecast(running, history)
    assert forecast.known
    est = eta.estimate_ranges(ws, {}, running, history, NOW, drain=d.rates(60.0), only="w59",
                              forecast=forecast)["w59"]
    assert est.model_s is not None and 360 < est.model_s <= 420
    assert est.model_s == forecast.time_to(None, 60_000, used=1.0)


def test_without_recorded_frees_the_measured_rate_answers() -> None:
    d = Drain()
    for i in range(60):
        d.add(float(i), 1000, A100)
    ws = [waiter(f"w{i}") for i in range(60)]
    running = young(60, age=60.0)
    est = eta.estimate_ranges(ws, {}, running, heavy_tailed(), NOW, drain=d.rates(60.0), only="w59",
                              forecast=Forecast(running, heavy_tailed()))["w59"]
    assert est.model_s == pytest.approx(60.0)


def test_a_waiter_for_several_gpus_keeps_the_measured_rate() -> None:
    # eight GPUs on one node free when that node drains, not as the pool's flow of frees says
    d = Drain()
    for i in range(60):
        d.add(float(i), 1000, A100)
        d.released(float(i), 1000, A100)
    ws = [waiter(f"w{i}") for i in range(52)] + [waiter("big", gpus=8)]
    running = young(30, age=60.0) + young(50, age=600.0)
    est = eta.estimate_ranges(ws, {}, running, heavy_tailed(), NOW, drain=d.rates(60.0), only="big",
                              forecast=Forecast(running, heavy_tailed()))["big"]
    assert est.model_s == pytest.approx(60.0)
