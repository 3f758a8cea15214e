"""Stopping background tasks without losing a cancellation (broker, SDK and the rest).

``task.cancel()`` then ``await task`` inside ``contextlib.suppress(CancelledError)`` swallows a
cancellation of the *awaiting* task too, when it arrives while it waits: both surface as the same
exception. A loop that stops a task that way — an SDK consumer's rebalance dropping a queue,
cancelled by ``shutdown`` at that moment — then goes on for ever, and whoever waits for it hangs.
``cancel_all`` waits with ``asyncio.wait``, which never raises the tasks' own cancellations.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable
from typing import Any

log = logging.getLogger(__name__)


async def cancel_all(tasks: Iterable[asyncio.Task[Any]]) -> None:
    """Cancel ``tasks`` and wait until each has ended. A cancellation of the caller while it
    waits propagates (the tasks are cancelled all the same); a task that ended with an error
    other than its cancellation is logged, not raised — this is for stopping things."""
    tasks = list(tasks)
    if not tasks:
        return
    for t in tasks:
        t.cancel()
    await asyncio.wait(tasks)
    for t in tasks:
        if not t.cancelled() and t.exception() is not None:
            log.error("task %s failed while stopping", t.get_name(), exc_info=t.exception())
