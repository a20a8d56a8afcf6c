"""The service's scheduled jobs, each a small class with explicit dependencies.

The Application only builds them and hands them to :class:`JobRunner`, which
runs each every N seconds, times it, counts failures and survives them (the
job runs again next time). Inside a job, one bad user or decision is logged
and skipped, never the whole run (jupyterhub-idle-culler's habit).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from tornado.ioloop import IOLoop

from ..core.jobs_lease import JobsLease
from ..common.metrics import ServiceMetrics

log = logging.getLogger("gpupool.jobs")

Job = Callable[[], Awaitable[Any]]


class JobRunner:
    """Runs jobs periodically on the event loop. Slow work that is not the core's (a
    debit job's usage queries) goes to one job thread; the core's own calls go to
    its writer and reader threads (``@writes``, ``@reads`` in ``core/threads.py``)."""

    def __init__(self, metrics: ServiceMetrics | None, lease: JobsLease | None = None) -> None:
        self.metrics = metrics
        self.lease = lease
        self.executor = ThreadPoolExecutor(1, thread_name_prefix="gpupool-job")
        self.tasks: list[asyncio.Task[None]] = []

    async def in_thread(self, fn: Callable[..., Any], *args: Any) -> Any:
        return await IOLoop.current().run_in_executor(self.executor, fn, *args)

    async def run_once(self, name: str, job: Job) -> None:
        started = time.perf_counter()
        try:
            await job()
        except Exception:
            if self.metrics is not None:
                self.metrics.job_failures.labels(name).inc()
            log.exception("Job %s failed; it will run again", name)
        finally:
            if self.metrics is not None:
                self.metrics.job_duration.labels(name).observe(time.perf_counter() - started)

    async def _every(self, seconds: float, name: str, job: Job, leased: bool) -> None:
        while True:
            if not leased or self.lease is None or self.lease.held:
                await self.run_once(name, job)
            await asyncio.sleep(seconds)

    def every(self, seconds: float, name: str, job: Job, *, leased: bool = True) -> None:
        """Run ``job`` every ``seconds``; a ``leased`` job only while this service holds
        the jobs lease (``service/core/jobs_lease.py``), so two services never both run it."""
        self.tasks.append(asyncio.get_event_loop().create_task(self._every(seconds, name, job, leased)))

    def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        self.tasks.clear()
        self.executor.shutdown(wait=False)
