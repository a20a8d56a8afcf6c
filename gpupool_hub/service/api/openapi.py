"""Request bodies: read as clean JSON text, then checked against ``openapi.json``.

Every string in a body (and every key) is text a log line, a CSV cell or the
database will hold, so control characters and lone surrogates are refused here,
once, before any handler sees the body; so is a key given twice in one object
(``{"user": "carol", "user": "admin"}``), which JSON parsers read differently
(Python keeps the last, others the first), so that what a proxy or log saw is
not what the service acted on. Its shape is stated once, in ``openapi.json``,
and checked by :func:`check_body` (``format: date-time`` too, by
:func:`is_date_time` on both validators); handlers keep only the rules a schema
cannot say (a known user, the largest grant, the node's own GPUs). Names in
paths and query arguments are checked by :func:`name_problem`, the same rule as
the ``NameCharacters`` pattern of bodies (``gpupool_hub/identity/names.py``).
"""

from __future__ import annotations

import json
import re
import sys
from datetime import datetime
from functools import cache
from importlib import resources
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tornado import web

from ... import strictjson
from ...identity.names import name_problem as _name_rule
from ...strictjson import NonFiniteNumber

if TYPE_CHECKING:
    from jsonschema.exceptions import ValidationError

#: JSON bodies are flat objects with a list or an object inside; deeper nesting is refused
MAX_JSON_DEPTH = 8

#: what no text from a request may contain: control characters (C0, DEL, C1) and lone surrogates
UNSAFE_CHARACTER = re.compile(r"[\x00-\x1f\x7f-\x9f\ud800-\udfff]")


def text_problem(value: str, *, max_length: int, allow_empty: bool = False) -> str | None:
    """What is wrong with a piece of text from a request, or None: lone surrogates
    (unstorable), control characters (log and CSV injection), absurd lengths."""
    if not value and not allow_empty:
        return "must not be empty"
    if len(value) > max_length:
        return f"must be at most {max_length} characters"
    bad = UNSAFE_CHARACTER.search(value)
    if bad is None:
        return None
    if 0xD800 <= ord(bad.group()) <= 0xDFFF:
        return "contains a lone surrogate (not valid Unicode text)"
    return f"contains the control character U+{ord(bad.group()):04X}"


def name_problem(value: str, *, allow_empty: bool = False) -> str | None:
    """What is wrong with a name (user, server, team, node) from a path or a query argument,
    or None: the rules of all text (:func:`text_problem`, at most 255 characters) and the
    name rule (``gpupool_hub/identity/names.py``: no bidirectional or zero-width controls)."""
    return text_problem(value, max_length=255, allow_empty=allow_empty) or _name_rule(value)


class DuplicateKey(Exception):
    """A JSON object names one key twice (not a ValueError: ``parse_json`` says so itself)."""

    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``' ``object_pairs_hook``: each object as a dict, or DuplicateKey."""
    out = dict(pairs)
    if len(out) != len(pairs):
        seen: set[str] = set()
        for key, _value in pairs:
            if key in seen:
                raise DuplicateKey(key)
            seen.add(key)
    return out


def parse_json(raw: bytes) -> Any:
    """A request body as JSON, or 400: not UTF-8, not JSON (``NaN`` and ``Infinity`` included, which
    Python reads and every schema bound lets through), a key twice in one object
    (nested ones too), nested deeper than ``MAX_JSON_DEPTH``, or a string (or key) that
    is not clean text."""
    try:
        body = strictjson.loads(raw.decode("utf-8"), object_pairs_hook=_unique_keys)
    except NonFiniteNumber as e:
        raise web.HTTPError(400, f"request body holds a number JSON does not have: {e}") from None
    except DuplicateKey as e:
        raise web.HTTPError(400, f"request body has a duplicate key {e.key[:100]!r}: each key may appear "
                                 "only once in an object") from None
    except UnicodeDecodeError:
        raise web.HTTPError(400, "request body is not UTF-8") from None
    except RecursionError:
        raise web.HTTPError(400, f"request body is nested more than {MAX_JSON_DEPTH} levels deep") from None
    except ValueError as e:
        raise web.HTTPError(400, f"request body is not valid JSON: {e}") from None
    stack: list[tuple[Any, int]] = [(body, 0)]
    while stack:
        value, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise web.HTTPError(400, f"request body is nested more than {MAX_JSON_DEPTH} levels deep")
        if isinstance(value, dict):
            for key, item in value.items():
                stack.append((key, depth + 1))
                stack.append((item, depth + 1))
        elif isinstance(value, list):
            stack.extend((item, depth + 1) for item in value)
        elif isinstance(value, str):
            problem = text_problem(value, max_length=100_000, allow_empty=True)
            if problem:
                raise web.HTTPError(400, f"a string in the request body {problem}")
    return body


