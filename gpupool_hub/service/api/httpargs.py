"""What the API's handlers and the pages' handlers share about HTTP: checked
integer and name query arguments, and the ``Allow`` header of a 405.

One set of rules for both, so a value the API refuses with a clear 400 (an id
past 64 bits, ``1e3``, ``٣``, a user name with U+202E in it) cannot reach the
database through a page and come back as a 500, or as a name shown reversed.
"""

from __future__ import annotations

import re

from tornado import web

from .openapi import name_problem

#: query integers (ids, limits) are 64-bit signed, as the database stores them
INT64_MAX = 2**63 - 1
INTEGER = re.compile(r"[+-]?[0-9]+", re.ASCII)


class QueryArgs(web.RequestHandler):
    """A mixin for request handlers: ``int_arg`` and the ``Allow`` header."""

    #: pages: an empty value (``?before=``, an empty form field) means "not given";
    #: the API refuses it, as it refuses any other value that is not a number
    blank_is_missing = False

    def int_arg(self, name: str, default: int | None, *, minimum: int = 0, maximum: int = INT64_MAX) -> int | None:
        """The query argument ``name`` as an int in [minimum, maximum], ``default`` when absent, else 400."""
        raw = self.get_argument(name, None)
        if raw is None or (raw == "" and self.blank_is_missing):
            return default
        if not INTEGER.fullmatch(raw):
            raise web.HTTPError(400, f"{name} must be a whole number in plain digits, got {raw[:40]!r}")
        value = int(raw) if len(raw.lstrip("+-0")) <= 19 else None  # past 64 bits either way
        if value is None or not minimum <= value <= maximum:
            raise web.HTTPError(400, f"{name} must be between {minimum} and {maximum}, got {raw[:40]}")
        return value

    def name_arg(self, name: str, default: str | None = None, *, allow_empty: bool = True) -> str | None:
        """The query argument ``name`` as a user's, server's or node's name, ``default`` when
        absent, else 400 naming the argument and the rule (``schema.name_problem``)."""
        raw = self.get_argument(name, None)
        if raw is None or (raw == "" and self.blank_is_missing):
            return default
        problem = name_problem(raw, allow_empty=allow_empty)
        if problem:
            raise web.HTTPError(400, f"{name} {problem}")
        return raw

    def allowed_methods(self) -> list[str]:
        """The methods this handler implements (tornado's default for the others is a 405)."""
        return [m for m in self.SUPPORTED_METHODS
                if getattr(type(self), m.lower(), None) is not getattr(web.RequestHandler, m.lower(), None)]

    def set_allow_header(self, status_code: int) -> None:
        """A 405 says which methods would work (RFC 9110 requires ``Allow`` on it)."""
        if status_code == 405:
            self.set_header("Allow", ", ".join(self.allowed_methods()))
