"""A refusal by the pool is the pool working: the hub logs it as one INFO line, not an ERROR.

JupyterHub logs every failed spawn at ERROR ("Not starting alice's server: …",
"Error starting server …"), the spawn form's failure with a full traceback,
and the request that carried it at ERROR when its status is 5xx (the pool's
"no capacity" is a 503). A user without enough tokens or a full pool is
neither a bug nor an outage, and admins who alert on ERROR lines were paged
for it. JupyterHub has no hook for how it logs a spawn failure, so the
spawner adds one :class:`logging.Filter` to the hub's logger and to tornado's
application and access loggers (where JupyterHub makes those records) which rewrites exactly
the records about a normal refusal: INFO (WARNING for the access line), one
line, no traceback. Real failures (service unreachable, a bad token, a
misconfigured profile, any other exception) are left as they are.
"""

from __future__ import annotations

import logging
import re
import sys
import threading
import time
from collections import OrderedDict
from typing import Any

from tornado import log as tornado_log
from tornado import web

from .errors import GPUPoolRefused, SpawnFailure

__all__ = ["RefusalLogFilter", "install_refusal_log_filter", "is_normal_refusal", "refusal_filter"]

_SPAWNER_FAILURES = frozenset(f.value for f in SpawnFailure)
_ACCESS_LINE = re.compile(r"^(\d{3}) (\S+) (\S+)")
_MARK = "gpupool_normal_refusal"  # set by errors.invalid_options: the user's mistake, not a failure


def is_normal_refusal(exc: BaseException | None) -> bool:
    """Whether ``exc`` says no for an ordinary reason: the pool refused, or the options were invalid.

    The spawner's own failures (:class:`SpawnFailure`: unreachable, auth, bad
    request, config) are real failures; so is everything else.
    """
    if exc is None:
        return False
    if isinstance(exc, GPUPoolRefused):
        return str(exc.reason) not in _SPAWNER_FAILURES
    return isinstance(exc, web.HTTPError) and bool(getattr(exc, _MARK, False))


class RefusalLogFilter(logging.Filter):
    """Rewrites the hub's ERROR records about a normal refusal into one INFO (or WARNING) line.

    A record is about a normal refusal when it carries one (``exc_info``), is
    logged while one is being handled (``sys.exc_info()``), repeats the message
    of one the spawner just noted (JupyterHub's "Error starting server …: <message>"
    is logged outside the ``except``), or is the access-log line of the request
    the spawner noted (consumed once, so a later real failure of the same URL
    stays an ERROR). Notes expire after ``ttl`` seconds.
    """

    def __init__(self, ttl: float = 60.0, size: int = 512) -> None:
        super().__init__()
        self.ttl = ttl
        self.size = size
        self._messages: OrderedDict[str, float] = OrderedDict()
        self._requests: OrderedDict[str, float] = OrderedDict()
        self._lock = threading.Lock()

    # ------------------------------------------------------------ notes

    def note(self, exc: BaseException, request: Any = None) -> None:
        """The spawner refused a spawn with ``exc`` for the hub ``request`` (may be None)."""
        now = time.monotonic()
        with self._lock:
            self._put(self._messages, str(exc), now)
            method, path = getattr(request, "method", None), getattr(request, "path", None)
            if method and path:
                self._put(self._requests, f"{method} {path}", now)

    def _put(self, table: OrderedDict[str, float], key: str, now: float) -> None:
        table[key] = now
        table.move_to_end(key)
        while len(table) > self.size:
            table.popitem(last=False)

    def _fresh(self, table: OrderedDict[str, float], now: float) -> None:
        while table and next(iter(table.values())) < now - self.ttl:
            table.popitem(last=False)

    def _noted_message(self, text: str) -> bool:
        now = time.monotonic()
        with self._lock:
            self._fresh(self._messages, now)
            return any(message and message in text for message in self._messages)

    def _noted_request(self, text: str) -> bool:
        match = _ACCESS_LINE.match(text)
        if not match:
            return False
        path = match.group(3).split("?", 1)[0]
        key = f"{match.group(2)} {path}"
        now = time.monotonic()
        with self._lock:
            self._fresh(self._requests, now)
            return self._requests.pop(key, None) is not None

    # ----------------------------------------------------------- filter

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.ERROR:
            return True
        exc = record.exc_info[1] if record.exc_info else None
        if exc is None:
            exc = sys.exc_info()[1]
        text = record.getMessage()
        if is_normal_refusal(exc) or self._noted_message(text):
            if exc is not None and record.exc_info and str(exc) not in text:
                text = f"{text}: {exc}"
            self._rewrite(record, logging.INFO, text)
        elif self._noted_request(text):
            self._rewrite(record, logging.WARNING, text)
        return True

    @staticmethod
    def _rewrite(record: logging.LogRecord, level: int, text: str) -> None:
        record.levelno = level
        record.levelname = logging.getLevelName(level)
        record.msg, record.args = text, None
        record.exc_info, record.exc_text, record.stack_info = None, None, None


refusal_filter = RefusalLogFilter()


def install_refusal_log_filter(logger: logging.Logger | logging.LoggerAdapter | None) -> None:  # type: ignore[type-arg]
    """Add :data:`refusal_filter` to the hub's logger and to tornado's access and application
    loggers (once each): JupyterHub's ``User.spawn`` logs through tornado's ``app_log``, and a
    logger's filters apply only to records made on that logger, not to those propagated to it."""
    loggers = [tornado_log.access_log, tornado_log.app_log]
    if isinstance(logger, logging.LoggerAdapter):
        logger = logger.logger  # type: ignore[assignment]
    if isinstance(logger, logging.Logger):
        loggers.append(logger)
    for target in loggers:
        if refusal_filter not in target.filters:
            target.addFilter(refusal_filter)