#: the API's own description: the one statement of what each request body looks like
SPEC: dict[str, Any] = json.loads(resources.files("gpupool_hub.service").joinpath("openapi.json").read_text())
#: the pattern of every name in a body (users, servers, groups, nodes, GPU models)
NAME_PATTERN: str = SPEC["components"]["schemas"]["NameCharacters"]["pattern"]

#: RFC 3339's date-time (section 5.6), which JSON Schema's ``format: date-time`` names
_DATE_TIME = re.compile(r"[0-9]{4}-[0-9]{2}-[0-9]{2}[Tt][0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,9})?"
                        r"([Zz]|[+-][0-9]{2}:[0-9]{2})")


def parse_date_time(value: str) -> datetime:
    """An RFC 3339 date-time (``2026-11-24T10:01:00Z``) as an aware datetime, or ValueError."""
    if not _DATE_TIME.fullmatch(value):
        raise ValueError(f"{value[:40]!r} is not an RFC 3339 date-time such as 2026-11-24T10:01:00Z")
    return datetime.fromisoformat(value.upper())  # ValueError for a 13th month, a 61st second, …


def is_date_time(value: Any) -> bool:
    """``format: date-time``, one definition for both validators: jsonschema's own check needs
    an optional package (rfc3339-validator) and passes anything without it, and
    fastjsonschema's regex takes what that one refuses (``+0100``, a 61st second), so
    the two would disagree about a deadline."""
    if not isinstance(value, str):
        return True
    try:
        parse_date_time(value)
    except ValueError:
        return False
    return True


@cache
def _validator_class() -> Any:
    """The JSON Schema validator, with JSON integers as whole numbers as sent (``1.0`` and
    ``true`` are no GPU index, count or byte size).

    jsonschema loads its optional format checkers at import; with rfc3987-syntax
    installed (Jupyter's packages install it) that one builds a grammar for
    about 2.5 s of CPU, in which a loaded machine's first body check timed out
    (8.5 s seen at load 8). Bodies are checked without format checking, so that
    module is kept out of this process (0.2 s instead), unless something loaded
    it already. Still imported here, not at the top, and :func:`warm_up` builds
    the validators on a thread once the service listens."""
    if "jsonschema" not in sys.modules:
        sys.modules.setdefault("rfc3987_syntax", None)  # type: ignore[assignment]  # an ImportError for jsonschema
    from jsonschema import Draft202012Validator, validators

    strict = Draft202012Validator.TYPE_CHECKER.redefine(
        "integer", lambda _checker, value: isinstance(value, int) and not isinstance(value, bool))
    return validators.extend(Draft202012Validator, type_checker=strict)


@cache
def _format_checker() -> Any:
    """The formats request bodies are held to: ``date-time`` alone, by :func:`is_date_time`
    (a validator without a format checker takes any string as a date-time)."""
    from jsonschema import FormatChecker

    checker = FormatChecker(formats=())
    checker.checks("date-time")(is_date_time)
    return checker


