"""The scale pool's usage in a real Prometheus, for benchmarks/scale.py (issue #26).

The debit cycle there charges what the service's ``gpupool`` usage preset reads: the
``gpupool_allocated_gpus`` gauge of every running server, as Prometheus would have
scraped it from the service every ``prometheus_step`` seconds. That history is written
as OpenMetrics, turned into TSDB blocks by ``promtool tsdb create-blocks-from
openmetrics`` (the helpers of tests/fixtures/prometheus.py) and cached beside the
pool's ledger, so only a pool's first run pays for it.

The history is made in a process of its own: at 100k users it is 1.6 M samples of
text, which would otherwise stay in the benchmark's resident memory, one of its
figures. scale.py runs this file as that process:

    python benchmarks/scale_prometheus.py LEDGER.sqlite BLOCKS_DIR END_ISO STEP WORKDIR
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

if TYPE_CHECKING:
    from gpupool_hub.ledger import AllocationRecord, Posting
    from gpupool_hub.usage.prometheus import PrometheusUsageSource
    from tests.fixtures.prometheus import OpenMetricsHistory, PrometheusServer


def step_seconds() -> int:
    """The service's default ``prometheus_step``: the scrape step the history is written at."""
    from gpupool_hub.service.app import GPUPoolService

    return int(GPUPoolService.prometheus_step.default_value)


def binaries() -> tuple[str, str]:
    """``prometheus`` and ``promtool``, or a message saying how to get them."""
    import pytest

    from tests.fixtures.prometheus import _binaries

    try:
        return _binaries()
    except pytest.skip.Exception as e:  # the fixture skips a test; a benchmark cannot run without them
        raise SystemExit(f"Prometheus: {e} (scripts/setup-env.sh)") from None


def usage_source(url: str, settings: Any, ledger: Any, clock: Callable[[], datetime]) -> PrometheusUsageSource:
    """The debit job's usage source as the service builds it with ``prometheus_url`` set and every
    other usage setting at its default (preset ``gpupool``, counted queries); only the clock is the
    benchmark's, so that an hour of the built pool counts as settled."""
    from traitlets.config import Config

    from gpupool_hub.service.app import GPUPoolService
    from gpupool_hub.service.usage import make_usage_source

    c = Config()
    c.GPUPoolService.prometheus_url = url
    # a function of the clock, not the clock: the config deep-copies its values, and a copy of
    # the benchmark's clock would stand still (every hour after the first "not settled yet")
    c.GPUPoolService.prometheus_options = {"clock": lambda: clock()}
    return make_usage_source(GPUPoolService(config=c), settings, ledger)  # type: ignore[return-value]


def first_scrape(record: AllocationRecord, step: int) -> datetime:
    """The first scrape that saw an allocation: the first step at or after its start."""
    return datetime.fromtimestamp(math.ceil(record.created_at.timestamp() / step) * step, timezone.utc)


def history(records: Iterable[AllocationRecord], end: datetime, step: int) -> OpenMetricsHistory:
    """Each running server's ``gpupool_allocated_gpus`` series, as the service exports it
    (``held_gpus``), from its first scrape until ``end``, where it closes with a 0."""
    from gpupool_hub.service.common.metrics import held_gpus
    from tests.fixtures.prometheus import OpenMetricsHistory

    out = OpenMetricsHistory()
    for r in records:
        for model, share in held_gpus(r).items():
            labels = {"user": r.user, "server": r.server, "model": model, "node": r.node, "allocation": r.id}
            out.gauge("gpupool_allocated_gpus", labels, [(first_scrape(r, step), end, share)], step=step)
    return out


def backfill(ledger_path: Path, blocks: Path, end: datetime, step: int, workdir: Path) -> dict[str, int]:
    """TSDB blocks in ``blocks`` of the running servers of the ledger at ``ledger_path``
    (the OpenMetrics text goes to ``workdir``)."""
    from gpupool_hub.ledger import Ledger
    from tests.fixtures.prometheus import _backfill

    ledger = Ledger(f"sqlite:///{ledger_path}")
    try:
        records = ledger.allocations.active()
    finally:
        ledger.close()
    text = history(records, end, step).text()
    _, promtool = binaries()
    _backfill(promtool, text, workdir, blocks)
    return {"series": len(records), "samples": text.count("\n") - 2}  # less "# TYPE" and "# EOF"


def history_meta(blocks: Path) -> Path:
    """What the blocks at ``blocks`` hold, written once they are complete (``<blocks>.json``)."""
    return blocks.with_name(blocks.name + ".json")


