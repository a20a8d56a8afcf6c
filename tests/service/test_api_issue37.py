"""Issue 37, points 3-5: bodies with a key twice, node reports with absurd values, names
with bidirectional or zero-width controls.

Every request goes over HTTP to the real service app (real PoolManager over SQLite),
with the caller's own token: the spawner's secret, an admin's hub token, node n1's
agent token. Each refusal is a 400 (or 409) whose message names the field and the
rule, and the service keeps nothing of the request: no ledger entry, no audit event,
no allocation, no inventory report, no memory warning, no utilization reading
(``written`` from ``test_api_bodies`` takes all of them before and after).
"""

from __future__ import annotations

import json
from datetime import datetime, timedelta, timezone
from typing import Any
from urllib.parse import quote

import pytest

from gpupool_hub.timefmt import iso
from tests.agent.test_service import TOKENS, Service

from .test_api_bodies import BOUNDARY_WARNING, GPU, MEMORY_WARNING, SPAWNER, written
from .test_api_bodies import service  # noqa: F401 (the fixture: the real app, alice known)

N1 = TOKENS["n1"]
ADMIN = "admin-token"
#: the characters no name may hold, one of each range the issue names
INVISIBLE = ["\u200b", "\u200f", "\u202a", "\u202e", "\u2066", "\u2069", "\ufeff",
             # issue 48.6: format characters, separators, variation selectors, tags, Hangul fillers
             "\u061c", "\u2060", "\u206a", "\u00ad", "\u034f", "\u180e", "\u115f", "\u3164", "\u2028",
             "\U000e0041", "\ufe0f", "\U000e0100", "\ufff9"]


async def refused(service: Service, method: str, path: str, token: str, body: Any, status: int = 400) -> str:
    """Send the request; it must be refused with ``status`` and change nothing. Its message."""
    before = written(service, service.utilization)
    code, answer = await service.call(method, path, token, body)
    assert code == status, answer
    assert written(service, service.utilization) == before, f"{method} {path}: something was written"
    return answer["message"]


async def place(service: Service, user: str, request: dict[str, Any]) -> dict[str, Any]:
    code, placed = await service.call("POST", "allocations", SPAWNER, {"user": user, "request": request})
    assert code == 201, placed
    return placed["allocation"]["gpus"][0]


def in_an_hour() -> str:
    return iso(datetime.now(timezone.utc) + timedelta(hours=1)) or ""


# ---- 3. a key twice in one object


async def test_a_repeated_user_key_is_refused_and_nobody_gets_gpus(service):
    body = '{"user": "carol", "user": "admin", "request": {"gpus": 1}}'
    message = await refused(service, "POST", "allocations", SPAWNER, body)
    assert "duplicate key 'user'" in message
    assert [r.user for r in service.manager.ledger.allocations.active()] == []


@pytest.mark.parametrize("method, path, token, body, key", [
    ("POST", "allocations", SPAWNER, '{"user": "alice", "request": {"gpus": 1, "gpus": 2}}', "gpus"),
    ("POST", "users/alice/grant", ADMIN, '{"amount": "1", "reason": "a course", "amount": "1000"}', "amount"),
    ("PUT", "nodes/n1/boundary", N1,
     '{"warnings": [{"user": "bob", "user": "alice", "gpu_uuid": "GPU-0000-fake", "gpu_index": 0, '
     '"deadline": "2099-01-01T00:00:00Z", "pids": [42]}]}', "user"),
], ids=["nested object", "grant", "object in a list"])
async def test_a_repeated_key_anywhere_in_a_body_is_refused(service, method, path, token, body, key):
    assert json.loads(body)  # the body is JSON, and Python alone would keep the last value
    assert f"duplicate key {key!r}" in await refused(service, method, path, token, body)


@pytest.mark.parametrize("number", ["NaN", "Infinity", "-Infinity", "1e999"])
@pytest.mark.parametrize("path, template", [
    ("nodes/n1/utilization", '{"gpus": {"%s": %s}}' % (GPU, "{n}")),
    ("nodes/n1/inventory", '{"cpu_milli": 8000, "memory_mib": {n}}'),
    ("nodes/n1/memory", '{"warnings": [], "actions": [{"user": "alice", "server": "", "gpu_uuid": "%s", "pid": 42, '
                        '"memory_bytes": {n}, "action": "terminated", "detail": ""}]}' % GPU),
], ids=["utilization", "inventory", "memory"])
async def test_a_number_json_does_not_have_is_refused(service, path, template, number):
    """Issue 48.7: Python reads NaN (and Infinity, and 1e999 as infinity) where JSON has none; NaN then
    passed every bound of the schema, since it compares false with each. 400, nothing written."""
    body = template.replace("{n}", number)
    message = await refused(service, "PUT", path, N1, body)
    assert "a number JSON does not have" in message, message


# ---- 4. node reports: sizes, pids and deadlines within bounds, warnings about the right users


