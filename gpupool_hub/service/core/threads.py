"""Where the service core runs: one writer thread and a few reader threads, never
the event loop.

A ledger write may wait for the database lock (another process, a backup, a
long debit); on the event loop that wait froze every request of every user.
So the core runs here:

- **the writer** (one thread): every core call that may write the database or
  change the core's in-memory state (the placement pool, reclaims, caches).
  One thread serializes them, so admission decisions never race, exactly as
  when they ran on the event loop. Each write gets a deadline when it is
  submitted (``ledger.busy_timeout`` later): queued behind others or waiting
  for the lock, it raises :class:`~gpupool_hub.ledger.LedgerBusy` at the
  deadline instead of holding its caller indefinitely. A request that writes
  more than once (open the account, then grant) passes one deadline to all its
  writes (``write_until``), so it too answers within ``db_write_timeout``.
- **the readers** (a small pool): calls that only read the database. On SQLite
  they use the ledger's reader connections (WAL), so they never wait for a
  writer; an in-memory database has one connection, so there reads go to the
  writer thread too. A read here must never take the write lock: a reader
  thread waiting for it holds up every read queued behind it (``GET me``, a
  grant's user lookup), with no deadline at all.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from ...ledger import write_deadline

T = TypeVar("T")


class CoreThreads:
    """The writer thread and the reader pool; ``write``/``read`` for the event loop,
    ``run_write`` for other threads (the debit job's)."""

    def __init__(self, write_timeout: float, *, readers: int = 4, concurrent_reads: bool = True) -> None:
        self.write_timeout = write_timeout
        self.writer = ThreadPoolExecutor(1, thread_name_prefix="gpupool-writer")
        self.readers = (ThreadPoolExecutor(readers, thread_name_prefix="gpupool-reader") if concurrent_reads
                        else self.writer)
        self._writer_ident: int | None = None

    def _in_writer(self, deadline: float, fn: Callable[..., T], args: tuple[Any, ...],
                   kwargs: dict[str, Any]) -> T:
        self._writer_ident = threading.get_ident()
        with write_deadline(deadline):
            return fn(*args, **kwargs)

    def deadline(self) -> float:
        """When a write submitted now must give up (``time.monotonic()``)."""
        return time.monotonic() + self.write_timeout

    async def write(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn`` on the writer thread; the event loop stays free meanwhile."""
        return await self.write_until(self.deadline(), fn, *args, **kwargs)

    async def write_until(self, deadline: float, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """:meth:`write` with a deadline of the caller's (one for all the writes of a request)."""
        future = self.writer.submit(self._in_writer, deadline, fn, args, kwargs)
        return await asyncio.wrap_future(future)

    async def read(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Run ``fn``, which only reads the database, on a reader thread."""
        return await asyncio.wrap_future(self.readers.submit(fn, *args, **kwargs))

    def run_write(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """Blocking form of :meth:`write` for threads other than the event loop's
        (called on the writer thread itself, it runs ``fn`` at once)."""
        if threading.get_ident() == self._writer_ident:
            return fn(*args, **kwargs)
        return self.writer.submit(self._in_writer, self.deadline(), fn, args, kwargs).result()

    def close(self) -> None:
        self.writer.shutdown(wait=False)
        if self.readers is not self.writer:
            self.readers.shutdown(wait=False)
