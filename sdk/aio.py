"""asyncio helpers that never swallow a cancellation.

Python 3.11's ``asyncio.wait_for`` returns the inner result when the inner awaitable finishes in
the same loop turn as the outer task is cancelled, losing the cancellation: a background loop
``while True: await wait_for(event.wait(), t)`` woken and cancelled at once then never ends
(its ``cancel()``/``await`` at shutdown hangs). These helpers use ``asyncio.timeout``, which
delivers the cancellation into the awaiting coroutine itself.

The same holds for stopping a task: ``task.cancel()`` then ``await task`` inside
``contextlib.suppress(CancelledError)`` also swallows a cancellation of the *awaiting* task
when it arrives while it waits (both surface as the same exception). A rebalance loop dropping a
queue, cancelled at that moment by ``shutdown``, then went on forever. ``cancel_and_wait`` tells
the two apart.
"""

from __future__ import annotations

import asyncio
import logging

log = logging.getLogger(__name__)


async def wait_event(event: asyncio.Event, timeout_s: float) -> bool:
    """Wait until ``event`` is set or ``timeout_s`` passes; True when it is set."""
    if event.is_set():
        return True
    try:
        async with asyncio.timeout(max(timeout_s, 0)):
            await event.wait()
    except TimeoutError:
        return event.is_set()
    return True


async def cancel_and_wait(*tasks: asyncio.Task[object]) -> None:
    """Cancel ``tasks`` and wait until each has ended. A cancellation of the caller while it
    waits propagates (the tasks are cancelled all the same); a task that ended with an error
    other than its cancellation is logged, not raised — this is for stopping things."""
    if not tasks:
        return
    for t in tasks:
        t.cancel()
    await asyncio.wait(tasks)
    for t in tasks:
        if not t.cancelled() and t.exception() is not None:
            log.error("task %s failed while stopping", t.get_name(), exc_info=t.exception())
