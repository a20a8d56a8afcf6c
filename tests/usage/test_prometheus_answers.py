"""Our parser against answers a Prometheus (or a proxy in front of it) can give when things go wrong.

A tiny loopback HTTP server plays those answers; everything that a real
server can produce is tested against the real one in test_prometheus_presets.
Most tests here play range-query answers (``count_on_server=False``: every
point is read and checked); the last ones play the counted answers and check
that anything unusual in them sends the source back to reading every point.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from decimal import Decimal
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs

import pytest

from gpupool_hub.usage import PrometheusUsageSource, Usage, UsageUnavailable

START = datetime(2030, 1, 1, 10, tzinfo=timezone.utc)
END = START + timedelta(hours=1)
T0 = int(START.timestamp())
LATER = lambda: END + timedelta(hours=1)  # noqa: E731  a clock for which the interval is settled


class FakePrometheus:
    """Serves queued answers ``(status, body, delay)``; repeats the last one."""

    def __init__(self) -> None:
        self.answers: list[tuple[int, bytes | str | dict, float]] = []
        self.requests: list[tuple[dict[str, list[str]], dict[str, str]]] = []
        self.paths: list[str] = []
        # (query prefix, answer): answers chosen by the query, for requests sent at once
        self.routes: list[tuple[str, tuple[int, bytes | str | dict, float]]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length", 0))
                form = parse_qs(self.rfile.read(length).decode())
                fake.requests.append((form, dict(self.headers)))
                fake.paths.append(self.path)
                query = form.get("query", [""])[0]
                routed = [answer for prefix, answer in fake.routes if query.startswith(prefix)]
                if routed:
                    status, body, delay = routed[0]
                else:
                    status, body, delay = fake.answers.pop(0) if len(fake.answers) > 1 else fake.answers[0]
                if delay:
                    time.sleep(delay)
                if isinstance(body, dict):
                    body = json.dumps(body)
                if isinstance(body, str):
                    body = body.encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                try:
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass

            def log_message(self, *args) -> None:
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def answer(self, *answers: tuple[int, bytes | str | dict] | tuple[int, bytes | str | dict, float]) -> None:
        self.answers = [(a[0], a[1], a[2] if len(a) > 2 else 0.0) for a in answers]

    def route(self, **answers: dict) -> None:
        """Answer the counted queries by what they ask (they are sent at once, in any order):
        ``count``, ``max``, ``changed`` and ``points`` (the range query after them)."""
        prefixes = {"count": "count_over_time(", "max": "max_over_time(", "changed": "changes(", "points": "max by ("}
        self.routes = [(prefixes[k], (200, body, 0.0)) for k, body in answers.items()]

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def fake() -> Iterator[FakePrometheus]:
    server = FakePrometheus()
    try:
        yield server
    finally:
        server.close()


def matrix(*series: dict) -> dict:
    return {"status": "success", "data": {"resultType": "matrix", "result": list(series)}}


def series(values, **labels) -> dict:
    labels.setdefault("user", "alice")
    labels.setdefault("model", "A100")
    return {"metric": labels, "values": values}


def grid(value: str, n: int = 60, offset: int = 0) -> list:
    return [[T0 + offset + 60 * i, value] for i in range(n)]


def src(fake: FakePrometheus, **kw) -> PrometheusUsageSource:
    kw.setdefault("clock", LATER)
    kw.setdefault("retries", 0)
    kw.setdefault("sleep", lambda s: None)
    kw.setdefault("count_on_server", False)
    return PrometheusUsageSource(fake.url, **kw)


def test_request_shape_and_decimal_sum(fake: FakePrometheus) -> None:
    fake.answer((200, matrix(series(grid("0.1")), series(grid("1e-2", 30), user="ünï o'b"))))
    got = src(fake, bearer_token="s3cret", headers={"X-Scope-OrgID": "lab"}).usage(START, END)
    # 60 × 0.1 × 60 s: exactly 360 with Decimal (float sums give 359.99999999999994)
    assert got == [Usage("alice", "A100", Decimal("360.0")), Usage("ünï o'b", "A100", Decimal("18.00"))]
    form, headers = fake.requests[0]
    assert form["start"] == [str(T0)]
    assert form["end"] == [str(T0 + 3600 - 60)]  # last step starts 60 s before the end
    assert form["step"] == ["60"]
    assert form["query"][0].startswith("max by (user, model, node, server, allocation)")  # summed client-side
    assert headers["Authorization"] == "Bearer s3cret"
    assert headers["X-Scope-OrgID"] == "lab"


def test_zero_usage_is_omitted(fake: FakePrometheus) -> None:
    fake.answer((200, matrix(series(grid("0")))))
    assert src(fake).usage(START, END) == []


@pytest.mark.parametrize(
    ("status", "body", "message"),
    [
        (200, "{not json", "answer is not JSON"),
        (200, "<html><body>Please log in</body></html>", "answer is not JSON"),
        (200, b"\xff\xfe", "answer is not JSON"),
        (200, "[1, 2]", "JSON but not an object"),
        (200, {"status": "error", "errorType": "timeout", "error": "query timed out"},
         "status is 'error'.*timeout: query timed out"),
        (200, {"status": "success"}, "no 'data' object"),
        (200, {"status": "success", "data": {"resultType": "vector", "result": []}},
         "expected resultType 'matrix'.*'vector'"),
        (200, {"status": "success", "data": {"resultType": "matrix", "result": {}}}, "not a list"),
        (200, matrix("oops"), "malformed series"),
        (200, {**matrix(), "warnings": ["partial response"]}, "warnings .*partial response"),
        (400, {"status": "error", "errorType": "bad_data", "error": "parse error"},
         "HTTP 400: bad_data: parse error"),
        (422, {"status": "error", "errorType": "execution", "error": "many-to-many"}, "HTTP 422: execution"),
        (401, "Unauthorized", "HTTP 401: Unauthorized"),
        (200, matrix(series(grid("NaN"))), "non-finite value NaN"),
        (200, matrix(series(grid("+Inf"))), r"non-finite value \+Inf"),
        (200, matrix(series(grid("-Inf"))), "non-finite value -Inf"),
        (200, matrix(series(grid("-0.5"))), "negative value -0.5"),
        (200, matrix(series(grid("two"))), "unparsable sample value 'two'"),
        (200, matrix(series([[T0, 1]])), "is not a string"),
        (200, matrix(series([[str(T0), "1"]])), "non-numeric timestamp"),
        (200, matrix(series([[T0 + 0.5, "1"]])), "off-grid timestamp"),
        (200, matrix(series([[T0 + 30, "1"]])), "unexpected timestamp"),
        (200, matrix(series([[T0 + 3600, "1"]])), "unexpected timestamp"),
        (200, matrix(series([[T0, "1"], [T0, "1"]])), "unexpected timestamp"),
        (200, matrix(series([[T0, "1", "x"]])), "malformed point"),
        (200, matrix(series("1")), "'values' .* is not a list"),
        (200, matrix({"metric": {"model": "A100"}, "values": grid("1")}), "lacks the user label"),
        (200, matrix({"metric": {"user": "alice"}, "values": grid("1")}), "lacks the model label"),
        (200, matrix({"metric": {}, "values": grid("1")}), "lacks the user and model label"),
        (200, matrix(series(grid("1")), series(grid("1"))), "duplicate series for user='alice'"),
        (200, matrix({"metric": {"user": "a", "model": "m"}, "histograms": []}), "native histograms"),
    ],
)
def test_bad_answers_are_unavailable(fake: FakePrometheus, status: int, body, message: str) -> None:
    fake.answer((status, body))
    with pytest.raises(UsageUnavailable, match=message):
        src(fake, retries=2).usage(START, END)
    if status < 500:
        assert len(fake.requests) == 1, "client errors and bad answers are not retried"


def test_warnings_may_be_allowed(fake: FakePrometheus) -> None:
    fake.answer((200, {**matrix(series(grid("1"))), "warnings": ["something benign"]}))
    assert src(fake, allow_warnings=True).usage(START, END) == [Usage("alice", "A100", Decimal(3600))]


def test_server_errors_are_retried_with_backoff(fake: FakePrometheus) -> None:
    sleeps: list[float] = []
    fake.answer((503, "Service Unavailable"), (502, "Bad Gateway"), (200, matrix(series(grid("1")))))
    got = src(fake, retries=3, backoff_seconds=0.5, sleep=sleeps.append).usage(START, END)
    assert got == [Usage("alice", "A100", Decimal(3600))]
    assert len(fake.requests) == 3
    assert sleeps == [0.5, 1.0]


def test_retries_are_bounded(fake: FakePrometheus) -> None:
    sleeps: list[float] = []
    fake.answer((503, {"status": "error", "errorType": "unavailable", "error": "storage not ready"}))
    with pytest.raises(UsageUnavailable, match="did not answer after 4 attempts: HTTP 503: unavailable: storage"):
        src(fake, retries=3, backoff_seconds=1, sleep=sleeps.append).usage(START, END)
    assert len(fake.requests) == 4
    assert sleeps == [1, 2, 4]


def test_timeout_is_retried_then_unavailable(fake: FakePrometheus) -> None:
    fake.answer((200, matrix(), 1.0))
    t = time.monotonic()
    with pytest.raises(UsageUnavailable, match="did not answer after 2 attempts: ReadTimeout"):
        src(fake, retries=1, timeout=0.2).usage(START, END)
    assert time.monotonic() - t < 1.5
    assert fake.requests[0][0]["timeout"] == ["0.2"]


def test_nothing_listening() -> None:
    from tests.fixtures.ports import free_port

    port = free_port()
    source = PrometheusUsageSource(f"http://127.0.0.1:{port}", retries=2, sleep=lambda s: None, clock=LATER)
    with pytest.raises(UsageUnavailable, match="did not answer after 3 attempts: ConnectionError"):
        source.usage(START, END)


@pytest.mark.parametrize("settle", [0, 120, 900])
def test_unsettled_interval_is_refused(fake: FakePrometheus, settle: int) -> None:
    fake.answer((200, matrix(series(grid("1")))))
    settled = END + timedelta(seconds=settle)
    early = src(fake, settle_seconds=settle, clock=lambda: settled - timedelta(seconds=1))
    with pytest.raises(UsageUnavailable, match="not settled yet"):
        early.usage(START, END)
    assert fake.requests == [], "no query for an open interval"
    on_time = src(fake, settle_seconds=settle, clock=lambda: settled)
    assert on_time.usage(START, END) == [Usage("alice", "A100", Decimal(3600))]


def test_future_interval_is_refused(fake: FakePrometheus) -> None:
    now = datetime.now(timezone.utc).replace(microsecond=0)
    source = PrometheusUsageSource(fake.url)
    with pytest.raises(UsageUnavailable, match="not settled yet"):
        source.usage(now - timedelta(hours=1), now)


def test_dcgm_label_users_are_decoded(fake: FakePrometheus) -> None:
    fake.answer((200, matrix(series(grid("1"), user="o-27brien-40lab-20-c3-bcn-c3-af"))))
    assert src(fake, preset="dcgm").usage(START, END) == [Usage("o'brien@lab ünï", "A100", Decimal(3600))]


def test_dcgm_undecodable_label_is_unavailable(fake: FakePrometheus) -> None:
    fake.answer((200, matrix(series(grid("1"), user="user-1---751ab4e2"))))
    with pytest.raises(UsageUnavailable, match="cannot recover the JupyterHub username.*annotation"):
        src(fake, preset="dcgm").usage(START, END)


def test_url_path_prefix(fake: FakePrometheus) -> None:
    fake.answer((200, matrix()))
    assert src(fake).usage(START, END) == []
    source = PrometheusUsageSource(fake.url + "/prometheus/", clock=LATER, retries=0, count_on_server=False)
    fake.requests.clear()
    # the fake serves every path; just check we do not double the slash
    assert source.url == fake.url + "/prometheus"
    assert source.usage(START, END) == []


# -- counted answers -----------------------------------------------------------


def vector(*series: dict) -> dict:
    return {"status": "success", "data": {"resultType": "vector", "result": list(series)}}


def stat(value: str, **labels) -> dict:
    labels.setdefault("user", "alice")
    labels.setdefault("model", "A100")
    return {"metric": labels, "value": [T0 + 3600 - 60, value]}


def counted(count: str, value: str, changed: bool = False, **labels) -> dict[str, dict]:
    """The three answers (count, max, changed) for one series."""
    return {"count": vector(stat(count, **labels)), "max": vector(stat(value, **labels)),
            "changed": vector(stat("1", **labels)) if changed else vector()}


QUERIES = ["/api/v1/query"] * 3


def test_a_clean_interval_is_three_instant_queries(fake: FakePrometheus) -> None:
    fake.route(count=vector(stat("60"), stat("30", user="ünï o'b", node="b")),
               max=vector(stat("0.1"), stat("1e-2", user="ünï o'b", node="b")), changed=vector())
    got = src(fake, count_on_server=True).usage(START, END)
    # 60 × 0.1 per step of 60 s: exactly 360 with Decimal (the float sum is off)
    assert got == [Usage("alice", "A100", Decimal("360.0")), Usage("ünï o'b", "A100", Decimal("18.00"))]
    assert fake.paths == QUERIES
    queries = sorted(form["query"][0] for form, _headers in fake.requests)
    window = "(gpupool_allocated_gpus)[3570000ms:60s]"  # from half a step before the first point
    assert queries == [f"changes({window}) > 0", f"count_over_time({window})", f"max_over_time({window})"]
    assert {form["time"][0] for form, _headers in fake.requests} == {str(T0 + 3600 - 60)}  # the last point


def test_copies_of_one_allocation_count_once(fake: FakePrometheus) -> None:
    fake.route(count=vector(stat("60", job="a"), stat("60", job="b")),
               max=vector(stat("1", job="a"), stat("1", job="b")), changed=vector())
    assert src(fake, count_on_server=True).usage(START, END) == [Usage("alice", "A100", Decimal(3600))]
    assert fake.paths == QUERIES


def test_only_the_allocations_that_changed_are_read_point_by_point(fake: FakePrometheus) -> None:
    fake.route(count=vector(stat("60"), stat("60", user="bob")), max=vector(stat("1"), stat("2", user="bob")),
               changed=vector(stat("1", user="bob")),
               points=matrix(series([[T0 + 60 * i, str(1 + i % 2)] for i in range(60)], user="bob")))
    got = src(fake, count_on_server=True).usage(START, END)
    assert got == [Usage("alice", "A100", Decimal(3600)), Usage("bob", "A100", Decimal(90 * 60))]
    assert fake.paths == QUERIES + ["/api/v1/query_range"]
    query = fake.requests[-1][0]["query"][0]
    identity = "user, model, node, server, allocation"
    assert query == (f"max by ({identity}) (gpupool_allocated_gpus and on ({identity}) "
                     f"(changes((gpupool_allocated_gpus)[3570000ms:60s] @ {T0 + 3600 - 60}) > 0))")


@pytest.mark.parametrize(
    ("answers", "points", "expected"),
    [
        (counted("60", "1", changed=True), series(grid("NaN")), "non-finite value NaN"),  # NaN among numbers
        (counted("60", "NaN"), series(grid("NaN")), "non-finite value NaN"),
        (counted("60", "-0.5"), series(grid("-0.5")), "negative value -0.5"),
        (counted("60", "1", user=""), series(grid("1"), user=""), "lacks the user label"),
        (counted("60", "1", changed=True, user=""), series(grid("1"), user=""), "lacks the user label"),
    ],
    ids=["nan-among-numbers", "nan", "negative", "no-user", "no-user-changed"],
)
def test_anything_unusual_is_judged_point_by_point(
    fake: FakePrometheus, answers: dict, points: dict, expected: str
) -> None:
    """The counted answers are not judged on their own: the points are, with the same messages as ever."""
    fake.route(**answers, points=matrix(points))
    with pytest.raises(UsageUnavailable, match=expected):
        src(fake, count_on_server=True).usage(START, END)
    assert fake.paths == QUERIES + ["/api/v1/query_range"]


@pytest.mark.parametrize(
    "answers",
    [
        counted("59.5", "1"),  # a count that is not whole
        {"count": vector(stat("60")), "max": vector(), "changed": vector()},  # a value missing for a series
        {"count": vector(stat("30", job="a"), stat("30", job="b")),
         "max": vector(stat("1", job="a"), stat("1", job="b")), "changed": vector()},  # copies that differ
    ],
    ids=["fractional-count", "missing-value", "copies-that-differ"],
)
def test_answers_that_cannot_be_trusted_send_the_chunk_point_by_point(fake: FakePrometheus, answers: dict) -> None:
    fake.route(**answers, points=matrix(series(grid("1"))))
    assert src(fake, count_on_server=True).usage(START, END) == [Usage("alice", "A100", Decimal(3600))]
    assert fake.paths == QUERIES + ["/api/v1/query_range"]
    assert fake.requests[-1][0]["query"][0].startswith("max by (user, model, node, server, allocation) (gpupool")


def test_a_failing_counted_query_fails_the_interval(fake: FakePrometheus) -> None:
    """One of the queries sent at once failing is the interval unavailable, like any failed answer."""
    fake.route(count=vector(stat("60")), max=vector(stat("1")),
               changed={"status": "error", "errorType": "timeout", "error": "query timed out"})
    with pytest.raises(UsageUnavailable, match="timeout: query timed out"):
        src(fake, count_on_server=True).usage(START, END)


def test_custom_and_dcgm_queries_are_read_point_by_point(fake: FakePrometheus) -> None:
    fake.answer((200, matrix(series(grid("1"), user="o-27brien"))))
    assert src(fake, preset="dcgm", count_on_server=True).usage(START, END) == [
        Usage("o'brien", "A100", Decimal(3600))]
    assert fake.paths == ["/api/v1/query_range"]


def test_an_interval_off_the_step_grid_is_read_point_by_point(fake: FakePrometheus) -> None:
    fake.answer((200, matrix(series(grid("1", offset=30)))))
    shifted = src(fake, count_on_server=True, clock=lambda: END + timedelta(hours=2))
    assert shifted.usage(START + timedelta(seconds=30), END + timedelta(seconds=30)) == [
        Usage("alice", "A100", Decimal(3600))]
    assert fake.paths == ["/api/v1/query_range"]
