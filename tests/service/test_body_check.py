"""The fast body check never lets through a body that openapi.json forbids.

``check_body`` asks a compiled check (fastjsonschema) first and jsonschema only
when that one objects or the body holds a float. These tests take each endpoint's
good body (from ``test_api_bodies``) and every way of spoiling one field of it
(each value of another JSON type, a whole float, the field left out, an unknown
field beside it) and require the same verdict as jsonschema's alone: a spawn body
that jsonschema refuses must still get its 400, and one it takes must pass.
"""

from __future__ import annotations

from typing import Any

import fastjsonschema
import pytest
from tornado import web

from gpupool_hub.service.api import openapi

from .test_api_bodies import CASES, _set

#: the other values a field can be given: every JSON type, the boundary ones included
SPOILERS: list[Any] = [True, False, 0, -1, 1, 1.0, 0.5, "", "x", "0", None, [], [1], {}, {"a": 1}, 10**30,
                       # past the maxima of bytes and pids, a name's invisible control, a date-time that is none
                       2**50 + 1, 2**22, "a\u202eb", "2026-13-45T10:00:00Z", "2026-11-24T10:00:00"]

ENDPOINTS = {"POST users/alice/grant": "/users/{name}/grant", "POST allocations": "/allocations",
             "PATCH allocations/{id}": "/allocations/{id}", "PUT nodes/n1/inventory": "/nodes/{node}/inventory",
             "PUT nodes/n1/utilization": "/nodes/{node}/utilization", "PUT nodes/n1/memory": "/nodes/{node}/memory",
             "PUT nodes/n1/boundary": "/nodes/{node}/boundary"}


def pointers(value: Any, at: str = "") -> list[str]:
    """The JSON pointer of every field inside ``value`` (not ``value`` itself)."""
    out = []
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, item in items:
        here = f"{at}/{key}"
        out.append(here)
        out.extend(pointers(item, here))
    return out


def spoiled(good: dict[str, Any]) -> list[dict[str, Any]]:
    bodies = []
    for pointer in pointers(good):
        bodies.extend(_set(good, pointer, value) for value in [*SPOILERS, ...])
    for pointer in ["", *pointers(good)]:  # an unknown field beside the known ones of each object
        if isinstance(_at(good, pointer), dict):
            bodies.append(_set(good, f"{pointer}/unknown_field", 1))
    return bodies


def _at(value: Any, pointer: str) -> Any:
    for part in filter(None, pointer.split("/")):
        value = value[int(part)] if isinstance(value, list) else value[part]
    return value


def verdict(body: Any, path: str, method: str) -> bool:
    try:
        openapi.check_body(body, path, method)
    except web.HTTPError as e:
        assert e.status_code == 400
        return False
    return True


@pytest.mark.parametrize("method, path, good", [(c[0], c[1], c[3]) for c in CASES],
                         ids=[f"{c[0]} {c[1]}" for c in CASES])
def test_every_spoiled_body_gets_the_verdict_of_jsonschema(method, path, good):
    if path == "allocations/{id}":
        good = {"gpu_indices": [0]}
    spec_path = ENDPOINTS[f"{method} {path}"]
    full = openapi._validator(spec_path, method.lower())
    bodies = [good, *spoiled(good)]
    refused = 0
    for body in bodies:
        expected = full.is_valid(body)
        assert verdict(body, spec_path, method) == expected, (body, expected)
        refused += not expected
    assert verdict(good, spec_path, method), "the good body must pass"
    assert refused > len(bodies) // 3, "most spoiled bodies must be refused, or the table tests nothing"


def test_a_whole_float_where_a_count_belongs_is_refused():
    body = {"user": "alice", "server": "", "request": {"gpus": 1.0}}
    with pytest.raises(web.HTTPError) as e:
        openapi.check_body(body, "/allocations", "POST")
    assert "/request/gpus must be integer" in e.value.log_message


@pytest.mark.parametrize("deadline", ["yesterday", "2026-13-45T10:00:00Z", "2026-11-24T10:00:00"])
def test_the_fast_check_alone_holds_deadlines_to_date_time(deadline):
    """Not only jsonschema's second look: the compiled check refuses a deadline that is no
    date-time itself (jsonschema without a format checker, or fastjsonschema's own, would not)."""
    body = {"warnings": [{"user": "bob", "gpu_uuid": "GPU-0", "gpu_index": 0, "deadline": deadline, "pids": [1]}]}
    with pytest.raises(fastjsonschema.JsonSchemaException, match="date-time"):
        openapi._fast_check("/nodes/{node}/boundary", "put")(body)
    assert not openapi._validator("/nodes/{node}/boundary", "put").is_valid(body)
    body["warnings"][0]["deadline"] = "2026-11-24T10:00:00.5+01:00"
    openapi._fast_check("/nodes/{node}/boundary", "put")(body)


def test_the_check_fills_in_nothing():
    body = {"user": "alice", "request": {"gpus": 1}}
    openapi.check_body(body, "/allocations", "POST")
    assert body == {"user": "alice", "request": {"gpus": 1}}
