"""Where the service core runs: one writer thread and a few reader threads, never
the event loop.

A ledger write may wait for the database lock (another process, a backup, a
long debit); on the event loop that wait froze every request of every user.
So the core runs here:

- **the writer** (one thread): every core call that may write the database or
  change the core's in-memory state (the placement pool, reclaims, caches).
  One thread serializes them, so admission decisions never race, exactly as
  when they ran on the event loop. Each write gets a deadline when it is
  submitted (``ledger.db.busy_timeout`` later): queued behind others or waiting
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

Where a method runs is said once, at its definition: ``@writes`` or ``@reads``
on a unit's method. Its callers keep a plain method call that "go to
definition" follows from a handler or a job to the unit::

    class Accounts:
        @writes
        def grant(self, user: str, amount: Decimal, ...) -> tuple[Entry, bool]: ...

    # on the event loop (a handler, a job): the writer thread runs it
    entry, created = await manager.accounts.grant.off_loop(user, amount, ...)
    # on a thread already off the loop (the writer itself, a test): the body, at once
    entry, created = manager.accounts.grant(user, amount, ...)
    # on another thread that must still queue behind the writer (the debit job's)
    manager.debits.post.blocking(...)

The unit carries the service's ``CoreThreads`` as ``self.threads``.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from typing import Any, Concatenate, Generic, ParamSpec, Protocol, TypeVar, overload

from ...ledger import write_deadline

P = ParamSpec("P")
R = TypeVar("R")


class CoreThreads:
    """The writer thread and the reader pool. Only :func:`writes` and :func:`reads`
    hand work to them; nothing else in the service passes them a function."""

    def __init__(self, write_timeout: float, *, readers: int = 4, concurrent_reads: bool = True) -> None:
        self.write_timeout = write_timeout
        self.writer = ThreadPoolExecutor(1, thread_name_prefix="gpupool-writer")
        self.readers = (ThreadPoolExecutor(readers, thread_name_prefix="gpupool-reader") if concurrent_reads
                        else self.writer)
        self._writer_ident: int | None = None

    def _in_writer(self, deadline: float, call: Callable[[], R]) -> R:
        self._writer_ident = threading.get_ident()
        with write_deadline(deadline):
            return call()

    def deadline(self) -> float:
        """When a write submitted now must give up (``time.monotonic()``)."""
        return time.monotonic() + self.write_timeout

    async def write(self, call: Callable[[], R]) -> R:
        """Run ``call`` on the writer thread, by this task's deadline; the loop stays free."""
        future = self.writer.submit(self._in_writer, self._task_deadline(), call)
        return await asyncio.wrap_future(future)

    async def read(self, call: Callable[[], R]) -> R:
        """Run ``call``, which only reads the database, on a reader thread."""
        return await asyncio.wrap_future(self.readers.submit(call))

    def run_write(self, call: Callable[[], R]) -> R:
        """Blocking form of :meth:`write` for threads other than the event loop's
        (called on the writer thread itself, it runs ``call`` at once)."""
        if threading.get_ident() == self._writer_ident:
            return call()
        return self.writer.submit(self._in_writer, self.deadline(), call).result()

    def _task_deadline(self) -> float:
        shared = _shared_deadline.get()
        if shared is None:
            return self.deadline()
        if not shared:  # the first write of the request sets the deadline of all
            shared.append(self.deadline())
        return shared[0]

    def close(self) -> None:
        self.writer.shutdown(wait=False)
        if self.readers is not self.writer:
            self.readers.shutdown(wait=False)


#: the deadline that every write awaited in this task shares, once set (see share_write_deadline)
_shared_deadline: ContextVar[list[float] | None] = ContextVar("gpupool_shared_write_deadline", default=None)


def share_write_deadline() -> None:
    """From now on, the writes that this task awaits share one deadline, ``db_write_timeout``
    after the first of them. Called at the start of each request (every request runs in a
    task of its own): a grant that opens the account, then posts, answers 503 within one
    timeout, not two."""
    _shared_deadline.set([])


class RunsOffLoop(Protocol):
    """A core unit whose methods say where they run: it carries the service's threads
    (None when built alone, as some tests do: then ``blocking`` runs the body in place)."""

    @property
    def threads(self) -> CoreThreads | None: ...


U = TypeVar("U", bound=RunsOffLoop)


class CoreCall(Generic[P, R]):
    """A unit's method as its callers see it: called, it runs the body on the calling
    thread; ``off_loop`` awaits it on the thread its definition names."""

    __slots__ = ("unit", "body")

    def __init__(self, unit: RunsOffLoop, body: Callable[..., R]) -> None:
        self.unit = unit
        self.body = body

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.body(self.unit, *args, **kwargs)

    def _threads(self) -> CoreThreads:
        threads = self.unit.threads
        if threads is None:
            raise RuntimeError(f"{type(self.unit).__name__} was built without the service's CoreThreads: "
                               f"call {self.body.__name__}() directly")
        return threads

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {type(self.unit).__name__}.{self.body.__name__}>"


class WriteCall(CoreCall[P, R]):
    """A method that may write the database or change the core's memory: the writer runs it."""

    __slots__ = ()

    async def off_loop(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Await the body on the writer thread (by the request's shared deadline, if any)."""
        return await self._threads().write(functools.partial(self.body, self.unit, *args, **kwargs))

    def blocking(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """From a thread off the loop that must still queue behind the writer (the debit
        job's); on the writer thread, or with no threads at all, the body runs at once."""
        if self.unit.threads is None:
            return self.body(self.unit, *args, **kwargs)
        return self.unit.threads.run_write(functools.partial(self.body, self.unit, *args, **kwargs))


class ReadCall(CoreCall[P, R]):
    """A method that only reads the database: a reader thread runs it, never the write lock."""

    __slots__ = ()

    async def off_loop(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Await the body on a reader thread."""
        return await self._threads().read(functools.partial(self.body, self.unit, *args, **kwargs))


C = TypeVar("C", bound="CoreCall[..., Any]")


class _Placed(Generic[U, P, R, C]):
    """The descriptor that :func:`writes` and :func:`reads` put in the class. Its bound
    form is kept in the instance's ``__dict__``, so later lookups cost a plain attribute."""

    def __init__(self, body: Callable[Concatenate[U, P], R], bound: type[C]) -> None:
        self.body = body
        self.bound = bound
        self.name = body.__name__
        functools.update_wrapper(self, body)  # type: ignore[arg-type]

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    @overload
    def __get__(self, unit: None, owner: type | None = None) -> _Placed[U, P, R, C]: ...
    @overload
    def __get__(self, unit: U, owner: type | None = None) -> C: ...

    def __get__(self, unit: U | None, owner: type | None = None) -> Any:
        if unit is None:
            return self
        call = self.bound(unit, self.body)
        unit.__dict__[self.name] = call
        return call


def writes(body: Callable[Concatenate[U, P], R]) -> _Placed[U, P, R, WriteCall[P, R]]:
    """This method may write the database or change the core's memory: from the event loop,
    ``await unit.method.off_loop(...)`` runs it on the one writer thread."""
    return _Placed(body, WriteCall)


def reads(body: Callable[Concatenate[U, P], R]) -> _Placed[U, P, R, ReadCall[P, R]]:
    """This method only reads the database (and takes no write lock): from the event loop,
    ``await unit.method.off_loop(...)`` runs it on a reader thread."""
    return _Placed(body, ReadCall)
