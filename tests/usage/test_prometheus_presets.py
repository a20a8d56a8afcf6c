"""Exact GPU-seconds through a real Prometheus for every preset.

Every test runs twice: with the values counted by Prometheus (the default) and
read point by point (``count_on_server=False``); both must give the same exact
figures.
"""

from __future__ import annotations

import re
from datetime import timedelta
from decimal import Decimal

import pytest

from gpupool_hub.usage import PrometheusUsageSource, Usage, UsageSource, UsageUnavailable
from gpupool_hub.usage import prometheus as prom
from gpupool_hub.usage.prometheus import promql_quote
from tests.usage.conftest import (
    A6000,
    EXPECTED_AGENT,
    EXPECTED_DCGM,
    EXPECTED_GPUPOOL,
    ODD,
    RTX3090,
    T4,
    History,
)

pytestmark = pytest.mark.integration


def as_dict(usages: list[Usage]) -> dict[tuple[str, str], Decimal]:
    for u in usages:
        assert isinstance(u.gpu_seconds, Decimal)
    keys = [(u.user, u.model) for u in usages]
    assert len(keys) == len(set(keys)), "one record per (user, model)"
    return {(u.user, u.model): u.gpu_seconds for u in usages}


_MODE = {"count_on_server": True}


@pytest.fixture(autouse=True, params=[True, False], ids=["counted", "point-by-point"])
def count_on_server(request, monkeypatch) -> bool:
    monkeypatch.setitem(_MODE, "count_on_server", request.param)
    return request.param


def source(h: History, preset: str = "gpupool", **kw) -> PrometheusUsageSource:
    kw.setdefault("retries", 0)
    kw.setdefault("count_on_server", _MODE["count_on_server"])
    return PrometheusUsageSource(h.server.url, preset, **kw)


def test_is_a_usage_source(usage_history: History) -> None:
    src = source(usage_history)
    assert isinstance(src, UsageSource)
    assert src.name == "prometheus:gpupool"


def test_gpupool_exact(usage_history: History) -> None:
    h = usage_history
    got = source(h).usage(h.at(0), h.at(3))
    assert as_dict(got) == EXPECTED_GPUPOOL
    assert got == sorted(got, key=lambda u: (u.user, u.model))
    assert (ODD, RTX3090) in as_dict(got)  # odd username round-trips exactly


def test_gpupool_hourly_intervals_add_up(usage_history: History) -> None:
    """The debit job asks hour by hour; the hours must sum to the 3 h answer."""
    h = usage_history
    src = source(h)
    hours = [as_dict(src.usage(h.at(i), h.at(i + 1))) for i in range(3)]
    assert hours[1] == {
        ("alice", A6000): Decimal(7200),
        ("bob", RTX3090): Decimal(900),
        ("carol", A6000): Decimal(1800),  # stopped at :30
        (ODD, RTX3090): Decimal(1800),
    }
    total: dict = {}
    for hour in hours:
        for k, v in hour.items():
            total[k] = total.get(k, 0) + v
    assert total == EXPECTED_GPUPOOL


def test_gpupool_duplicate_scrape_counts_once(usage_history: History) -> None:
    h = usage_history
    assert as_dict(source(h).usage(h.at(6), h.at(7))) == {("frank", T4): Decimal(3600)}


def test_series_without_end_marker_is_seen_for_the_lookback(usage_history: History) -> None:
    """Documents the 5-minute lookback: erin's series just stops at b+5h.

    A scraped series gets a staleness marker and ends exactly; backfilled or
    restart-orphaned data does not. ``max_sample_age`` bounds the error.
    """
    h = usage_history
    interval = (h.at(4), h.at(6))
    assert as_dict(source(h).usage(*interval)) == {("erin", T4): Decimal(3600 + 300)}
    assert as_dict(source(h, max_sample_age=90).usage(*interval)) == {("erin", T4): Decimal(3600 + 60)}
    assert as_dict(source(h, max_sample_age=60).usage(*interval)) == {("erin", T4): Decimal(3600)}


def test_agent_exact(usage_history: History) -> None:
    h = usage_history
    assert as_dict(source(h, "agent").usage(h.at(0), h.at(3))) == EXPECTED_AGENT


