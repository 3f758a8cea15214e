"""sdk/aio.py: waiting on an event with a timeout without ever losing a cancellation."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from sdk.aio import cancel_and_wait, wait_event


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


@pytest.mark.asyncio
async def test_cancel_and_wait_ends_the_tasks_and_keeps_the_callers_own_cancellation() -> None:
    """Stopping a task that takes a moment to end, while the stopper itself is cancelled: the
    stopper ends cancelled (``suppress(CancelledError)`` around ``await task`` loses that, and a
    loop around it goes on for ever) and the task still ends."""
    ended = asyncio.Event()

    async def slow_to_stop() -> None:
        try:
            await asyncio.sleep(30)
        finally:
            await asyncio.sleep(0.05)  # cleanup that takes a moment
            ended.set()

    async def stopper(task: asyncio.Task[None]) -> None:
        await cancel_and_wait(task)
        await asyncio.sleep(30)  # where the lost cancellation would leave it

    inner = asyncio.create_task(slow_to_stop())
    await asyncio.sleep(0)
    outer = asyncio.create_task(stopper(inner))
    await asyncio.sleep(0.01)  # outer waits for inner's cleanup
    outer.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await asyncio.wait_for(outer, 2)
    assert outer.cancelled()
    await asyncio.wait_for(ended.wait(), 2)
    assert inner.cancelled()


@pytest.mark.asyncio
async def test_cancel_and_wait_logs_a_task_that_failed_instead_of_raising(caplog: pytest.LogCaptureFixture) -> None:
    async def fails_on_stop() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            raise RuntimeError("broken cleanup") from None

    done = asyncio.create_task(asyncio.sleep(0))
    failing = asyncio.create_task(fails_on_stop(), name="the-failing-one")
    await asyncio.sleep(0)
    await cancel_and_wait(done, failing)
    assert failing.done()
    assert isinstance(failing.exception(), RuntimeError)
    assert any("the-failing-one" in r.getMessage() for r in caplog.records)
    await cancel_and_wait()  # nothing to stop
