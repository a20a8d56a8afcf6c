"""Fuzz every operation of openapi.json against the real service, as every caller.

Schemathesis generates requests from the document (valid ones, then ones that
break it) and sends them through the hub's proxy to the running service with
the token of each role: none, a plain user, an admin, the spawner (and a node
agent for the node endpoints). Every answer must be no 5xx, a status the
document lists for that operation, and a body and headers that match it. The
run is derandomized and bounded: ``POSITIVE`` and ``NEGATIVE`` examples per
operation and role.

The checks can only judge the bodies the service sends, so before the run the
ledger gets what an empty pool never shows: an audit event of every action
(``AuditAction``), dry runs too, some of them alice's notices. A value the code
can send and the document does not list then fails the run.

Failures are collected rather than raised, so one run reports everything the
fuzzer found (without hypothesis shrinking each one), deduplicated by role,
operation, check and status, each with a curl command that repeats it.
"""

from __future__ import annotations

import time
from collections import Counter
from datetime import datetime, timezone

import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis.errors import Unsatisfiable
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    response_headers_conformance,
    response_schema_conformance,
    status_code_conformance,
)

from gpupool_hub.ledger import AuditEvent, Ledger
from gpupool_hub.reasons import AuditAction
from tests.service.openapi import SPEC

pytestmark = pytest.mark.integration

POSITIVE = 25  # schema-valid requests per operation and role
NEGATIVE = 10  # requests that break the schema, per operation and role
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance,
          response_headers_conformance]

SCHEMA = schemathesis.openapi.from_dict(SPEC)
DOCUMENTED = {f"{method.upper()} {path}" for path, item in SPEC["paths"].items() for method in item
              if method != "parameters"}
NODE_OPERATIONS = {op for op in DOCUMENTED if " /nodes/" in op}


def seed_audit(hub) -> None:
    """One audit event of every action in the service's ledger, as alice's (her notices)
    and as dry runs; written by another process, as an admin's tool would."""
    ledger = Ledger(f"sqlite:///{hub.workdir}/gpupool.sqlite")
    try:
        now = datetime.now(timezone.utc)
        written = {(action, dry_run): ledger.audit.add(AuditEvent(
            now, "alice", "fuzz", action.value, f"seeded {action.value}", dry_run, {"seeded": True}))
            for action in AuditAction for dry_run in (False, True)}
        dismissed = written[AuditAction.PREEMPT, False].id  # one notice dismissed, the others pending
        ledger.audit.add(AuditEvent(now, "alice", "fuzz", AuditAction.NOTICE_DISMISSED.value,
                                    "dismissed by the user", False, {"notice": dismissed}))
    finally:
        ledger.close()


@pytest.fixture(scope="module")
def hub(api_hub):
    seed_audit(api_hub)
    seen = api_hub.service("GET", "/audit?limit=500", api_hub.tokens["admin"]).json()["events"]
    assert {e["action"] for e in seen} >= {a.value for a in AuditAction}  # the fuzzer's GET audit sees them all
    yield api_hub
    # leave the shared pool as it was: release what the fuzzer allocated
    admin = api_hub.tokens["admin"]
    for alloc in api_hub.service("GET", "/allocations", admin).json()["allocations"]:
        api_hub.service("DELETE", f"/allocations/{alloc['id']}", admin)


def fuzz(hub, token, operations):
    """Run the fuzzer as the holder of ``token`` over ``operations``; returns
    (examples sent per operation, failures found, a repeatable example of each)."""
    session = requests.Session()
    headers = {"Authorization": f"token {token}"} if token else {}
    sent: Counter[str] = Counter()
    failures: Counter[tuple[str, str, int]] = Counter()
    examples: dict[tuple[str, str, int], str] = {}
    for result in SCHEMA.get_all_operations():
        operation = result.ok()
        if operation.label not in operations:
            continue
        for mode, count in ((schemathesis.GenerationMode.POSITIVE, POSITIVE),
                            (schemathesis.GenerationMode.NEGATIVE, NEGATIVE)):

            @settings(max_examples=count, derandomize=True, database=None, deadline=None,
                      suppress_health_check=list(HealthCheck), phases=[Phase.explicit, Phase.generate])
            @given(case=operation.as_strategy(generation_mode=mode))
            def run(case):
                if case.headers:  # the role's token, or none at all, is what this run is about
                    case.headers.pop("Authorization", None)
                response = case.call(base_url=hub.service_api, session=session, headers=headers, timeout=30)
                sent[operation.label] += 1
                try:
                    case.validate_response(response, checks=CHECKS, headers=headers)
                except FailureGroup as group:
                    for failure in group.exceptions:
                        key = (operation.label, failure.title, response.status_code)
                        failures[key] += 1
                        examples.setdefault(key, f"{case.as_curl_command(headers=dict(response.request.headers))}"
                                                 f"\n      -> {response.status_code} {response.text[:300]}"
                                                 f"\n      {str(failure)[:300]}")

            try:
                run()
            except Unsatisfiable:  # nothing to break in an operation without parameters, body or token
                assert mode is schemathesis.GenerationMode.NEGATIVE, operation.label
    return sent, failures, examples


@pytest.mark.parametrize("role", ["none", "alice", "admin", "spawner", "agent"])
def test_every_operation_answers_as_documented(hub, role):
    token = hub.agent_tokens["node-a"] if role == "agent" else hub.tokens[role]
    operations = NODE_OPERATIONS if role == "agent" else DOCUMENTED
    started = time.monotonic()
    sent, failures, examples = fuzz(hub, token, operations)
    report = "\n".join(f"  {count}x {op}: {title} ({status})\n      {examples[op, title, status]}"
                       for (op, title, status), count in sorted(failures.items()))
    print(f"\n{role}: {sum(sent.values())} requests over {len(sent)} operations in {time.monotonic() - started:.1f} s")
    assert set(sent) == operations, f"operations never exercised: {sorted(operations - set(sent))}"
    assert not failures, f"as {role}, {len(failures)} kind(s) of answer break the document:\n{report}"
