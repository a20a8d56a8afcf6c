"""Request bodies: read as clean JSON text.

Every string in a body (and every key) is text a log line, a CSV cell or the
database will hold, so control characters and lone surrogates are refused here,
once, before any handler sees the body.
"""

from __future__ import annotations

import json
import re
from typing import Any

from tornado import web

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


def parse_json(raw: bytes) -> Any:
    """A request body as JSON, or 400: not UTF-8, not JSON, nested deeper than
    ``MAX_JSON_DEPTH``, or a string (or key) that is not clean text."""
    try:
        body = json.loads(raw.decode("utf-8"))
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