@cache
def _validator(path: str, method: str) -> Any:
    """The validator of ``method path``'s request body (``method`` in lower case), built
    once; KeyError if it takes none."""
    body = SPEC["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]
    return _validator_class()({**body, "components": SPEC["components"]}, format_checker=_format_checker())


def warm_up() -> int:
    """Build every body's validator ahead of the first request that needs one (on a
    thread of its own at start-up: see ``_validator_class``); how many there are."""
    built = 0
    for path, operations in SPEC["paths"].items():
        for method, operation in operations.items():
            if isinstance(operation, dict) and "requestBody" in operation:
                _validator(path, method)
                _fast_check(path, method)
                built += 1
    return built


def _pointer(parts: list[Any]) -> str:
    return "/" + "/".join(str(p).replace("~", "~0").replace("/", "~1") for p in parts)


_JSON_TYPES = ((bool, "boolean"), (int, "integer"), (float, "number"), (str, "string"), (list, "array"),
               (dict, "object"), (type(None), "null"))


def _json_type(value: Any) -> str:
    return next(name for kind, name in _JSON_TYPES if isinstance(value, kind))


def _described(error: ValidationError) -> str:
    """The description of the field at fault, for a value of the right type in the wrong form."""
    while error is not None:
        if isinstance(error.schema, dict) and error.schema.get("description"):
            return f" ({error.schema['description']})"
        error = error.parent  # type: ignore[assignment]
    return ""


def _problem(error: ValidationError) -> tuple[str, str]:
    """The JSON pointer of the field at fault and what is wrong with it, for a person to fix."""
    parts = list(error.absolute_path)
    if error.validator == "required" and isinstance(error.instance, dict):
        missing = [name for name in error.validator_value if name not in error.instance]
        return _pointer(parts + missing[:1]), "is required"
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        known = sorted(error.schema.get("properties", {}))
        extra = sorted(name for name in error.instance if name not in known)
        return _pointer(parts + extra[:1]), (f"is not allowed: unknown key(s) {', '.join(map(repr, extra[:5]))}"
                                             + (f"; expected {', '.join(known)}" if known else ""))
    if error.validator in ("anyOf", "oneOf") and error.context:
        fitting = [e for e in error.context if e.validator != "type"]
        if not fitting:  # no branch takes a value of this type
            kinds = [k for e in error.context for k in ([e.validator_value] if isinstance(e.validator_value, str)
                                                        else e.validator_value)]
            return _pointer(parts), f"must be {' or '.join(kinds)}, not {_json_type(error.instance)}"
        return _problem(fitting[0])
    if error.validator == "type":
        kinds = [error.validator_value] if isinstance(error.validator_value, str) else error.validator_value
        return _pointer(parts), f"must be {' or '.join(kinds)}, not {_json_type(error.instance)}"
    if error.validator == "pattern" and error.validator_value == NAME_PATTERN and isinstance(error.instance, str):
        return _pointer(parts), _name_rule(error.instance) or "is not a name"
    if error.validator == "pattern":
        return _pointer(parts), f"is not in the expected form{_described(error)}"
    if error.validator == "format" and error.validator_value == "date-time":
        return _pointer(parts), (f"must be an RFC 3339 date-time such as 2026-11-24T10:01:00Z, "
                                 f"not {error.instance!r:.60}")
    why = error.message
    return _pointer(parts), why if len(why) <= 300 else why[:300] + "…"


@cache
def _fast_check(path: str, method: str) -> Callable[[Any], Any]:
    """``method path``'s body schema compiled to Python by fastjsonschema: about 40 times
    faster than jsonschema on a spawn's body (7 µs against 300 µs), which every ``POST
    /allocations`` pays. It only ever says "valid" for a body that jsonschema takes too
    (see :func:`check_body`); jsonschema keeps the last word and writes the messages."""
    import fastjsonschema

    body = SPEC["paths"][path][method]["requestBody"]["content"]["application/json"]["schema"]
    # draft 7 has every keyword openapi.json uses; date-time checked as by jsonschema, no defaults filled in
    return fastjsonschema.compile({**body, "components": SPEC["components"]}, use_default=False, use_formats=True,
                                  formats={"date-time": is_date_time}, detailed_exceptions=False)


def _has_float(value: Any) -> bool:
    """Whether a JSON value holds a float anywhere: fastjsonschema takes ``1.0`` as an integer."""
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, float):
            return True
        if isinstance(item, dict):
            stack.extend(item.values())
        elif isinstance(item, list):
            stack.extend(item)
    return False


def check_body(body: Any, path: str, method: str) -> None:
    """Check a request body against ``openapi.json``'s schema for ``method path``, or 400.

    The answer names the field at fault by its JSON pointer (``/request/gpus``)
    and says why; nothing is read from a body that fails, so nothing is written.
    """
    import fastjsonschema

    method = method.lower()
    try:
        _fast_check(path, method)(body)
    except fastjsonschema.JsonSchemaException:
        pass  # jsonschema decides, and says why
    else:
        if not _has_float(body):  # the one rule on which the compiled check is laxer
            return
    from jsonschema.exceptions import best_match  # loaded with the validator (see _validator_class)

    error = best_match(_validator(path, method).iter_errors(body))
    if error is not None:
        where, why = _problem(error)
        raise web.HTTPError(400, f"request body field {where} {why}" if where != "/" else f"request body {why}")
