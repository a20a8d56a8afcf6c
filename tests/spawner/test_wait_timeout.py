"""Issue 39.1: a queued spawn waits as long as the pool's ``max_wait`` allows, whatever the
hub's default ``start_timeout``: the spawner raises its own, before the hub reads it
(JupyterHub reads ``spawner.start_timeout`` as it schedules ``start()``, in ``User.spawn``)."""

from __future__ import annotations

import asyncio
import logging

import pytest
from traitlets.config import Config

from gpupool_hub.spawner import wait_rules
from tests.spawner.test_units import make


def spawner(**pool):
    """A spawner built from a hub configuration with these ``c.GPUPool`` settings and nothing
    else: JupyterHub's own default start_timeout (60 s)."""
    return make(pool=pool)


@pytest.mark.parametrize(
    "pool, expected",
    [
        ({}, 3600 + 60),  # as shipped: the queue on, max_wait 3600 s, the hub's default 60 s to start
        ({"max_wait": 600}, 600 + 60),
        ({"queue_enabled": False}, 60),  # no queue: nothing to wait for, the hub's own timeout
        ({"queue_enabled": False, "teams": {"a": {"quota": 1}}, "preempt_grace": 30}, 30 + 60),  # a reclaim
        ({"max_wait": 20, "teams": {"a": {"quota": 1}}, "preempt_grace": 300}, 300 + 60),  # the longer wait
    ],
)
def test_the_start_timeout_covers_the_pools_longest_wait_plus_the_start(pool, expected):
    assert spawner(**pool).start_timeout == expected


def test_an_admins_start_timeout_is_the_servers_own_start_on_top_of_the_wait():
    c = Config()
    c.GPUPool.max_wait = 100
    log = logging.getLogger("test")
    assert wait_rules.start_timeout_for_waits(c, 500, log) == 600
    c.GPUPool.queue_enabled = False
    c.GPUPool.teams = {"a": {"quota": 1}}
    assert wait_rules.start_timeout_for_waits(c, 500, log) == 500  # covers preempt_grace (30 s) already


def test_the_raise_is_logged_once_per_process_not_per_server(caplog, monkeypatch):
    monkeypatch.setattr(wait_rules, "_RAISES_LOGGED", set())
    c = Config()
    c.GPUPool.max_wait = 1234
    log = logging.getLogger("gpupool-test")
    with caplog.at_level(logging.INFO, logger="gpupool-test"):
        for _ in range(3):  # three users' spawners
            assert wait_rules.start_timeout_for_waits(c, 60, log) == 1294
    raised = [r.getMessage() for r in caplog.records if "Raising" in r.getMessage()]
    assert raised == ["Raising the spawner's start_timeout from 60 s to 1294 s to cover c.GPUPool.max_wait (1234 s) "
                      "in the wait queue plus the server's own start; no c.Spawner.start_timeout needs setting for it"]



async def test_once_the_gpus_are_held_the_server_gets_only_its_own_start_timeout(monkeypatch):
    """A server stuck starting (a Slurm job left pending, a pod never scheduled) is given up
    after the configured start_timeout, not the hour a queued spawn may wait, and its GPUs go back."""
    from gpupool_hub.engines.local.spawner import GPUPoolSimpleSpawner
    from gpupool_hub.spawner.base import GPUPoolSpawner

    engine = GPUPoolSimpleSpawner.__mro__[GPUPoolSimpleSpawner.__mro__.index(GPUPoolSpawner) + 1]
    seen = []

    async def hangs(self):  # the engine notes the timeout it was given, as batchspawner reads it
        seen.append(self.start_timeout)
        await asyncio.Event().wait()

    monkeypatch.setattr(engine, "start", hangs)
    s = make(pool={"max_wait": 600}, start_timeout=1)
    assert s.start_timeout == 601  # what the hub reads as it schedules start()
    abandoned = []

    async def prepare():  # the pool's answer is in: GPUs held
        s.gpupool_allocation = {"id": "a1"}

    async def abandon(reason, wait=None):
        abandoned.append(reason)

    s.gpupool_prepare, s.gpupool_abandon = prepare, abandon
    with pytest.raises(TimeoutError, match="did not start within 1 s of getting its GPUs"):
        await s.start()
    assert seen == [1]  # the engine waited for its own start only
    assert abandoned  # the GPUs it got go back, never charged
    assert s.start_timeout == 601  # the next spawn may wait again


def test_the_final_refusal_after_the_longest_wait_says_how_long_in_minutes_and_the_place():
    from gpupool_hub.reasons import RefusalReason
    from gpupool_hub.spawner.errors import GPUPoolRefused

    last = GPUPoolRefused("You are 3rd in the queue", reason=RefusalReason.QUEUED.value, details={"position": 3})
    final = wait_rules.gave_up_waiting(last, 3598.7)
    assert final.message.startswith("No GPU became free in the 60 minutes you waited, the longest this pool "
                                    "lets a start wait (you were number 3 in line).")
    assert "keep your place" in final.message and final.details == {"position": 3}
    assert " 90 seconds you waited" in wait_rules.gave_up_waiting(last, 90).message
