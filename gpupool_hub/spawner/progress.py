"""The spawn's own progress events, streamed to the spawn page while ``start`` runs.

``start`` adds events (asking the pool, where the GPUs are, why not) while the
hub may already be streaming ``progress()``; the stream waits on an event
instead of polling, and starts over when a new spawn begins.

JupyterHub's spawn page shows each event's message as its current line *and*
appends it to the event log as a row, so an event is added only when what it
says changes: a waiting spawn asks the pool every few seconds, and its place in
the queue ("You are 1st …") is said once, then again only when it moves.

An event may name its ``line`` (``"queue"``): the project's spawn page
(``gpupool_hub/hub_templates/spawn_pending.html``) then rewrites that row in place
while the previous row is the same line, so a new place or range is no new row;
the hub's home page reads the same stream for the waiting server's place. The
extra keys (``line``, ``gpupool_wait``) pass through JupyterHub's progress API
as they are; its stock page ignores them.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

__all__ = ["ProgressLog"]


class ProgressLog:
    """Events of the current spawn; :meth:`stream` yields them until :meth:`finish`."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self.done = False
        self._signal: asyncio.Event | None = None

    def reset(self) -> None:
        """A new spawn: forget the previous one's events."""
        self.events = []
        self.done = False
        self._wake()

    def add(self, progress: int, message: str, html_message: str | None = None, *,
            line: str | None = None, wait: dict[str, Any] | None = None) -> None:
        """Add an event, unless it says what the last one said (then the page already shows it).

        ``line`` names a row the page updates in place; ``wait`` is the queued spawn's place
        (``position``, ``queue_length``, ``eta_text``) for pages that show it apart."""
        last = self.events[-1] if self.events else {}
        if (last.get("message"), last.get("html_message")) == (message, html_message or None):
            return
        event: dict[str, Any] = {"progress": progress, "message": message}
        if html_message:
            event["html_message"] = html_message
        if line:
            event["line"] = line
        if wait is not None:
            event["gpupool_wait"] = wait
        self.events.append(event)
        self._wake()

    def finish(self) -> None:
        """The spawner's part of the spawn is over (allocated, refused or failed)."""
        self.done = True
        self._wake()

    def _wake(self) -> None:
        if self._signal is not None:
            self._signal.set()

    async def stream(self) -> AsyncIterator[dict[str, Any]]:
        """Every event of the current spawn, as it is added, until it is finished."""
        events: list[dict[str, Any]] | None = None
        sent = 0
        while True:
            if self._signal is None:
                self._signal = asyncio.Event()
            self._signal.clear()  # before looking, so an event added meanwhile wakes the wait below
            if self.events is not events:  # reset() by a new spawn: start over
                events, sent = self.events, 0
            while sent < len(events):
                yield events[sent]
                sent += 1
            if self.done:
                return
            # A plain wait, no asyncio.wait_for: on Python < 3.12 wait_for swallows a
            # cancellation that lands as the event is set, and the hub cancels this wait
            # (iterate_until) when the spawn ends; the progress request then hung, sending
            # keepalives for ever, whenever a refused spawn's stop reset the log just then.
            await self._signal.wait()
