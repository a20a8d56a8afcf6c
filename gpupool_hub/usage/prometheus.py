"""GPU usage read from Prometheus with range queries.

Why range queries summed client-side: a range query evaluates the PromQL
expression at every point of a fixed grid ``start, start+step, ...``; each
point says "this many GPUs were held at this instant", so ``value * step`` is
the GPU-seconds of the step that begins at that point. Summing those in
:class:`~decimal.Decimal` gives a result that is exact for the grid, identical
on every re-run, and free of the extrapolation that ``increase()``/``rate()``
or ``*_over_time`` with float sums would add. See ``docs/usage-sources.md``
for the staleness/lookback analysis these queries rely on.
"""

from __future__ import annotations

import json
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
import logging
import re
import time
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from decimal import Decimal, InvalidOperation
from typing import Any, Literal

import requests

from gpupool_hub.usage.base import Usage, UsageNotSettled, UsageUnavailable
from gpupool_hub.usage.prometheus_counts import (
    changed_query,
    coverage_count_query,
    fully_covered,
    stats_queries,
    sums_from_stats,
)

__all__ = [
    "PRESETS",
    "PrometheusUsageSource",
    "build_query",
    "decode_kubespawner_escaped",
    "promql_quote",
]

log = logging.getLogger(__name__)

Preset = Literal["gpupool", "agent", "dcgm", "custom"]
PRESETS: tuple[str, ...] = ("gpupool", "agent", "dcgm", "custom")
#: Labels that identify one series of a preset whose per-user sum is done client-side.
_SERIES_IDENTITY: dict[str, tuple[str, ...]] = {
    "gpupool": ("user", "model", "node", "server", "allocation"),
    "agent": ("user", "model", "node", "gpu_uuid"),
}

#: Prometheus refuses range queries with more than 11,000 points per series;
#: stay below it and split long intervals into several queries.
MAX_POINTS_PER_QUERY = 10_000

_LABEL_NAME = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]*$")
_METRIC_NAME = re.compile(r"^[a-zA-Z_:][a-zA-Z0-9_:]*$")

# kube-state-metrics turns the pod label / annotation key
# ``hub.jupyter.org/username`` into these Prometheus label names (every
# character outside [a-zA-Z0-9_] becomes "_", then the prefix is added).
KSM_USERNAME_LABEL = "label_hub_jupyter_org_username"
KSM_USERNAME_ANNOTATION = "annotation_hub_jupyter_org_username"


def promql_quote(value: str) -> str:
    """A PromQL string literal for ``value``.

    Usernames may contain quotes, backslashes or newlines; putting one into a
    label matcher unescaped would change the query (or inject a different
    matcher), so anything that builds a matcher from data must go through here.
    """
    out = ['"']
    for ch in value:
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def decode_kubespawner_escaped(value: str) -> str:
    """Undo KubeSpawner's legacy ("escape") slug scheme for a label value.

    KubeSpawner writes the ``hub.jupyter.org/username`` *label* as the
    username with every byte outside ``[a-z0-9]`` written as ``-XX`` (hex of
    the UTF-8 byte, lower-cased), because label values cannot hold arbitrary
    characters. Billing needs the real JupyterHub name back. Anything that is
    not a well-formed escape (e.g. the hashed "safe" slug scheme, which is
    one-way) raises ``ValueError`` rather than guessing a name.
    """
    raw = bytearray()
    i = 0
    while i < len(value):
        ch = value[i]
        if ch == "-":
            pair = value[i + 1 : i + 3]
            if len(pair) != 2 or any(c not in "0123456789abcdef" for c in pair):
                raise ValueError(f"{value!r} is not a KubeSpawner-escaped name (bad escape at {i})")
            raw.append(int(pair, 16))
            i += 3
        elif ch in "abcdefghijklmnopqrstuvwxyz0123456789":
            raw.append(ord(ch))
            i += 1
        else:
            raise ValueError(f"{value!r} is not a KubeSpawner-escaped name (character {ch!r})")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ValueError(f"{value!r} does not decode to UTF-8: {e}") from None


