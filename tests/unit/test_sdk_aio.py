"""sdk/aio.py: waiting on an event with a timeout without ever losing a cancellation."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from sdk.aio import wait_event


@pytest.mark.asyncio
async def test_wait_event_reports_set_or_timeout() -> None:
    ev = asyncio.Event()
    assert not await wait_event(ev, 0.01)
    ev.set()
    assert await wait_event(ev, 0)


@pytest.mark.asyncio
async def test_a_loop_woken_and_cancelled_in_the_same_turn_still_ends() -> None:
    """The case asyncio.wait_for gets wrong on Python 3.11: the wake-up wins, the cancel is lost."""
    ev = asyncio.Event()
    rounds = 0

    async def loop() -> None:
        nonlocal rounds
        while True:
            await wait_event(ev, 30)
            ev.clear()
            rounds += 1

    task = asyncio.create_task(loop())
    await asyncio.sleep(0)
    ev.set()
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait_for(task, 2)
    assert task.cancelled()
