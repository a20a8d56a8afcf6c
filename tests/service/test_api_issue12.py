"""Issue 12, "money and safety: fix what probing found": one regression test per item,
against the real hub, service and database (the API modules' shared hub)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from decimal import Decimal
from urllib.parse import quote

import psutil
import pytest
import requests

from tests.service.openapi import check

pytestmark = pytest.mark.integration


def q(name: str) -> str:
    """A path segment as every client of the API must send it: quoted once, nothing safe."""
    return quote(name, safe="")


@pytest.fixture(scope="module")
def hub(api_hub):
    return api_hub


def admin(hub, method, path, **kw):
    return hub.service(method, path, hub.tokens["admin"], **kw)


def balance(hub, name):
    r = admin(hub, "GET", f"/users/{q(name)}")
    assert r.status_code == 200, r.text
    return Decimal(r.json()["balance"])


def gpupool_cli(hub, *args):
    env = {**os.environ, "GPUPOOL_URL": hub.service_api, "GPUPOOL_TOKEN": hub.tokens["admin"]}
    return subprocess.run([sys.executable, "-m", "gpupool_hub.cli", *args], env=env, capture_output=True,
                          text=True, timeout=60)


# ----------------------------------------------------------------- 12.1

ODD_NAMES = ["%62ob", "a+b", "a b", "zoë 'q\" ü", "x%2By"]


def test_12_1_usernames_are_decoded_once(hub):
    """``users/%2562ob/grant`` credits the hub user ``%62ob``, never ``bob``; ``a+b`` and
    ``a b`` are two accounts; each user's own token sees their own balance; the spawner
    (which quotes with ``safe=''``) and the CLI reach the same accounts."""
    for name in ODD_NAMES:
        hub.create_user(name)
    tokens = {name: hub.token_for(name) for name in ODD_NAMES}
    bob_before = balance(hub, "bob")
    for i, name in enumerate(ODD_NAMES, start=1):
        r = admin(hub, "POST", f"/users/{q(name)}/grant", json={"amount": f"0.00{i}", "reason": f"odd {i}"})
        assert r.status_code == 201, (name, r.text)
    assert balance(hub, "bob") == bob_before, "a grant to '%62ob' credited bob"
    for i, name in enumerate(ODD_NAMES, start=1):
        expected = Decimal(100) + Decimal(f"0.00{i}")
        me = hub.service("GET", "/me", tokens[name]).json()
        assert (me["user"], Decimal(me["balance"])) == (name, expected)
        as_spawner = hub.service("GET", f"/users/{q(name)}", hub.spawner_token).json()
        assert (as_spawner["user"], Decimal(as_spawner["balance"])) == (name, expected)
        history = admin(hub, "GET", f"/users/{q(name)}/history").json()
        assert history["user"] == name and history["entries"][0]["reason"] == f"odd {i}"
    # the admin CLI quotes the same way
    r = gpupool_cli(hub, "grant", "a+b", "2", "--reason", "cli plus")
    assert r.returncode == 0, r.stderr
    r = gpupool_cli(hub, "balance", "a+b")
    assert r.returncode == 0 and r.stdout.startswith("a+b: 102.002 tokens"), r.stdout
    r = gpupool_cli(hub, "history", "%62ob")
    assert r.returncode == 0 and "odd 1" in r.stdout, r.stdout
    assert balance(hub, "a b") == Decimal("100.003")


def test_12_1_node_names_are_decoded_once(hub):
    """A node agent whose node name needs quoting reaches its own URLs with its own token."""
    node = next(n for n in hub.agent_tokens if n != "node-a")
    token = hub.agent_tokens[node]
    inventory = {"cpu_milli": 1000, "memory_mib": 1024, "gpus": {"count": 1, "model": "NVIDIA RTX A6000"}}
    r = hub.service("PUT", f"/nodes/{q(node)}/inventory", token, json=inventory)
    assert r.status_code == 200, r.text
    assert r.json()["node"] == node
    r = hub.service("GET", f"/nodes/{q(node)}/enforce", token)
    assert r.status_code == 200, r.text
    assert admin(hub, "GET", f"/nodes/{q(node)}/inventory").json()["node"] == node
    # the same token is no good for the node its name decodes to a second time
    assert hub.service("GET", f"/nodes/{q('rack 1+2/A')}/enforce", token).status_code == 403


# ----------------------------------------------------------------- 12.5

def _service_process(hub) -> psutil.Process:
    for proc in psutil.Process(hub.proc.pid).children(recursive=True):
        if "gpupool_hub.service" in " ".join(proc.cmdline()):
            return proc
    raise AssertionError("the gpupool service process is not running under the hub")


class PeakRSS:
    """The largest resident set size of a process while the block runs (sampled every 5 ms)."""

    def __init__(self, proc: psutil.Process) -> None:
        self.proc = proc
        self.peak = 0
        self._stop = threading.Event()

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.proc.memory_info().rss)
            self._stop.wait(0.005)

    def __enter__(self) -> "PeakRSS":
        self.before = self.proc.memory_info().rss
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.after = self.proc.memory_info().rss
        self.peak = max(self.peak, self.after)


MiB = 1024 * 1024


def test_12_5_bodies_are_not_read_before_authentication(hub):
    """Six concurrent 7 MiB POSTs without a token: each refused 401, and the service's
    memory does not grow by what they sent (42 MiB; buffered, it grew by twice that)."""
    service = _service_process(hub)
    body = b"x" * (7 * MiB)
    targets = ["/users/alice/grant", "/allocations", "/nodes/node-a/inventory"] * 2

    def send(path):
        method = "PUT" if path.startswith("/nodes") else "POST"
        return requests.request(method, f"{hub.service_api}{path}", data=body, timeout=60)

    admin(hub, "GET", "/users/alice")  # warm up
    with PeakRSS(service) as rss, ThreadPoolExecutor(len(targets)) as pool:
        answers = list(pool.map(send, targets))
    assert [r.status_code for r in answers] == [401] * len(targets)
    assert all(r.json()["message"].startswith("missing token") for r in answers)
    assert rss.peak - rss.before < 16 * MiB, f"RSS grew from {rss.before / MiB:.0f} to {rss.peak / MiB:.0f} MiB"

    # Beyond the server-wide limit (8 MiB) the body is not read at all: the service answers
    # at once and closes the connection, so the client may see the answer or only the close.
    direct = f"http://127.0.0.1:{hub.service_port}/services/gpupool/api/v1/allocations"
    with PeakRSS(service) as rss:
        try:
            r = requests.post(direct, data=b"x" * (90 * MiB), timeout=60)
            assert r.status_code == 401, r.text[:200]
        except requests.ConnectionError:
            pass
    assert rss.peak - rss.before < 16 * MiB, f"RSS grew from {rss.before / MiB:.0f} to {rss.peak / MiB:.0f} MiB"
    assert admin(hub, "GET", "/users/alice").status_code == 200  # still serving


def test_12_5_an_authenticated_oversize_body_is_413(hub):
    big = json.dumps({"amount": "1", "reason": "x" * (100 * 1024)})
    r = admin(hub, "POST", "/users/alice/grant", data=big)
    assert r.status_code == 413, r.text
    assert "larger than 16384 bytes" in r.json()["message"]
    # a chunked upload declares no length: refused when it passes the limit
    chunks = (b"[" + b"1," * 4096 + b"1]" for _ in range(40))
    r = hub.service("POST", "/allocations", hub.spawner_token, data=chunks)
    assert r.status_code == 413, r.text
    check("Error", r.json())
    assert "larger than 65536 bytes" in r.json()["message"]
    # a refused upload leaves the connection usable, and the limit does not refuse normal bodies
    r = admin(hub, "POST", "/users/alice/grant", json={"amount": "1", "reason": "y" * 1000})
    assert r.status_code == 201, r.text


# ----------------------------------------------------------------- 12.8

BAD_INPUT = [
    # (who, method, path, body, what the message says)
    ("alice", "GET", "/me/history?before=9223372036854775808", None, "between 1 and 9223372036854775807"),
    ("admin", "GET", "/audit?before=99999999999999999999", None, "between 1 and 9223372036854775807"),
    ("admin", "GET", "/audit?limit=%EF%BC%91%EF%BC%92", None, "whole number"),  # fullwidth "12"
    ("admin", "GET", "/users/alice/history?limit=1_0", None, "whole number"),
    ("admin", "GET", "/users/alice/history?before=-9223372036854775809", None, "between 1 and"),
    ("admin", "GET", "/users?after=%7F", None, "control character"),
    ("admin", "GET", "/users/%07bell", None, "control character"),
    ("admin", "POST", "/users/alice/grant", '{"amount": "1E+1000000", "reason": "x"}', "plain decimal"),
    ("admin", "POST", "/users/alice/grant", '{"amount": "1e-999999999", "reason": "x"}', "plain decimal"),
    ("admin", "POST", "/users/alice/grant", '{"amount": "5_000", "reason": "x"}', "plain decimal"),
    ("admin", "POST", "/users/alice/grant", '{"amount": "\uff11\uff12", "reason": "x"}', "plain decimal"),
    ("admin", "POST", "/users/alice/grant", '{"amount": "\u0663", "reason": "x"}', "plain decimal"),
    ("admin", "POST", "/users/alice/grant", '{"amount": " 7", "reason": "x"}', "plain decimal"),
    ("admin", "POST", "/users/alice/grant", '{"amount": "0.000", "reason": "x"}', "non-zero"),
    ("admin", "POST", "/users/alice/grant", '{"amount": 1' + "0" * 5000 + ', "reason": "x"}', "not valid JSON"),
    ("admin", "POST", "/users/alice/grant", '{"amount": "1", "reason": "\\ud800"}', "lone surrogate"),
    ("admin", "POST", "/users/alice/grant", '{"amount": "1", "reason": "ring\\u0007"}', "control character"),
    ("admin", "POST", "/users/alice/grant", '{"\\udfff": 1}', "lone surrogate"),
    ("admin", "POST", "/users/alice/grant", "[" * 5000 + "]" * 5000, "nested"),  # past the recursion limit
    ("admin", "POST", "/users/alice/grant", '{"amount": "1", "reason": ' + "[" * 50 + "]" * 50 + "}", "nested"),
    ("spawner", "POST", "/allocations", '{"user": "x", "request": ' + "[" * 20_000 + "]" * 20_000 + "}", "nested"),
    ("spawner", "POST", "/allocations", '{"user": "x", "request": {"models": ' + "[" * 30 + "]" * 30 + "}}", "nested"),
    ("spawner", "POST", "/allocations", '{"user": "\\ud800", "request": {"gpus": 1}}', "lone surrogate"),
    ("spawner", "POST", "/allocations", b'{"user": "\xff", "request": {"gpus": 1}}', "UTF-8"),
    ("spawner", "DELETE", "/allocations/none?reason=%C2%9B31m", None, "control character"),  # C1 CSI
]


@pytest.mark.parametrize("who, method, path, body, needle", BAD_INPUT,
                         ids=[f"{m} {p[:40]} {str(b)[:30]}" for _, m, p, b, _ in BAD_INPUT])
def test_12_8_bad_input_is_400_never_500(hub, who, method, path, body, needle):
    r = hub.service(method, path, hub.tokens[who], data=body.encode() if isinstance(body, str) else body)
    assert r.status_code == 400, r.text[:300]
    check("Error", r.json())
    assert needle in r.json()["message"], r.json()["message"]


@pytest.mark.parametrize("key, needle", [("", "must not be empty"), ("k\x85", "control character"),
                                         ("k" * 201, "at most 200")])
def test_12_8_bad_idempotency_keys_are_400(hub, key, needle):
    r = admin(hub, "POST", "/users/alice/grant", json={"amount": "1", "reason": "key"}, headers={"Idempotency-Key": key})
    assert r.status_code == 400, r.text
    assert needle in r.json()["message"]


def test_12_8_amounts_are_plain_decimals_recorded_as_sent(hub):
    hub.create_user("dora")
    for amount, recorded in [("7", "7.000"), ("-2.5", "-2.500"), ("+0.125", "0.125"), (12, "12.000")]:
        r = admin(hub, "POST", "/users/dora/grant", json={"amount": amount, "reason": f"as {amount}"})
        assert r.status_code == 201, r.text
        assert r.json()["entry"]["amount"] == recorded
    entries = admin(hub, "GET", "/users/dora/history").json()["entries"]
    assert "0.000" not in {e["amount"] for e in entries}  # "1e-999999999" recorded nothing


# ----------------------------------------------------------------- 12a, 12b

@pytest.mark.parametrize("who", ["none", "alice", "admin"])
@pytest.mark.parametrize("method, path", [("GET", "/nope"), ("POST", "/users/alice/nope"), ("GET", "/me/"),
                                          ("PUT", "/api/v2/me"), ("GET", "/../nope")])
def test_12_12a_unknown_api_routes_answer_json(hub, who, method, path):
    headers = {"Authorization": f"token {hub.tokens[who]}"} if hub.tokens[who] else {}
    # under the service's prefix but outside api/v1 too ("/../nope")
    r = requests.request(method, f"{hub.service_api}{path}", headers=headers, timeout=30,
                         data=b"{}" if method in ("POST", "PUT") else None)
    assert r.status_code == 404, r.text[:200]
    assert r.headers["Content-Type"].startswith("application/json")
    check("Error", r.json())
    assert r.json()["status"] == 404 and "no such endpoint" in r.json()["message"]


def test_12_12a_a_known_route_with_another_method_is_a_json_405(hub):
    r = admin(hub, "DELETE", "/allocations")
    assert r.status_code == 405 and r.json()["status"] == 405


def test_12_12b_admins_grant_to_hub_users_who_never_logged_in(hub):
    """A user created through the hub's API, who never logged in and has no account yet:
    the service asks the hub (its token has ``read:users``), opens the account, grants."""
    names = ["newhire", "new+hire@lab"]
    for name in names:
        hub.create_user(name)
    listed = {u["name"] for u in admin(hub, "GET", "/users", params={"limit": 500}).json()["users"]}
    assert not listed & set(names), "these users must not have an account yet"
    for name in names:
        assert hub.hub_request("GET", f"/users/{q(name)}").json()["last_activity"] is None  # never logged in
        # what the service asks the hub, with its own token
        r = requests.get(f"{hub.api}/users/{q(name)}", headers={"Authorization": f"token {hub.service_token}"},
                         timeout=30)
        assert r.status_code == 200, r.text
        r = admin(hub, "POST", f"/users/{q(name)}/grant", json={"amount": "5", "reason": "welcome"})
        assert r.status_code == 201, (name, r.text)
        assert r.json()["balance"] == "105.000"  # the initial grant, then this one