def _selector(metric: str, matchers: Mapping[str, str], extra: str = "") -> str:
    parts = [f"{k}={promql_quote(v)}" for k, v in sorted(matchers.items())]
    if extra:
        parts.append(extra)
    return f"{metric}{{{', '.join(parts)}}}" if parts else metric


def _fresh(selector: str, max_sample_age: float | None) -> str:
    """The selector, minus samples older than ``max_sample_age`` at each step.

    Without this, a series that vanished *without* a staleness marker (e.g.
    Prometheus restarted, or data was backfilled) keeps its last value for the
    whole lookback delta (5 min by default). ``timestamp()`` returns the
    sample's own time, so the comparison drops samples that are too old.
    """
    if max_sample_age is None:
        return selector
    if max_sample_age <= 0:
        raise ValueError("max_sample_age must be positive")
    return f"({selector} and (time() - timestamp({selector}) < {max_sample_age:g}))"


def _series_selector(preset: str, matchers: Mapping[str, str], max_sample_age: float | None) -> str:
    """The raw series of a preset whose series name one allocation (or GPU) each."""
    metric = {"gpupool": "gpupool_allocated_gpus", "agent": "gpupool_agent_user_gpu_active"}[preset]
    return _fresh(_selector(metric, matchers), max_sample_age)


def build_query(
    preset: str,
    *,
    query_template: str | None = None,
    step_seconds: int = 60,
    max_sample_age: float | None = None,
    selector_labels: Mapping[str, str] | None = None,
    dcgm_metric: str = "DCGM_FI_DEV_GPU_UTIL",
    dcgm_pod_label: str = "pod",
    dcgm_namespace_label: str = "namespace",
    dcgm_user_source: Literal["label", "annotation"] = "label",
) -> str:
    """The PromQL for a preset; public so admins can paste it into Grafana.

    Every preset ends in ``sum by (user, model) (...)`` with the inner
    expression de-duplicating the same GPU/allocation seen by several scrape
    jobs or Prometheus replicas, so a double scrape never doubles a bill.
    """
    matchers = dict(selector_labels or {})
    for key in matchers:
        if not _LABEL_NAME.match(key):
            raise ValueError(f"invalid label name in selector_labels: {key!r}")
    if preset in _SERIES_IDENTITY:
        sel = _series_selector(preset, matchers, max_sample_age)
        return f"sum by (user, model) (max by ({', '.join(_SERIES_IDENTITY[preset])}) ({sel}))"
    if preset == "dcgm":
        if not _METRIC_NAME.match(dcgm_metric):
            raise ValueError(f"invalid metric name: {dcgm_metric!r}")
        for label in (dcgm_pod_label, dcgm_namespace_label):
            if not _LABEL_NAME.match(label):
                raise ValueError(f"invalid label name: {label!r}")
        if dcgm_user_source == "label":
            kube_metric, kube_label = "kube_pod_labels", KSM_USERNAME_LABEL
        elif dcgm_user_source == "annotation":
            kube_metric, kube_label = "kube_pod_annotations", KSM_USERNAME_ANNOTATION
        else:
            raise ValueError(f"dcgm_user_source must be 'label' or 'annotation', not {dcgm_user_source!r}")
        gpu = _fresh(_selector(dcgm_metric, matchers, f'{dcgm_pod_label}!=""'), max_sample_age)
        # Normalise the exporter's pod/namespace labels (``exported_pod`` when
        # Prometheus did not honour the exporter's labels) to ``pod``/``namespace``
        # so they join with kube-state-metrics' own labels.
        gpu = (
            f'label_replace(label_replace({gpu}, "pod", "$1", "{dcgm_pod_label}", "(.+)"),'
            f' "namespace", "$1", "{dcgm_namespace_label}", "(.+)")'
        )
        owners = _fresh(f'{kube_metric}{{{kube_label}!=""}}', max_sample_age)
        joined = (
            f"group by (namespace, pod, UUID, modelName) ({gpu})"
            f" * on (namespace, pod) group_left ({kube_label})"
            f" group by (namespace, pod, {kube_label}) ({owners})"
        )
        return (
            "sum by (user, model) ("
            f'label_replace(label_replace({joined}, "user", "$1", "{kube_label}", "(?s)(.+)"),'
            ' "model", "$1", "modelName", "(?s)(.+)"))'
        )
    if preset == "custom":
        if not query_template or not query_template.strip():
            raise ValueError("preset 'custom' needs a query_template")
        if max_sample_age is not None:
            raise ValueError(
                "max_sample_age is not applied to custom templates; put the "
                "timestamp() filter into the template itself"
            )
        body = query_template.replace("$__step", f"{step_seconds}s")
        return f"sum by (user, model) ({body})"
    raise ValueError(f"unknown preset {preset!r}; expected one of {', '.join(PRESETS)}")


