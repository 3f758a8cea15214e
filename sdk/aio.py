"""asyncio helpers that never swallow a cancellation.

Python 3.11's ``asyncio.wait_for`` returns the inner result when the inner awaitable finishes in
the same loop turn as the outer task is cancelled, losing the cancellation: a background loop
``while True: await wait_for(event.wait(), t)`` woken and cancelled at once then never ends
(its ``cancel()``/``await`` at shutdown hangs). These helpers use ``asyncio.timeout``, which
delivers the cancellation into the awaiting coroutine itself.

Stopping tasks has the same trap: ``data_plane.tasks.cancel_all`` avoids it.
"""

from __future__ import annotations

import asyncio


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
