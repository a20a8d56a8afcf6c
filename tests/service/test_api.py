"""The service's REST API in a real JupyterHub: every endpoint, the auth matrix, bad input."""

from __future__ import annotations

import csv
import io
from urllib.parse import quote

import pytest

from tests.service.conftest import ODD
from tests.service.openapi import SPEC, check

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def hub(api_hub):
    return api_hub


def call(hub, who, method, path, **kw):
    return hub.service(method, path, hub.tokens[who], **kw)


def allocate(hub, user, request, server="", who="spawner"):
    return call(hub, who, "POST", "/allocations", json={"user": user, "server": server, "request": request})


# --------------------------------------------------------------- auth matrix

def _matrix_cases():
    A, U, S = "admin", "user", "spawner"
    # endpoint -> who may: "user" = any user for their own data
    return [
        ("GET", "/me", {U, A}),
        ("GET", "/me/history", {U, A}),
        ("GET", "/users", {A}),
        ("GET", "/users/alice", {S, A}),
        ("GET", "/users/alice/history", {A}),
        ("GET", "/pool", {A}),
        ("GET", "/ledger/verify", {A}),
        ("GET", "/ledger/export", {A}),
        ("GET", "/audit", {A}),
        ("GET", "/allocations", {S, A}),
        ("GET", "/metrics", {S, A}),
    ]


@pytest.mark.parametrize("method, path, allowed", _matrix_cases())
def test_auth_matrix_for_reads(hub, method, path, allowed):
    expected = {
        "alice": 200 if "user" in allowed else 403,
        "bob": 200 if "user" in allowed else 403,
        "admin": 200,
        "spawner": 200 if "spawner" in allowed else (400 if path.startswith("/me") else 403),
        "none": 401,
        "bogus": 401,
        "noaccess": 403,
    }
    for who, status in expected.items():
        if path == "/metrics":
            import requests

            headers = {"Authorization": f"token {hub.tokens[who]}"} if hub.tokens[who] else {}
            r = requests.get(f"{hub.url}/services/gpupool/metrics", headers=headers, timeout=30)
        else:
            r = call(hub, who, method, path)
        assert r.status_code == status, f"{who} {method} {path}: {r.status_code} {r.text[:200]}"
        if status >= 400 and path != "/metrics":
            assert r.json()["message"], r.text


def test_auth_matrix_for_writes(hub):
    grant = {"amount": "1", "reason": "matrix"}
    for who, status in {"alice": 403, "bob": 403, "spawner": 403, "none": 401, "bogus": 401, "noaccess": 403}.items():
        r = call(hub, who, "POST", "/users/alice/grant", json=grant)
        assert r.status_code == status, (who, r.text)
        if who != "spawner":  # the spawner's very job is to allocate
            r = allocate(hub, "alice", {"gpus": 1}, server=f"m-{who}", who=who)
            assert r.status_code == status, (who, r.text)
    r = allocate(hub, "bob", {"gpus": 1}, server="matrix")
    alloc = r.json()["allocation"]["id"]
    for who, status in {"alice": 403, "bob": 403, "none": 401, "bogus": 401}.items():
        assert call(hub, who, "DELETE", f"/allocations/{alloc}").status_code == status
    assert call(hub, "admin", "DELETE", f"/allocations/{alloc}").status_code == 200
    assert call(hub, "admin", "POST", "/users/alice/grant", json=grant).status_code == 201


def test_users_see_only_their_own_balance(hub):
    call(hub, "admin", "POST", "/users/bob/grant", json={"amount": "7", "reason": "bob only"})
    alice = call(hub, "alice", "GET", "/me").json()
    bob = call(hub, "bob", "GET", "/me").json()
    assert alice["user"] == "alice" and bob["user"] == "bob"
    assert all(e["reason"] != "bob only" for e in call(hub, "alice", "GET", "/me/history").json()["entries"])


# ----------------------------------------------------------------- endpoints

def test_me_matches_the_openapi_document(hub):
    me = call(hub, "alice", "GET", "/me").json()
    check("Me", me)
    assert me["floor"] == "-10.000" and me["unit"] == "tokens"
    assert me["credits"]["daily"] == "1.000" and me["credits"]["monthly"] == "30.000"
    assert me["accounting"]["status"] == "ok"


def test_history_paginates_newest_first(hub):
    for i in range(5):
        r = call(hub, "admin", "POST", "/users/carol/grant", json={"amount": str(i + 1), "reason": f"r{i}"},
                 headers={"Idempotency-Key": f"carol-{i}"})
        assert r.status_code == 201
    page = call(hub, "admin", "GET", "/users/carol/history?limit=2").json()
    check("History", page)
    assert [e["reason"] for e in page["entries"]] == ["r4", "r3"]
    page2 = call(hub, "admin", "GET", f"/users/carol/history?limit=2&before={page['next_before']}").json()
    assert [e["reason"] for e in page2["entries"]] == ["r2", "r1"]