def _utc_seconds(dt: datetime, what: str) -> int:
    if dt.tzinfo is None or dt.utcoffset() is None:
        raise ValueError(f"{what} must be timezone-aware, got {dt!r}")
    if dt.microsecond:
        raise ValueError(f"{what} must be a whole second, got {dt.isoformat()}")
    return int(dt.timestamp())


def _iso(ts: int) -> str:
    return datetime.fromtimestamp(ts, timezone.utc).isoformat()


class PrometheusUsageSource:
    """A :class:`~gpupool_hub.usage.base.UsageSource` backed by a Prometheus server.

    Parameters that matter for correctness:

    ``step_seconds``
        Grid spacing; ideally the scrape interval. Intervals must be a whole
        number of steps so every second is counted exactly once.
    ``settle_seconds``
        How long after ``end`` the interval is still considered open (default
        two 60 s scrapes). Late scrapes/remote-write could still add samples
        before that, and a charged interval must never change afterwards.
    ``max_sample_age``
        Optional: ignore samples older than this at each step, bounding the
        over-count of series that end without a staleness marker (see docs).
    ``coverage_query``
        Optional PromQL (e.g. ``up{job="gpupool-hub"} == 1``) that must have
        a value at every step; a gap (Prometheus or exporter down) makes the
        interval unavailable instead of silently under-charging.
    ``retries``
        Extra attempts after the first for connection errors, timeouts, 5xx
        and 429, with exponential back-off from ``backoff_seconds``.
    ``count_on_server``
        For the ``gpupool`` and ``agent`` presets, ask Prometheus for four
        numbers per series over the interval (how many grid points, and the
        value when it did not change) instead of every point; the sums are the
        same, exactly, and anything else is read point by point. Turn off for
        a Prometheus-compatible store without subqueries.
    """

    def __init__(
        self,
        url: str,
        preset: Preset = "gpupool",
        query_template: str | None = None,
        *,
        step_seconds: int = 60,
        settle_seconds: int = 120,
        max_sample_age: float | None = None,
        timeout: float = 10,
        retries: int = 3,
        backoff_seconds: float = 0.5,
        headers: Mapping[str, str] | None = None,
        bearer_token: str | None = None,
        verify: bool | str = True,
        selector_labels: Mapping[str, str] | None = None,
        dcgm_metric: str = "DCGM_FI_DEV_GPU_UTIL",
        dcgm_pod_label: str = "pod",
        dcgm_namespace_label: str = "namespace",
        dcgm_user_source: Literal["label", "annotation"] = "label",
        coverage_query: str | None = None,
        allow_warnings: bool = False,
        count_on_server: bool = True,
        name: str | None = None,
        session: requests.Session | None = None,
        clock: Callable[[], datetime] | None = None,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"Prometheus url must be http(s)://..., got {url!r}")
        if not isinstance(step_seconds, int) or step_seconds < 1:
            raise ValueError("step_seconds must be a positive integer")
        if settle_seconds < 0 or retries < 0 or timeout <= 0:
            raise ValueError("settle_seconds and retries must be >= 0, timeout > 0")
        if query_template is not None and preset != "custom":
            raise ValueError("query_template is only used with preset='custom'")
        self.url = url.rstrip("/")
        self.preset = preset
        self.step_seconds = step_seconds
        self.settle_seconds = settle_seconds
        self.timeout = timeout
        self.retries = retries
        self.backoff_seconds = backoff_seconds
        self.coverage_query = coverage_query
        self.allow_warnings = allow_warnings
        self.count_on_server = count_on_server
        self.name = name or f"prometheus:{preset}"
        self.query = build_query(
            preset,
            query_template=query_template,
            step_seconds=step_seconds,
            max_sample_age=max_sample_age,
            selector_labels=selector_labels,
            dcgm_metric=dcgm_metric,
            dcgm_pod_label=dcgm_pod_label,
            dcgm_namespace_label=dcgm_namespace_label,
            dcgm_user_source=dcgm_user_source,
        )
        # For the gpupool and agent presets Prometheus only de-duplicates (max by
        # the series' identity) and the per-(user, model) sum happens here: the
        # same numbers, but a second aggregation over 10,000 series at every step
        # was the slowest part of a debit cycle.
        self._identity = _SERIES_IDENTITY.get(preset)
        # the raw series, for counting on the server (a custom or dcgm query is read point by point)
        self._series: str | None = None
        if self._identity is not None:
            self._series = _series_selector(preset, dict(selector_labels or {}), max_sample_age)
            prefix = "sum by (user, model) ("
            assert self.query.startswith(prefix) and self.query.endswith(")")
            self.query = self.query[len(prefix):-1]
        self._decode_user: Callable[[str], str] | None = (
            decode_kubespawner_escaped if preset == "dcgm" and dcgm_user_source == "label" else None
        )
        self._headers = dict(headers or {})
        if bearer_token:
            self._headers["Authorization"] = f"Bearer {bearer_token}"
        self._verify = verify
        self._session = session or requests.Session()
        self._clock = clock or (lambda: datetime.now(timezone.utc))
        self._sleep = sleep

    def __repr__(self) -> str:
        return f"PrometheusUsageSource({self.url!r}, preset={self.preset!r}, step={self.step_seconds})"

    # -- public ----------------------------------------------------------------

    def usage(self, start: datetime, end: datetime) -> list[Usage]:
        """GPU-seconds per (user, model) in ``[start, end)``, or UsageUnavailable."""
        t0, t1 = _utc_seconds(start, "start"), _utc_seconds(end, "end")
        step = self.step_seconds
        if t1 <= t0:
            raise ValueError(f"empty interval: start {start.isoformat()} >= end {end.isoformat()}")
        if (t1 - t0) % step:
            raise ValueError(f"interval length {t1 - t0}s is not a multiple of step {step}s")
        UsageNotSettled.unless_settled(end, self._clock(), self.settle_seconds, "samples may still arrive")
        totals: dict[tuple[str, str], Decimal] = {}
        chunk = MAX_POINTS_PER_QUERY * step
        for a in range(t0, t1, chunk):
            b = min(a + chunk, t1)
            if self.coverage_query:
                self._check_coverage(a, b)
            for (user, model), value_sum in self._sum_chunk(a, b).items():
                totals[(user, model)] = totals.get((user, model), Decimal(0)) + value_sum * step
        return [
            Usage(user=user, model=model, gpu_seconds=seconds)
            for (user, model), seconds in sorted(totals.items())
            if seconds != 0
        ]

    # -- internals -------------------------------------------------------------

    def _sum_chunk(self, a: int, b: int) -> dict[tuple[str, str], Decimal]:
        """Sum of the per-step values of every (user, model) series in ``[a, b)``."""
        if self.count_on_server and self._series is not None and self._identity is not None:
            counted = self._sum_counted(self._series, self._identity, a, b)
            if counted is not None:
                return counted
            log.info("%s: something unusual in %s–%s: reading it point by point", self.name, _iso(a), _iso(b))
        return self._sum_series(self._query_range(self.query, a, b), a, b)

    def _sum_counted(self, series: str, identity: tuple[str, ...], a: int, b: int
                     ) -> dict[tuple[str, str], Decimal] | None:
        """The chunk's sums from Prometheus's counts (``prometheus_counts``), the allocations that
        changed value read point by point; None when the chunk must be read point by point."""
        stats = stats_queries(series, a, b, self.step_seconds)
        if stats is None:
            return None
        queries, at = stats
        # asked at once: Prometheus evaluates them on its other cores while an answer is decoded here
        with ThreadPoolExecutor(max_workers=len(queries), thread_name_prefix="prometheus-counts") as pool:
            asked = {stat: pool.submit(self._query_instant, query, at) for stat, query in queries.items()}
            answers = {stat: future.result() for stat, future in asked.items()}
        got = sums_from_stats(answers, identity, (b - a) // self.step_seconds)
        if got is None:
            return None
        sums, changed = got
        if changed:
            query = changed_query(series, identity, a, b, self.step_seconds)
            for key, value in self._sum_series(self._query_range(query, a, b), a, b).items():
                sums[key] = sums.get(key, Decimal(0)) + value
        return sums

    def _sum_series(self, result: list[dict[str, Any]], a: int, b: int) -> dict[tuple[str, str], Decimal]:
        """Sum of the per-step values of every (user, model) series of a range query's answer."""
        grid = frozenset(range(a, b, self.step_seconds))
        sums: dict[tuple[str, str], Decimal] = {}
        seen: set[tuple[Any, ...]] = set()
        for series in result:
            labels = series["metric"]
            missing = [k for k in ("user", "model") if not labels.get(k)]
            if missing:
                raise UsageUnavailable(
                    f"{self.name}: series {labels!r} lacks the {' and '.join(missing)} label(s); "
                    "GPU time that cannot be attributed is not charged to anyone, fix the metrics"
                )
            user, model = labels["user"], labels["model"]
            if not isinstance(user, str) or not isinstance(model, str):
                raise UsageUnavailable(f"{self.name}: non-string label values in {labels!r}")
            if self._decode_user is not None:
                try:
                    user = self._decode_user(user)
                except ValueError as e:
                    raise UsageUnavailable(
                        f"{self.name}: cannot recover the JupyterHub username from the pod label: {e}; "
                        "use dcgm_user_source='annotation' with KubeSpawner's 'safe' slug scheme"
                    ) from None
            identity = (user, model) if self._identity is None else tuple(labels.get(k) for k in self._identity)
            if identity in seen:
                raise UsageUnavailable(f"{self.name}: duplicate series for user={user!r} model={model!r}")
            seen.add(identity)
            total = self._fast_sum(series, grid)
            if total is None:  # something is off: the strict path names it (or sums it)
                total = sum((value for _ts, value in self._points(series, a, b)), Decimal(0))
            sums[(user, model)] = sums.get((user, model), Decimal(0)) + total
        return sums

    @staticmethod
    def _fast_sum(series: Mapping[str, Any], grid: frozenset[int]) -> Decimal | None:
        """Sum a well-formed series with few Python-level steps per point, or None.

        Exporters repeat the same few values ("1", "0.25") over and over, so each
        distinct value string is parsed and checked once and multiplied by its
        count: exact, and ~10x faster than checking point by point. Anything
        unusual returns None and the strict path (``_points``) judges it.
        """
        values = series.get("values")
        if type(values) is not list or not all(type(p) is list and len(p) == 2 for p in values):
            return None
        stamps = [p[0] for p in values]
        if len(set(stamps)) != len(stamps) or not grid.issuperset(stamps):
            return None
        if any(type(t) is not int for t in stamps):
            return None
        total = Decimal(0)
        for raw, count in Counter(p[1] for p in values).items():
            if type(raw) is not str:
                return None
            try:
                value = Decimal(raw)
            except InvalidOperation:
                return None
            if not value.is_finite() or value < 0:
                return None
            total += value * count
        return total

    def _points(self, series: Mapping[str, Any], a: int, b: int) -> list[tuple[int, Decimal]]:
        """Validated ``(timestamp, value)`` points of one series.

        Strict because a wrong number here becomes a wrong bill: off-grid or
        duplicate timestamps would count a step twice, NaN/Inf/negative values
        mean the exporter is broken and the answer cannot be trusted.
        """
        labels = series["metric"]
        values = series.get("values", [])
        if not isinstance(values, list):
            raise UsageUnavailable(f"{self.name}: 'values' of {labels!r} is not a list")
        seen: set[int] = set()
        points = []
        for point in values:
            if not (isinstance(point, list) and len(point) == 2):
                raise UsageUnavailable(f"{self.name}: malformed point {point!r} in {labels!r}")
            raw_ts, raw_value = point
            if not isinstance(raw_ts, (int, Decimal)) or isinstance(raw_ts, bool):
                raise UsageUnavailable(f"{self.name}: non-numeric timestamp {raw_ts!r} in {labels!r}")
            if raw_ts != int(raw_ts):
                raise UsageUnavailable(f"{self.name}: off-grid timestamp {raw_ts} in {labels!r}")
            ts = int(raw_ts)
            if ts < a or ts >= b or (ts - a) % self.step_seconds or ts in seen:
                raise UsageUnavailable(
                    f"{self.name}: unexpected timestamp {ts} ({_iso(ts)}) in {labels!r}; "
                    f"asked for [{_iso(a)}, {_iso(b)}) every {self.step_seconds}s"
                )
            seen.add(ts)
            if not isinstance(raw_value, str):
                raise UsageUnavailable(f"{self.name}: sample value {raw_value!r} is not a string in {labels!r}")
            try:
                value = Decimal(raw_value)
            except InvalidOperation:
                raise UsageUnavailable(
                    f"{self.name}: unparsable sample value {raw_value!r} at {_iso(ts)} in {labels!r}"
                ) from None
            if not value.is_finite():
                raise UsageUnavailable(f"{self.name}: non-finite value {raw_value} at {_iso(ts)} in {labels!r}")
            if value < 0:
                raise UsageUnavailable(f"{self.name}: negative value {raw_value} at {_iso(ts)} in {labels!r}")
            points.append((ts, value))
        return points

    def _check_coverage(self, a: int, b: int) -> None:
        """Refuse a chunk where the coverage query has a gap (data missing)."""
        assert self.coverage_query is not None
        counted = (coverage_count_query(self.coverage_query, a, b, self.step_seconds)
                   if self.count_on_server else None)
        if counted is not None and fully_covered(self._query_instant(*counted), a, b, self.step_seconds):
            return
        covered: set[int] = set()
        for series in self._query_range(self.coverage_query, a, b):
            for ts, _value in self._points(series, a, b):
                covered.add(ts)
        expected = range(a, b, self.step_seconds)
        missing = [ts for ts in expected if ts not in covered]
        if missing:
            raise UsageUnavailable(
                f"{self.name}: coverage query {self.coverage_query!r} has no data at {len(missing)} of "
                f"{len(expected)} steps (first gap at {_iso(missing[0])}); usage data may be incomplete"
            )

    def _query_instant(self, query: str, at: int) -> list[dict[str, Any]]:
        """Run one instant query at ``at`` and validate the envelope."""
        body = self._post("/api/v1/query", {"query": query, "time": str(at), "timeout": f"{self.timeout:g}"})
        return self._result(body, "vector")

    def _query_range(self, query: str, a: int, b: int) -> list[dict[str, Any]]:
        """Run one range query for the steps in ``[a, b)`` and validate the envelope."""
        params = {
            "query": query,
            "start": str(a),
            "end": str(b - self.step_seconds),
            "step": str(self.step_seconds),
            # plain seconds: Prometheus parses a float, but not "0.5s"
            "timeout": f"{self.timeout:g}",
        }
        return self._result(self._post("/api/v1/query_range", params), "matrix")

    def _result(self, body: Mapping[str, Any], kind: str) -> list[dict[str, Any]]:
        data = body.get("data")
        if not isinstance(data, dict):
            raise UsageUnavailable(f"{self.name}: answer has no 'data' object")
        if data.get("resultType") != kind:
            query = "a range query" if kind == "matrix" else "an instant query"
            raise UsageUnavailable(
                f"{self.name}: expected resultType {kind!r} from {query}, got {data.get('resultType')!r}"
            )
        result = data.get("result")
        if not isinstance(result, list):
            raise UsageUnavailable(f"{self.name}: 'data.result' is not a list")
        for series in result:
            if not isinstance(series, dict) or not isinstance(series.get("metric"), dict):
                raise UsageUnavailable(f"{self.name}: malformed series {str(series)[:200]}")
            if "histograms" in series:
                raise UsageUnavailable(f"{self.name}: series {series['metric']!r} holds native histograms")
        return result

    def _post(self, path: str, params: Mapping[str, str]) -> dict[str, Any]:
        """POST with bounded retries; returns the decoded ``status: success`` body."""
        url = self.url + path
        last_error = "no attempt made"
        for attempt in range(self.retries + 1):
            if attempt:
                self._sleep(self.backoff_seconds * 2 ** (attempt - 1))
            try:
                resp = self._session.post(
                    url, data=params, headers=self._headers, timeout=self.timeout, verify=self._verify
                )
            except requests.RequestException as e:
                last_error = f"{type(e).__name__}: {e}"
                log.warning("%s: attempt %d/%d failed: %s", self.name, attempt + 1, self.retries + 1, last_error)
                continue
            if resp.status_code >= 500 or resp.status_code == 429:
                last_error = f"HTTP {resp.status_code}: {self._error_text(resp)}"
                log.warning("%s: attempt %d/%d failed: %s", self.name, attempt + 1, self.retries + 1, last_error)
                continue
            if resp.status_code != 200:
                raise UsageUnavailable(
                    f"{self.name}: Prometheus rejected the query with HTTP {resp.status_code}: "
                    f"{self._error_text(resp)}"
                )
            return self._decode(resp)
        raise UsageUnavailable(
            f"{self.name}: Prometheus at {self.url} did not answer after {self.retries + 1} attempts: {last_error}"
        )

    def _decode(self, resp: requests.Response) -> dict[str, Any]:
        try:
            # parse_float=Decimal keeps fractional timestamps exact for the grid check
            body = json.loads(resp.content.decode("utf-8"), parse_float=Decimal)
        except (UnicodeDecodeError, ValueError) as e:
            raise UsageUnavailable(
                f"{self.name}: answer is not JSON ({e}): {resp.content[:200]!r}"
            ) from None
        if not isinstance(body, dict):
            raise UsageUnavailable(f"{self.name}: answer is JSON but not an object: {str(body)[:200]}")
        if body.get("status") != "success":
            raise UsageUnavailable(
                f"{self.name}: answer status is {body.get('status')!r}, not 'success' "
                f"({body.get('errorType')}: {body.get('error')})"
            )
        warnings = body.get("warnings")
        if warnings and not self.allow_warnings:
            raise UsageUnavailable(f"{self.name}: Prometheus answered with warnings (possibly partial data): {warnings}")
        return body

    @staticmethod
    def _error_text(resp: requests.Response) -> str:
        try:
            body = resp.json()
            if isinstance(body, dict) and "error" in body:
                return f"{body.get('errorType')}: {body['error']}"
        except ValueError:
            pass
        return resp.text[:200]
