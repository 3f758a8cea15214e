"""data_plane/tasks.py: stopping tasks without losing a cancellation."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from data_plane.tasks import cancel_all


@pytest.mark.asyncio
async def test_cancel_all_ends_the_tasks_and_keeps_the_callers_own_cancellation() -> None:
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
        await cancel_all([task])
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
async def test_cancel_all_logs_a_task_that_failed_instead_of_raising(caplog: pytest.LogCaptureFixture) -> None:
    async def fails_on_stop() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            raise RuntimeError("broken cleanup") from None

    done = asyncio.create_task(asyncio.sleep(0))
    failing = asyncio.create_task(fails_on_stop(), name="the-failing-one")
    await asyncio.sleep(0)
    await cancel_all([done, failing])
    assert failing.done()
    assert isinstance(failing.exception(), RuntimeError)
    assert any("the-failing-one" in r.getMessage() for r in caplog.records)
    await cancel_all([])  # nothing to stop