def test_grant_is_idempotent_by_header(hub):
    before = call(hub, "admin", "GET", "/users/bob").json()["balance"]
    body = {"amount": "2.5", "reason": "conference demo"}
    first = call(hub, "admin", "POST", "/users/bob/grant", json=body, headers={"Idempotency-Key": "demo-1"})
    again = call(hub, "admin", "POST", "/users/bob/grant", json=body, headers={"Idempotency-Key": "demo-1"})
    assert first.status_code == 201 and again.status_code == 200
    check("GrantResult", first.json())
    assert first.json()["entry"]["id"] == again.json()["entry"]["id"]
    after = call(hub, "admin", "GET", "/users/bob").json()["balance"]
    from decimal import Decimal

    assert Decimal(after) - Decimal(before) == Decimal("2.5")
    other = call(hub, "admin", "POST", "/users/bob/grant", json={"amount": "3", "reason": "x"},
                 headers={"Idempotency-Key": "demo-1"})
    assert other.status_code == 409


@pytest.mark.parametrize(
    "body, needle",
    [
        (b"{not json", "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        ({"amount": 2.5, "reason": "float"}, "string"),
        ({"amount": "-1000000000000", "reason": "absurd"}, "range"),
        ({"amount": "0", "reason": "zero"}, "non-zero"),
        ({"amount": "1.0001", "reason": "too precise"}, "3 decimal places"),
        ({"amount": "NaN", "reason": "nan"}, "plain decimal"),
        ({"amount": "lots", "reason": "words"}, "number"),
        ({"amount": True, "reason": "bool"}, "boolean"),
        ({"amount": "5"}, "reason"),
        ({"amount": "5", "reason": "x", "extra": 1}, "unknown"),
    ],
)
def test_bad_grants_are_400_with_a_message(hub, body, needle):
    kw = {"data": body} if isinstance(body, bytes) else {"json": body}
    r = call(hub, "admin", "POST", "/users/alice/grant", **kw)
    assert r.status_code == 400, r.text
    assert needle in r.json()["message"]


def test_grant_to_unknown_user_is_404(hub):
    r = call(hub, "admin", "POST", "/users/nobody-here/grant", json={"amount": "5", "reason": "x"})
    assert r.status_code == 404
    assert call(hub, "admin", "GET", "/users/nobody-here").status_code == 404


def test_odd_usernames_work_end_to_end(hub):
    r = call(hub, "admin", "POST", f"/users/{quote(ODD, safe='')}/grant", json={"amount": "3", "reason": "odd"})
    assert r.status_code == 201, r.text
    me = call(hub, "odd", "GET", "/me").json()
    assert me["user"] == ODD and me["balance"] == "103.000"


def test_allocation_placed_priced_and_released(hub):
    r = allocate(hub, "alice", {"gpus": 2, "models": ["RTX 3090"]}, server="train")
    assert r.status_code == 201, r.text
    check("Allocated", r.json())
    alloc = r.json()["allocation"]
    assert alloc["node"] == "node-a" and alloc["price_per_hour"] == "2.000"
    assert sorted(g["index"] for g in alloc["gpus"]) in ([0, 3], [1, 2])  # an NVLinked pair
    assert "NVLink" in alloc["description"]
    # a retry of the same server returns the same allocation, not more GPUs
    assert allocate(hub, "alice", {"gpus": 2, "models": ["RTX 3090"]}, server="train").json()["allocation"]["id"] == alloc["id"]
    me = call(hub, "alice", "GET", "/me").json()
    assert [a["id"] for a in me["allocations"]] == [alloc["id"]]
    assert me["burn_rate_per_hour"] == "2.000" and me["time_to_floor_seconds"] > 0
    pool = call(hub, "admin", "GET", "/pool").json()
    check("Pool", pool)
    holders = [h for n in pool["nodes"] for g in n["gpus"] for h in g["holders"]]
    assert {(h["user"], h["server"]) for h in holders} == {("alice", "train")}
    r = call(hub, "spawner", "DELETE", f"/allocations/{alloc['id']}")
    assert r.status_code == 200 and r.json()["allocation"]["released_at"]
    assert call(hub, "spawner", "DELETE", f"/allocations/{alloc['id']}").status_code == 200  # idempotent
    assert call(hub, "alice", "GET", "/me").json()["allocations"] == []


def test_refusals_say_why(hub):
    # model that does not exist
    r = allocate(hub, "bob", {"gpus": 1, "models": ["H100"]}, server="m")
    assert r.status_code == 409 and r.json()["reason"] == "model_unavailable"
    check("Refusal", r.json())
    # more GPUs than any node has
    r = allocate(hub, "bob", {"gpus": 8}, server="big")
    assert r.json()["reason"] == "model_unavailable"
    # capacity: take both A6000s, then ask for one more
    held = [allocate(hub, "admin", {"gpus": 1, "models": ["RTX A6000"]}, server=f"a{i}").json() for i in range(2)]
    r = allocate(hub, "bob", {"gpus": 1, "models": ["RTX A6000"]}, server="late")
    assert r.json()["reason"] == "no_capacity"
    assert "Free now" in r.json()["message"]
    for h in held:
        call(hub, "spawner", "DELETE", f"/allocations/{h['allocation']['id']}")
    # balance: take bob below what an A6000 hour needs
    bal = call(hub, "admin", "GET", "/users/bob").json()["balance"]
    call(hub, "admin", "POST", "/users/bob/grant", json={"amount": f"-{bal}", "reason": "drain"})
    call(hub, "admin", "POST", "/users/bob/grant", json={"amount": "-9", "reason": "drain more"})
    r = allocate(hub, "bob", {"gpus": 1, "models": ["RTX A6000"]}, server="poor")
    body = r.json()
    assert body["reason"] == "insufficient_balance", body
    assert "your balance is \u22129 " in body["message"] and "4 tokens/h" in body["message"]
    assert body["retry_at"] is not None  # the daily credits make it possible later


@pytest.mark.parametrize(
    "request_body",
    [
        {"gpus": -1}, {"gpus": 17}, {"gpus": "two"}, {"gpus": 1.5}, {"gpu_fraction": 1.5},
        {"gpu_fraction": "abc"}, {"gpus": 1, "gpu_fraction": 0.5}, {"models": "RTX 3090", "gpus": 1},
        {"gpus": 1, "colour": "blue"}, "gpus=1", {},
    ],
)
def test_bad_allocation_requests_are_400(hub, request_body):
    r = allocate(hub, "alice", request_body, server="bad")
    assert r.status_code == 400, r.text
    assert r.json()["message"]


def test_fraction_costs_its_share(hub):
    r = allocate(hub, "carol", {"gpu_fraction": 0.25, "models": ["RTX A6000"]}, server="frac")
    assert r.status_code == 201, r.text
    assert r.json()["allocation"]["price_per_hour"] == "1.000"
    call(hub, "spawner", "DELETE", f"/allocations/{r.json()['allocation']['id']}")


def test_users_verify_export_and_metrics(hub):
    users = call(hub, "admin", "GET", "/users?limit=2").json()
    check("Users", users)
    assert len(users["users"]) == 2 and users["next_after"]
    rest = call(hub, "admin", "GET", f"/users?limit=100&after={quote(users['next_after'])}").json()
    assert not {u["name"] for u in users["users"]} & {u["name"] for u in rest["users"]}
    verify = call(hub, "admin", "GET", "/ledger/verify").json()
    check("Verify", verify)
    assert verify["ok"] and verify["entries"] > 0
    rows = list(csv.DictReader(io.StringIO(call(hub, "admin", "GET", "/ledger/export").text)))
    assert len(rows) == verify["entries"]
    assert {r["user"] for r in rows} >= {"alice", "bob", ODD}
    import requests

    text = requests.get(f"{hub.url}/services/gpupool/metrics",
                        headers={"Authorization": f"token {hub.tokens['admin']}"}, timeout=30).text
    assert 'gpupool_balance_tokens{user="alice"}' in text
    assert "gpupool_api_request_duration_seconds_bucket" in text
    assert 'gpupool_capacity_gpus{model="NVIDIA RTX A6000"} 2.0' in text


def test_every_documented_path_is_served(hub):
    for path in SPEC["paths"]:
        if "get" not in SPEC["paths"][path]:
            continue
        concrete = path.replace("{name}", "alice").replace("{id}", "nope").replace("{node}", "node-a")
        r = call(hub, "admin", "GET", concrete)
        # 404 only where the document says "no such allocation / never reported"
        assert r.status_code != 404 or "404" in SPEC["paths"][path]["get"]["responses"], path
        assert r.status_code < 500, (path, r.text)


def test_get_queue_carries_the_estimates_accuracy(hub):
    queue = call(hub, "admin", "GET", "/queue").json()
    check("Queue", queue)
    acc = queue["accuracy"]
    assert acc["days"] == 30 and acc["starts"] >= 0
    assert acc["text"].startswith("last 30 days: ")
    assert call(hub, "alice", "GET", "/queue").status_code == 403  # pool-wide: admins only
