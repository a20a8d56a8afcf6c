"""What ``GET me`` says about accounting: "delayed" only when something is wrong."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

from gpupool_hub.usage import UsageNotSettled, UsageUnavailable
from gpupool_hub.usage.prometheus import PrometheusUsageSource
from tests.fixtures.manager import Clock, make_manager

NODES = [{"name": "n1", "cpu_milli": 8000, "memory_mib": 32768, "gpus": {"count": 2, "model": "NVIDIA RTX A6000"}}]
START = datetime(2026, 11, 21, 8, tzinfo=timezone.utc)


class SettlingSource:
    """Answers (no usage) for intervals that ended ``settle`` seconds ago; not before."""

    name = "settling"

    def __init__(self, clock: Clock, settle: int = 120) -> None:
        self.clock = clock
        self.settle = timedelta(seconds=settle)

    def usage(self, start: datetime, end: datetime) -> list:
        if self.clock() < end + self.settle:
            raise UsageNotSettled(f"{end} not settled", end + self.settle)
        return []


def test_12_9_an_interval_waiting_to_settle_is_not_accounting_delayed():
    """The demo's setup: one-minute intervals, Prometheus data final 120 s after an
    interval ends. Right after an interval closes it is not settled: not a failure,
    and accounting stays "ok" run after run. A real failure (Prometheus unreachable
    once the interval has settled) is "delayed"."""
    clock = Clock(START + timedelta(seconds=90))  # the first interval closed 30 s ago
    # nothing listens on port 9: once an interval has settled, its query fails at once
    source = PrometheusUsageSource("http://127.0.0.1:9", "gpupool", settle_seconds=120, clock=clock,
                                   retries=0, timeout=2)
    m = make_manager(NODES, {"RTX A6000": 4}, clock=clock, usage_source=source, debit_interval=60, epoch=START)
    assert m.debits.debit_due() == 0
    assert m.debits.status.last_error is None
    assert m.debits.accounting_status() == {"status": "ok", "message": None}
    assert m.views.me("alice")["accounting"]["status"] == "ok"
    clock.advance(120)  # the first interval has settled; Prometheus is down: that is a failure
    assert m.debits.debit_due() == 0
    status = m.debits.accounting_status()
    assert status["status"] == "delayed" and "unavailable" in status["message"], status


def test_12_9_steady_state_with_a_settle_delay_is_ok():
    """Every run charges what has settled and leaves the newest intervals to settle:
    for ten minutes of runs every 30 s, accounting is never reported delayed."""
    clock = Clock(START)
    m = make_manager(NODES, {"RTX A6000": 4}, clock=clock, usage_source=SettlingSource(clock), debit_interval=60,
                     epoch=START)
    m.debits.delay_tolerance = 0
    charged = 0
    for _ in range(20):
        clock.advance(30)
        charged += m.debits.debit_due()
        assert m.debits.accounting_status() == {"status": "ok", "message": None}, clock()
    assert charged == 8  # intervals ending by now - 120 s: 08:01 ... 08:08


def test_12_9_not_settled_is_a_kind_of_unavailable():
    """Sources that only know UsageUnavailable keep working; the debit job tells them apart."""
    error = UsageNotSettled("not yet", START)
    assert isinstance(error, UsageUnavailable) and error.settled_at == START