def test_dcgm_join_with_kube_pod_labels(usage_history: History) -> None:
    h = usage_history
    got = as_dict(source(h, "dcgm", max_sample_age=60).usage(h.at(0), h.at(3)))
    assert got == EXPECTED_DCGM  # trainer-0 (no hub label) and the idle GPU are not charged


def test_dcgm_without_max_sample_age_overcounts_by_lookback(usage_history: History) -> None:
    h = usage_history
    got = as_dict(source(h, "dcgm").usage(h.at(0), h.at(3)))
    # carol's and the odd user's pods ended inside the window without a
    # staleness marker; dave's A6000 pod ended at 1h; alice's/dave's other
    # GPUs run to the window's end, so their tail falls outside it.
    assert got[("carol", A6000)] == EXPECTED_DCGM[("carol", A6000)] + 300
    assert got[(ODD, RTX3090)] == EXPECTED_DCGM[(ODD, RTX3090)] + 300
    assert got[("dave", A6000)] == EXPECTED_DCGM[("dave", A6000)] + 300
    assert got[("alice", A6000)] == EXPECTED_DCGM[("alice", A6000)]


def test_dcgm_annotation_user_source(usage_history: History) -> None:
    h = usage_history
    src = source(h, "dcgm", max_sample_age=60, dcgm_user_source="annotation")
    assert as_dict(src.usage(h.at(0), h.at(3))) == EXPECTED_DCGM


def test_dcgm_exported_pod_labels(usage_history: History) -> None:
    """honor_labels off: the exporter's pod/namespace arrive as exported_*."""
    h = usage_history
    src = source(
        h, "dcgm", max_sample_age=60, dcgm_metric="DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        dcgm_pod_label="exported_pod", dcgm_namespace_label="exported_namespace",
    )
    assert as_dict(src.usage(h.at(0), h.at(3))) == EXPECTED_DCGM


def test_custom_template(usage_history: History) -> None:
    h = usage_history
    template = (
        'label_replace(label_replace(lab_gpu_alloc, "user", "$1", "username", "(?s)(.+)"),'
        ' "model", "$1", "gpu_model", "(.+)")'
    )
    got = as_dict(source(h, "custom", query_template=template).usage(h.at(0), h.at(3)))
    assert got == {("alice", A6000): Decimal(21600), (ODD, RTX3090): Decimal(3600)}


def test_custom_template_matching_an_odd_username(usage_history: History) -> None:
    """A user put into a matcher must be quoted; it then selects exactly that user."""
    h = usage_history
    template = f"gpupool_allocated_gpus{{user={promql_quote(ODD)}}}"
    got = as_dict(source(h, "custom", query_template=template).usage(h.at(0), h.at(3)))
    assert got == {(ODD, RTX3090): Decimal(3600)}


def test_selector_labels_are_quoted(usage_history: History) -> None:
    h = usage_history
    src = source(h, selector_labels={"instance": 'hub-a:8000"} or vector(1) #'})
    assert src.usage(h.at(6), h.at(7)) == []  # no injection, just no match
    src = source(h, selector_labels={"instance": "hub-a:8000"})
    assert as_dict(src.usage(h.at(6), h.at(7))) == {("frank", T4): Decimal(3600)}


def test_step_other_than_scrape_interval(usage_history: History) -> None:
    """A 5-minute grid still gives exact answers for spans aligned to it."""
    h = usage_history
    assert as_dict(source(h, step_seconds=300).usage(h.at(0), h.at(3))) == EXPECTED_GPUPOOL


