"""The spawn page's progress stream ends when the hub stops reading it, however the spawn ended.

Found under load (``GPUPOOL_TEST_LOAD=2``, tests/spawner/test_hub.py's 30
concurrent spawns): a refused spawn's stop resets the progress log just as the
hub, seeing the spawn over, cancels the stream (JupyterHub's
``iterate_until``). On Python < 3.12 ``asyncio.wait_for`` swallowed that
cancellation, the stream went on waiting for a spawn that never came, and the
progress request stayed open for ever, sending keepalives: the user's spawn
page never said "failed". The test replays that moment (the refusal's last
events and the reset in one loop step, the hub's cancel a few steps later).
"""

from __future__ import annotations

import asyncio

import pytest

from gpupool_hub.spawner.progress import ProgressLog


async def stream_after_the_spawn_ended(steps: int) -> str:
    log = ProgressLog()
    log.add(10, "Asking the GPU pool")
    events = log.stream()
    assert (await events.__anext__())["progress"] == 10
    waiting = asyncio.ensure_future(events.__anext__())
    await asyncio.sleep(0.01)  # the stream now waits for the next event
    log.add(100, "Refused: no capacity")
    log.finish()  # the refused spawn's part is over ...
    log.reset()  # ... and its stop clears the spawner's state, before the stream ran again
    for _ in range(steps):
        await asyncio.sleep(0)
    waiting.cancel()  # the hub: the spawn is over, stop reading
    try:
        await asyncio.wait_for(asyncio.shield(waiting), 5)
    except asyncio.CancelledError:
        return "ended"
    except asyncio.TimeoutError:
        waiting.cancel()
        return "still waiting after 5 s"
    return "yielded an event"


@pytest.mark.parametrize("steps", range(5))
def test_the_stream_ends_when_the_hub_cancels_it_as_the_log_is_reset(steps):
    assert asyncio.run(stream_after_the_spawn_ended(steps)) == "ended"


def test_a_reset_wakes_the_stream_at_once_to_start_over():
    async def run() -> list[dict]:
        log = ProgressLog()
        log.add(10, "old spawn")
        seen: list[dict] = []

        async def read() -> None:
            async for event in log.stream():
                seen.append(event)

        reader = asyncio.ensure_future(read())
        await asyncio.sleep(0.01)
        log.reset()
        log.add(20, "new spawn")
        log.finish()
        await asyncio.wait_for(reader, 0.5)  # no one-second polling between
        return seen

    assert [e["message"] for e in asyncio.run(run())] == ["old spawn", "new spawn"]


def test_a_message_said_again_adds_no_row():
    # Issue 39.2: the spawn page shows every event as a row of its event log; a waiting spawn
    # asks every ~2 s and was told the same place each time: 30 identical rows a minute
    log = ProgressLog()
    log.add(10, "Asking the GPU pool")
    for _ in range(30):
        log.add(20, "Waiting for a GPU: You are 1st in the queue")
    log.add(20, "Waiting for a GPU: You are 1st in the queue", "<strong>Waiting.</strong> 1st")  # its html changed
    log.add(20, "Waiting for a GPU: You are 1st in the queue", "<strong>Waiting.</strong> 1st")
    log.add(40, "GPUs allocated: node-a")
    log.add(20, "Asking the GPU pool")  # said before, but not just now: a new row
    assert [(e["progress"], e["message"], e.get("html_message")) for e in log.events] == [
        (10, "Asking the GPU pool", None),
        (20, "Waiting for a GPU: You are 1st in the queue", None),
        (20, "Waiting for a GPU: You are 1st in the queue", "<strong>Waiting.</strong> 1st"),
        (40, "GPUs allocated: node-a", None),
        (20, "Asking the GPU pool", None),
    ]


def test_a_queued_spawn_says_its_place_as_one_line_with_the_place_apart():
    # Issue 39.2: the place and range change as others start and leave; each change is an event of
    # the line "queued", which the project's spawn page rewrites in place (no new row), and it
    # carries the place apart (gpupool_wait) for the hub's home page. Once the GPUs come, no place.
    from gpupool_hub.spawner.errors import GPUPoolRefused
    from tests.spawner.test_units import make

    s = make()
    profile = s.gpupool_profiles[1]
    places = [(2, "about 20–45 min"), (2, "about 20–45 min"), (1, "about 10–30 min")]
    seen_while_waiting = []

    async def allocate(profile, gpus):
        seen_while_waiting.append(s.waits.place)
        if places:
            position, text = places.pop(0)
            raise GPUPoolRefused(f"You are {position} in the queue, {text}.", reason="queued", status_code=503,
                                 details={"position": position, "queue_length": 2, "eta_text": text},
                                 retry_at="2000-01-01T00:00:00Z")
        return {"id": "a1", "node": "n", "gpus": []}

    s.gpupool_allocate = allocate
    assert asyncio.run(s.waits.run(profile, 1, 600, s.reclaim_wait))["id"] == "a1"
    events = s._gpupool_progress.events
    assert [(e["line"], e["gpupool_wait"]["position"], e["gpupool_wait"]["eta_text"]) for e in events] == [
        ("queued", 2, "about 20–45 min"), ("queued", 1, "about 10–30 min")]
    assert events[-1]["gpupool_wait"]["message"] == "You are 1 in the queue, about 10–30 min."
    assert seen_while_waiting[-1]["position"] == 1 and s.waits.place is None  # started: no place any more