def cached_blocks(ledger_path: Path, blocks: Path, end: datetime, step: int) -> dict[str, Any]:
    """The blocks of the pool's history at ``blocks``, backfilled by a process of this file unless a
    cache of the same history is there; what they hold and how long the backfill took."""
    meta = history_meta(blocks)
    want = {"end": end.isoformat(), "step": step}
    if blocks.is_dir() and meta.exists():
        got = json.loads(meta.read_text())
        if {k: got.get(k) for k in want} == want:
            return {**got, "cached": True}
    meta.unlink(missing_ok=True)
    shutil.rmtree(blocks, ignore_errors=True)
    building = blocks.with_name(blocks.name + ".building")
    shutil.rmtree(building, ignore_errors=True)
    t0 = time.perf_counter()
    # the text in a folder of this process's: the child may be killed before it could remove it
    with tempfile.TemporaryDirectory(prefix="scale-om-") as workdir:
        cmd = [sys.executable, __file__, str(ledger_path), str(building), end.isoformat(), str(step), workdir]
        # a session of its own, like scale.py's other children: it and its promtool are killed together
        from tests.fixtures.processes import communicate_or_kill

        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, start_new_session=True)
        try:
            out, _ = communicate_or_kill(proc, 900)
        except BaseException:  # killed with its promtool: what it built is incomplete
            shutil.rmtree(building, ignore_errors=True)
            raise
    if proc.returncode != 0:
        shutil.rmtree(building, ignore_errors=True)
        raise SystemExit(f"Prometheus history: backfill failed ({proc.returncode}), see above")
    got = {**want, **json.loads(out), "backfill_s": round(time.perf_counter() - t0, 1)}
    building.rename(blocks)
    meta.write_text(json.dumps(got))
    return {**got, "cached": False}


@contextmanager
def served(blocks: Path) -> Iterator[PrometheusServer]:
    """A Prometheus on a copy of ``blocks`` (it writes its own files where it runs), stopped on
    the way out however that comes.

    Without compaction: Prometheus merges backfilled 2 h blocks into 6 h ones about a minute
    after it starts, which would otherwise land in a timed run now and then. (Its maximum block
    duration at the minimum, 2 h, as Thanos sidecars run it.)"""
    from tests.fixtures.ports import free_port
    from tests.fixtures.prometheus import PrometheusServer

    prometheus, _ = binaries()
    with tempfile.TemporaryDirectory(prefix="scale-prom-") as tmp:
        server = PrometheusServer(prometheus, Path(tmp), free_port(), flags=[
            "--storage.tsdb.min-block-duration=2h", "--storage.tsdb.max-block-duration=2h"])
        shutil.copytree(blocks, server.data_dir)
        try:
            server.start()
            yield server
        finally:
            server.stop()


def check_charged(posted: Iterable[Posting], records: Iterable[AllocationRecord], start: datetime,
                  end: datetime, charged_to: datetime, interval: int, step: int) -> None:
    """Fail loudly unless the debit runs charged every interval in ``[start, end)`` (they
    charged up to ``charged_to``), each debiting the user of each running server for exactly
    its GPU-seconds in the history: a cycle that charges nothing, or not every hour, would
    time nothing worth a figure. ``step`` is the history's resolution, from which a server's
    first sample follows (benchmarks/scale_slurm.py: 1 s, slurmdbd's whole-second Start)."""
    from gpupool_hub.service.common.metrics import held_gpus

    records = list(records)
    got: dict[datetime, dict[str, Decimal]] = {}
    for p in posted:
        assert p.interval_start is not None and p.gpu_seconds is not None
        by_user = got.setdefault(p.interval_start, {})
        by_user[p.account] = by_user.get(p.account, Decimal(0)) + p.gpu_seconds
    if charged_to != end:
        raise SystemExit(f"debit cycle: charged {start.isoformat()} to {charged_to.isoformat()}, "
                         f"not to {end.isoformat()}")
    t = start
    while t < end:
        e = t + timedelta(seconds=interval)
        want: dict[str, Decimal] = {}
        for r in records:
            held = int((e - max(t, first_scrape(r, step))).total_seconds())
            if held > 0:
                want[r.user] = want.get(r.user, Decimal(0)) + held * sum(
                    (Decimal(str(s)) for s in held_gpus(r).values()), Decimal(0))
        charged = got.get(t, {})
        wrong = [u for u in want if abs(charged.get(u, Decimal(0)) - want[u]) > Decimal("0.01")]
        if set(charged) != set(want) or wrong:
            raise SystemExit(
                f"debit cycle {t.isoformat()}–{e.isoformat()}: charged {len(charged):,} users "
                f"({sum(charged.values(), Decimal(0)) / 3600:.1f} GPU-h) where {len(want):,} running servers' "
                f"users held {sum(want.values(), Decimal(0)) / 3600:.1f} GPU-h; {len(wrong):,} differ")
        t = e


def main() -> None:
    ledger_path, blocks, end, step, workdir = sys.argv[1:]
    print(json.dumps(backfill(Path(ledger_path), Path(blocks), datetime.fromisoformat(end), int(step), Path(workdir))))


if __name__ == "__main__":
    main()
