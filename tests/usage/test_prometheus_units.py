"""Query building, quoting, username decoding and argument checks (no server)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest

from gpupool_hub.usage.prometheus import (
    PRESETS,
    PrometheusUsageSource,
    build_query,
    decode_kubespawner_escaped,
    promql_quote,
)
from tests.usage.conftest import ODD, kubespawner_escape

UTC = timezone.utc


@pytest.mark.parametrize(
    ("raw", "quoted"),
    [
        ("alice", '"alice"'),
        ("o'brien@lab", '"o\'brien@lab"'),
        ('say "hi"', '"say \\"hi\\""'),
        ("back\\slash", '"back\\\\slash"'),
        ("new\nline\ttab", '"new\\nline\\ttab"'),
        ("bell\x07", '"bell\\x07"'),
        ("ünï 🐧", '"ünï 🐧"'),
    ],
)
def test_promql_quote(raw: str, quoted: str) -> None:
    assert promql_quote(raw) == quoted


@pytest.mark.parametrize("name", ["alice", ODD, "UPPER.case_and-dash", "ünï 🐧", "--", "a-2d"])
def test_kubespawner_escape_round_trip(name: str) -> None:
    assert decode_kubespawner_escaped(kubespawner_escape(name)) == name


@pytest.mark.parametrize("label", ["user-1---751ab4e2", "a-b", "Alice", "x-4", "a.b", "-c3", "a-zz"])
def test_kubespawner_decode_refuses_non_escaped(label: str) -> None:
    with pytest.raises(ValueError):
        decode_kubespawner_escaped(label)


def test_presets_build() -> None:
    assert set(PRESETS) == {"gpupool", "agent", "dcgm", "custom"}
    for preset in ("gpupool", "agent", "dcgm"):
        q = build_query(preset)
        assert q.startswith("sum by (user, model) (")
    assert "kube_pod_labels{label_hub_jupyter_org_username!=\"\"}" in build_query("dcgm")
    assert "kube_pod_annotations{annotation_hub_jupyter_org_username!=\"\"}" in build_query(
        "dcgm", dcgm_user_source="annotation"
    )
    assert build_query("custom", query_template="avg_over_time(x[$__step])", step_seconds=30) == (
        "sum by (user, model) (avg_over_time(x[30s]))"
    )


def test_max_sample_age_wraps_selectors() -> None:
    q = build_query("gpupool", max_sample_age=90, selector_labels={"job": "hub"})
    assert '(gpupool_allocated_gpus{job="hub"} and (time() - timestamp(gpupool_allocated_gpus{job="hub"}) < 90))' in q


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"preset": "nope"}, "unknown preset"),
        ({"preset": "custom"}, "needs a query_template"),
        ({"preset": "custom", "query_template": "x", "max_sample_age": 60}, "not applied to custom"),
        ({"preset": "gpupool", "query_template": "x"}, "only used with preset='custom'"),
        ({"preset": "gpupool", "selector_labels": {"bad-name": "x"}}, "invalid label name"),
        ({"preset": "dcgm", "dcgm_pod_label": 'pod"'}, "invalid label name"),
        ({"preset": "dcgm", "dcgm_metric": "DCGM{x}"}, "invalid metric name"),
        ({"preset": "dcgm", "dcgm_user_source": "both"}, "dcgm_user_source"),
        ({"step_seconds": 0}, "step_seconds"),
        ({"step_seconds": 1.5}, "step_seconds"),
    ],
)
def test_bad_configuration(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PrometheusUsageSource("http://127.0.0.1:9", **kwargs)


def test_bad_url() -> None:
    with pytest.raises(ValueError, match="http"):
        PrometheusUsageSource("127.0.0.1:9090")


@pytest.mark.parametrize(
    ("start", "end", "message"),
    [
        (datetime(2030, 1, 1, 10), datetime(2030, 1, 1, 11), "timezone-aware"),
        (datetime(2030, 1, 1, 10, tzinfo=UTC), datetime(2030, 1, 1, 10, tzinfo=UTC), "empty interval"),
        (datetime(2030, 1, 1, 10, tzinfo=UTC), datetime(2030, 1, 1, 10, 0, 30, tzinfo=UTC), "not a multiple"),
        (datetime(2030, 1, 1, 10, tzinfo=UTC), datetime(2030, 1, 1, 11, 0, 0, 5, tzinfo=UTC), "whole second"),
    ],
)
def test_bad_interval(start: datetime, end: datetime, message: str) -> None:
    src = PrometheusUsageSource("http://127.0.0.1:9", clock=lambda: end + timedelta(days=1))
    with pytest.raises(ValueError, match=message):
        src.usage(start, end)


def test_non_utc_aware_datetimes_are_fine() -> None:
    """Any aware datetime denotes an instant; the grid is computed in epoch seconds."""
    cet = timezone(timedelta(hours=1))
    src = PrometheusUsageSource("http://127.0.0.1:9", retries=0, clock=lambda: datetime(2031, 1, 1, tzinfo=UTC))
    from gpupool_hub.usage import UsageUnavailable

    with pytest.raises(UsageUnavailable, match="did not answer"):  # got past validation
        src.usage(datetime(2030, 1, 1, 11, tzinfo=cet), datetime(2030, 1, 1, 12, tzinfo=cet))