@pytest.mark.parametrize("path, body, pointer", [
    ("nodes/n1/utilization", {"gpus": {GPU: 0.5}, "memory": {GPU: [1, 10**30]}}, f"/memory/{GPU}/1"),
    ("nodes/n1/inventory", {"cpu_milli": 8000, "memory_mib": 10**30}, "/memory_mib"),
    ("nodes/n1/inventory", {"cpu_milli": 8000, "memory_mib": 32768,
                            "gpus": [{"index": 0, "uuid": GPU, "model": "A100", "memory_mib": 10**30}]},
     "/gpus/0/memory_mib"),
    # 2^60 bytes: a whole exabyte, within 64 bits (the most these fields took before)
    ("nodes/n1/memory", {"warnings": [{**MEMORY_WARNING, "used_bytes": 2**60}]}, "/warnings/0/used_bytes"),
    ("nodes/n1/memory", {"warnings": [], "actions": [{"user": "alice", "server": "", "gpu_uuid": GPU, "pid": 42,
                                                      "memory_bytes": 2**60, "action": "terminated",
                                                      "detail": ""}]}, "/actions/0/memory_bytes"),
    ("nodes/n1/memory", {"warnings": [{**MEMORY_WARNING, "pids": [2**22]}]}, "/warnings/0/pids/0"),
    ("nodes/n1/boundary", {"warnings": [{**BOUNDARY_WARNING, "pids": [2**22]}]}, "/warnings/0/pids/0"),
], ids=["utilization bytes", "inventory MiB", "a GPU's MiB", "warning bytes", "stop bytes", "memory pid",
        "boundary pid"])
async def test_a_node_reports_no_absurd_size_or_pid(service, path, body, pointer):
    message = await refused(service, "PUT", path, N1, body)
    assert f"request body field {pointer} " in message and "maximum" in message, message


@pytest.mark.parametrize("path, warning, pointer", [
    ("nodes/n1/boundary", {**BOUNDARY_WARNING, "deadline": "yesterday"}, "/warnings/0/deadline"),
    ("nodes/n1/memory", {**MEMORY_WARNING, "deadline": "yesterday"}, "/warnings/0/deadline"),
    ("nodes/n1/memory", {**MEMORY_WARNING, "since": "2026-13-45T10:00:00Z"}, "/warnings/0/since"),
    ("nodes/n1/boundary", {**BOUNDARY_WARNING, "deadline": "2026-11-24 10:01"}, "/warnings/0/deadline"),
], ids=["boundary", "memory", "no 13th month", "no zone"])
async def test_a_deadline_must_be_a_date_time(service, path, warning, pointer):
    message = await refused(service, "PUT", path, N1, {"warnings": [warning]})
    assert f"request body field {pointer} must be an RFC 3339 date-time" in message, message


async def test_a_new_boundary_warning_cannot_have_a_past_deadline(service):
    yesterday = iso(datetime.now(timezone.utc) - timedelta(days=1))
    message = await refused(service, "PUT", "nodes/n1/boundary", N1,
                            {"warnings": [{**BOUNDARY_WARNING, "deadline": yesterday}]})
    assert f"/warnings/0/deadline ({yesterday}) is in the past" in message
    assert service.manager.ledger.audit.page(user="bob") == []


async def test_a_memory_warning_names_a_holder_of_a_share_of_that_gpu(service):
    share = await place(service, "alice", {"gpu_fraction": 0.5})
    warning = {**MEMORY_WARNING, "gpu_uuid": share["uuid"], "gpu_index": share["index"]}
    # bob holds nothing on n1: nobody may warn him there, not even with n1's own token
    message = await refused(service, "PUT", "nodes/n1/memory", N1, {"warnings": [{**warning, "user": "bob"}]},
                            status=409)
    assert f"names 'bob', who holds no share of GPU {share['uuid']} on node 'n1'" in message
    assert service.manager.memory.for_user("bob") == []
    # a warning that is no warning, or whose deadline comes before it began
    assert "not over limit_bytes" in await refused(service, "PUT", "nodes/n1/memory", N1,
                                                   {"warnings": [{**warning, "used_bytes": 1 << 30}]})
    assert "is before since" in await refused(service, "PUT", "nodes/n1/memory", N1, {"warnings": [
        {**warning, "since": "2026-11-24T10:00:00Z", "deadline": "2026-11-24T09:00:00Z"}]})
    # alice's, sent again after its deadline passed (she is still over): taken, as the agent sends it
    code, answer = await service.call("PUT", "nodes/n1/memory", N1, {"warnings": [warning]})
    assert code == 200 and answer["audited"] == 1, answer
    assert [w["deadline"] for w in service.manager.memory.for_user("alice")] == [warning["deadline"]]


async def test_a_boundary_warning_names_a_user_out_of_bounds(service):
    held = await place(service, "alice", {"gpus": 1})
    warning = {**BOUNDARY_WARNING, "deadline": in_an_hour(), "gpu_uuid": held["uuid"], "gpu_index": held["index"]}
    message = await refused(service, "PUT", "nodes/n1/boundary", N1, {"warnings": [{**warning, "user": "alice"}]},
                            status=409)
    assert f"names 'alice', who holds GPU {held['uuid']} on node 'n1'" in message
    # bob holds nothing on n1, which is what the boundary guard is for (docs: agent/boundary.py)
    code, answer = await service.call("PUT", "nodes/n1/boundary", N1, {"warnings": [warning]})
    assert code == 200 and answer["audited"] == 1, answer
    assert [e.action for e in service.manager.ledger.audit.page(user="bob")] == ["gpu_out_of_bounds"]


