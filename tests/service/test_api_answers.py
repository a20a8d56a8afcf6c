"""Clean answers through the hub's proxy (issue 27, item 6 and its drift list): a
body too large gets the service's JSON 413, not the hub's HTML 503; a method an
endpoint does not take gets 405 with ``Allow`` listing exactly the methods the
document gives that path; the document's audit actions are the code's.

The shared real hub (``api_hub``): JupyterHub, configurable-http-proxy, the service.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests

from gpupool_hub.reasons import AuditAction
from tests.service.openapi import SPEC

pytestmark = pytest.mark.integration

MIB = 1024 * 1024
METHODS = ("GET", "POST", "PUT", "PATCH", "DELETE")
#: a value for each path parameter of the document
PATH_VALUES = {"name": "alice", "id": "no-such-id", "key": "no-such-key", "node": "node-a"}


def chunks(total: int, size: int = MIB) -> Iterator[bytes]:
    """A body sent chunked (no Content-Length), as a streaming client sends it."""
    for _ in range(total // size):
        yield b"x" * size


@pytest.mark.parametrize("body", ["declared", "chunked"])
def test_a_9_mib_body_through_the_proxy_gets_the_services_json_413(api_hub, body):
    """The probe: 9 MiB through the hub's proxy got the hub's HTML 503 (the service
    closed the connection unread, the proxy's write failed). The proxy has no body
    limit of its own, so the service reads and drops the body, then answers."""
    data = b"x" * (9 * MIB) if body == "declared" else chunks(9 * MIB)
    r = requests.post(f"{api_hub.service_api}/users/alice/grant", data=data, timeout=60,
                      headers={"Authorization": f"token {api_hub.tokens['admin']}",
                               "Content-Type": "application/json"})
    assert r.status_code == 413, (r.status_code, r.headers.get("Content-Type"), r.text[:200])
    assert r.headers["Content-Type"].startswith("application/json")
    assert r.json()["status"] == 413 and "larger than 16384 bytes" in r.json()["message"]
    # without a token the same body is refused for that, also as JSON
    r = requests.post(f"{api_hub.service_api}/users/alice/grant", data=b"x" * (9 * MIB), timeout=60)
    assert r.status_code == 401 and r.json()["status"] == 401


def _path(template: str) -> str:
    for name, value in PATH_VALUES.items():
        template = template.replace("{" + name + "}", value)
    return template


@pytest.mark.parametrize("path", sorted(SPEC["paths"]))
def test_every_405_says_exactly_which_methods_the_document_gives_the_path(api_hub, path):
    documented = {m.upper() for m in SPEC["paths"][path] if m.upper() in METHODS}
    token = api_hub.agent_tokens["node-a"] if path.startswith("/nodes/") else api_hub.tokens["admin"]
    for method in sorted(set(METHODS) - documented):
        r = requests.request(method, f"{api_hub.service_api}{_path(path)}", timeout=30,
                             headers={"Authorization": f"token {token}"})
        assert r.status_code == 405, (method, path, r.status_code, r.text[:200])
        assert r.json()["status"] == 405
        assert set(r.headers["Allow"].split(", ")) == documented, (method, path, r.headers["Allow"])


def test_the_documents_audit_actions_are_the_codes():
    """Every AuditAction can appear in ``GET audit`` (the probe found ``notice_dismissed`` missing)."""
    action = SPEC["components"]["schemas"]["AuditEvent"]["properties"]["action"]
    assert action["enum"] == [a.value for a in AuditAction]