def test_long_interval_is_split_into_chunks(usage_history: History, monkeypatch) -> None:
    h = usage_history
    monkeypatch.setattr(prom, "MAX_POINTS_PER_QUERY", 7)
    ends, windows = set(), set()
    src = source(h)
    real_range, real_instant = src._query_range, src._query_instant

    def query_range(q, a, b):
        ends.add(b - 60)
        windows.add(b - a)
        return real_range(q, a, b)

    def query_instant(q, at):
        ends.add(at)
        windows.add(int(q.rsplit("[", 1)[1].split("ms", 1)[0]) // 1000 + 30)  # half a step before the first
        return real_instant(q, at)

    monkeypatch.setattr(src, "_query_range", query_range)
    monkeypatch.setattr(src, "_query_instant", query_instant)
    assert as_dict(src.usage(h.at(0), h.at(3))) == EXPECTED_GPUPOOL
    assert len(ends) == -(-180 // 7)
    assert windows <= {7 * 60, 5 * 60}  # 25 chunks of 7 steps, the last of 5


def test_counted_hours_read_only_what_changed_point_by_point(usage_history: History, monkeypatch) -> None:
    """Over the test history's first hours some allocations change value: only those are read
    point by point (one range query of them, de-duplicated), and the figures are the same."""
    h = usage_history
    src = PrometheusUsageSource(h.server.url, retries=0)
    ranged: list[str] = []
    real = src._query_range
    monkeypatch.setattr(src, "_query_range", lambda q, a, b: ranged.append(q) or real(q, a, b))
    for hour in range(3):
        got = as_dict(src.usage(h.at(hour), h.at(hour + 1)))
        assert got == as_dict(source(h, count_on_server=False).usage(h.at(hour), h.at(hour + 1)))
    assert ranged, "the history has allocations that change value"
    assert all(" and on (user, model, node, server, allocation) (changes(" in q for q in ranged)


def test_empty_interval_gives_no_records(usage_history: History) -> None:
    h = usage_history
    assert source(h).usage(h.at(-20), h.at(-19)) == []


@pytest.mark.parametrize(
    ("hour", "message"),
    [(8, "non-finite value NaN"), (10, "negative value -1"), (12, "lacks the user label")],
)
def test_broken_exporter_data_is_refused(usage_history: History, hour: int, message: str) -> None:
    h = usage_history
    with pytest.raises(UsageUnavailable, match=message):
        source(h).usage(h.at(hour), h.at(hour + 1))


def test_coverage_query_refuses_a_gap(usage_history: History) -> None:
    h = usage_history
    src = source(h, coverage_query='gpupool_hub_up{job="gpupool-hub"} == 1')
    assert as_dict(src.usage(h.at(0), h.at(1)))[("alice", A6000)] == 7200
    gap = re.escape(f"no data at 15 of 60 steps (first gap at {h.at(1, 30).isoformat()})")
    with pytest.raises(UsageUnavailable, match=gap):
        src.usage(h.at(1), h.at(2))


def test_invalid_query_is_reported(usage_history: History) -> None:
    h = usage_history
    src = source(h, "custom", query_template="sum by (user (broken")
    with pytest.raises(UsageUnavailable, match="HTTP 400: bad_data: .*parse error"):
        src.usage(h.at(0), h.at(1))


def test_query_error_is_reported(usage_history: History) -> None:
    h = usage_history
    # two users collapse to the same label set: Prometheus refuses (HTTP 422)
    template = 'label_replace(gpupool_allocated_gpus, "user", "x", "", "")'
    src = source(h, "custom", query_template=f'max by (user, model, node) ({template})')
    assert src.usage(h.at(0), h.at(1))  # sanity: aggregated first, fine
    src = source(h, "custom", query_template=f"{template} * on (user) group_left {template}")
    with pytest.raises(UsageUnavailable, match="HTTP 422: execution"):
        src.usage(h.at(0), h.at(1))


def test_restart_keeps_data(prometheus_factory, usage_history: History) -> None:
    """stop() simulates an outage; start() comes back on the same port with the same TSDB."""
    from tests.fixtures.prometheus import usage_table_history

    b = usage_history.base
    server = prometheus_factory(usage_table_history({("alice", A6000): [(b, b + timedelta(hours=1), 2)]}))
    src = PrometheusUsageSource(server.url, retries=1, backoff_seconds=0, timeout=2)
    expected = [Usage("alice", A6000, Decimal(7200))]
    assert src.usage(b, b + timedelta(hours=1)) == expected
    url = server.url
    server.stop()
    assert not server.running
    with pytest.raises(UsageUnavailable, match="did not answer after 2 attempts: ConnectionError"):
        src.usage(b, b + timedelta(hours=1))
    server.start()
    assert server.url == url
    assert src.usage(b, b + timedelta(hours=1)) == expected


def test_fractional_timeout_is_accepted_by_prometheus(usage_history: History) -> None:
    h = usage_history
    assert as_dict(source(h, timeout=2.5).usage(h.at(0), h.at(3))) == EXPECTED_GPUPOOL