# ---- 5. names without bidirectional or zero-width controls


def assert_names_the_rule(message: str, where: str, char: str) -> None:
    assert f"{where} contains U+{ord(char):04X}" in message, message
    assert "bidirectional or zero-width controls" in message, message


@pytest.mark.parametrize("char", INVISIBLE, ids=[f"U+{ord(c):04X}" for c in INVISIBLE])
async def test_a_spawn_for_a_name_with_an_invisible_control_is_refused(service, char):
    good = {"user": "alice", "server": "gpu", "groups": ["vision"], "request": {"gpus": 1, "models": ["A100"]}}
    for pointer, body in [
        ("/user", {**good, "user": f"bob{char}nimda"}),
        ("/server", {**good, "server": f"gp{char}u"}),
        ("/groups/0", {**good, "groups": [f"vis{char}ion"]}),
        ("/request/models/0", {**good, "request": {"gpus": 1, "models": [f"A1{char}00"]}}),
    ]:
        message = await refused(service, "POST", "allocations", SPAWNER, body)
        assert_names_the_rule(message, f"request body field {pointer}", char)


async def test_names_from_other_scripts_are_still_names(service):
    for user in ("o'brien@lab.ü", "José", "张伟", "خالد"):
        code, answer = await service.call("POST", "allocations", SPAWNER,
                                          {"user": user, "server": "", "request": {"gpu_fraction": 0.25}})
        assert code == 201, (user, answer)


RLO = "\u202e"


@pytest.mark.parametrize("method, path, token, where", [
    ("GET", f"users/{quote('bob' + RLO)}", ADMIN, "user name"),
    ("GET", f"users/{quote('bob' + RLO)}/history", ADMIN, "user name"),
    ("POST", f"users/{quote('bob' + RLO)}/grant", ADMIN, "user name"),
    ("GET", f"users?after={quote('b' + RLO)}", ADMIN, "after"),
    ("GET", f"audit?user={quote('bob' + RLO)}", ADMIN, "user"),
    ("DELETE", f"queue?user={quote('bob' + RLO)}", SPAWNER, "user"),
    ("DELETE", f"queue?user=bob&server={quote('s' + RLO)}", SPAWNER, "server"),
    ("DELETE", f"reclaims?user={quote('bob' + RLO)}", SPAWNER, "user"),
    ("PUT", f"nodes/{quote('n1' + RLO)}/inventory", ADMIN, "node name"),
    ("GET", f"nodes/{quote('n1' + RLO)}/enforce", ADMIN, "node name"),
], ids=["user", "history", "grant", "users after", "audit user", "queue user", "queue server",
        "reclaims user", "inventory node", "enforce node"])
async def test_a_name_in_a_path_or_query_is_refused(service, method, path, token, where):
    body = {"amount": "5", "reason": "a course"} if path.endswith("grant") else (
        {"cpu_milli": 8000, "memory_mib": 32768} if path.endswith("inventory") else None)
    assert_names_the_rule(await refused(service, method, path, token, body), where, RLO)


@pytest.mark.parametrize("path, body, pointer", [
    ("nodes/n1/inventory", {"name": f"n1{RLO}", "cpu_milli": 8000, "memory_mib": 32768}, "/name"),
    ("nodes/n1/memory", {"warnings": [{**MEMORY_WARNING, "user": f"al{RLO}ice"}]}, "/warnings/0/user"),
    ("nodes/n1/boundary", {"warnings": [{**BOUNDARY_WARNING, "user": f"b{RLO}ob"}]}, "/warnings/0/user"),
])
async def test_a_node_report_naming_a_user_or_node_with_an_invisible_control_is_refused(service, path, body, pointer):
    assert_names_the_rule(await refused(service, "PUT", path, N1, body), f"request body field {pointer}", RLO)


async def test_a_utilization_report_for_such_a_user_is_refused(service):
    body = {"gpus": {GPU: 0.5}, "users": {GPU: {f"bob{RLO}": 0.5}}}
    message = await refused(service, "PUT", "nodes/n1/utilization", N1, body)
    assert f"/users/{GPU}" in message and "U+202E" in message, message


class HubWithAnOddUser:
    """The hub knows a user whose name holds U+202E (the hub's authenticator let it through)."""

    async def user_for_token(self, token: str, sync: bool = False) -> dict[str, Any] | None:
        return {"kind": "user", "name": f"bob{RLO}nimda", "scopes": []} if token == "odd-token" else None


async def test_such_a_user_opens_no_account_through_get_me(service):
    service.app.settings["context"].hub_auth = HubWithAnOddUser()
    for path in ("me", "me/history", "me/notices"):
        assert_names_the_rule(await refused(service, "GET", path, "odd-token", None), "this token's user name", RLO)
    assert [a.name for a in service.manager.ledger.accounts()] == ["alice"]
